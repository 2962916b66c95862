/**
 * The client covers the schema it was generated from: one method per operationId
 * (`record_message` -> `recordMessage`), and none for an operation that is gone. A route
 * added to the service, once `make ts-client` regenerates openapi.json, fails here until
 * the client has its method.
 */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import { MemoryClient } from "../src/index.js";

const PACKAGE = join(import.meta.dirname, "..", "..");

const camel = (id: string) => id.replace(/_([a-z0-9])/g, (_, c: string) => c.toUpperCase());

test("one method per operation of the schema", () => {
  const schema = JSON.parse(readFileSync(join(PACKAGE, "openapi.json"), "utf8")) as {
    paths: Record<string, Record<string, { operationId?: string }>>;
  };
  const operations = Object.values(schema.paths).flatMap((methods) => Object.values(methods).map((op) => op.operationId));
  assert.ok(operations.length > 20);
  assert.ok(operations.every((id) => typeof id === "string" && /^[a-z][a-z0-9_]*$/.test(id)), "readable operationIds");
  const expected = operations.map((id) => camel(id!)).sort();
  const methods = Object.getOwnPropertyNames(MemoryClient.prototype)
    .filter((name) => name !== "constructor" && name !== "unwrap").sort();
  assert.deepEqual(methods, expected);
});
