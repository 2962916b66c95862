/**
 * The retry rules (src/retry.ts) against a real HTTP server: a small Node server in this
 * process that answers what each test scripts (503 or 429 with a Retry-After, then 200) and
 * keeps every request it got, so that a test counts the attempts, their bodies and the waits.
 */

import assert from "node:assert/strict";
import { createServer, type IncomingMessage, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, beforeEach, describe, test } from "node:test";

import { MemoryClient, RateLimitError, ServerError, ServiceUnavailable, retryAfter, retryDelay } from "../src/index.js";

interface Answer { status: number; headers?: Record<string, string>; body?: string }
interface Received { method: string; url: string; body: string; at: number; authorization?: string }

let server: Server;
let baseUrl: string;
let script: Answer[] = []; // the answers still to give, in order; then 200 with OK_BODY
let received: Received[] = [];
const OK_BODY = JSON.stringify({ ok: true });

async function readBody(request: IncomingMessage): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of request) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString();
}

before(async () => {
  server = createServer(async (request, response) => {
    received.push({ method: request.method ?? "", url: request.url ?? "", body: await readBody(request), at: Date.now(),
    authorization: request.headers.authorization });
    const answer = script.shift() ?? { status: 200, body: OK_BODY };
    if (answer.status === 0) return; // never answers: the client's timeout must end the call
    const headers = { "Content-Type": "application/json", ...answer.headers };
    response.writeHead(answer.status, headers).end(answer.body ?? JSON.stringify({ detail: `scripted ${answer.status}` }));
  });
  await new Promise<void>((done) => server.listen(0, "127.0.0.1", done));
  baseUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

after(async () => {
  server.closeAllConnections();
  await new Promise((done) => server.close(done));
});

beforeEach(() => {
  script = [];
  received = [];
});

const message = { agent_id: "a", user_id: "u", role: "user" as const, content: "hello" };
const unavailable = (retryAfterSeconds?: string): Answer =>
  ({ status: 503, headers: retryAfterSeconds === undefined ? {} : { "Retry-After": retryAfterSeconds } });

describe("503 and 429 are retried as Retry-After says", () => {
  test("a 503 then a 503 then 200: three attempts, the same body each time, waiting what was asked", async () => {
    script = [unavailable("1"), unavailable("0")];
    const client = new MemoryClient(baseUrl);
    const started = Date.now();
    const answer = await client.recordMessage("s1", message);
    assert.deepEqual(answer, { ok: true });
    assert.equal(received.length, 3);
    assert.equal(new Set(received.map((r) => r.body)).size, 1, "the body (and its message id) is sent whole each time");
    assert.match(JSON.parse(received[0]!.body).message_id, /^[0-9a-f]{32}$/);
    const firstWait = received[1]!.at - received[0]!.at;
    assert.ok(firstWait >= 950, `waited ${firstWait} ms for Retry-After: 1`);
    assert.ok(Date.now() - started < 4_000);
  });

  test("an HTTP-date Retry-After is a time to wait until", () => {
    const at = Date.parse("Wed, 21 Oct 2026 07:28:10 GMT");
    const response = new Response(null, { status: 503, headers: { "Retry-After": "Wed, 21 Oct 2026 07:28:10 GMT" } });
    assert.equal(retryAfter(response, at - 7_000), 7);
    assert.equal(retryAfter(response, at + 60_000), 0, "a date gone by: no wait");
    assert.equal(retryAfter(new Response(null, { headers: { "Retry-After": "soon" } })), undefined);
    assert.equal(retryAfter(new Response(null)), undefined);
  });

  test("without a Retry-After the wait doubles from 0.5 s; never more than the cap", async () => {
    const none = new Response(null, { status: 503 });
    assert.deepEqual([0, 1, 2, 3].map((attempt) => retryDelay(none, attempt, 30)), [0.5, 1, 2, 4]);
    assert.equal(retryDelay(none, 10, 30), 30);
    const asked = new Response(null, { status: 429, headers: { "Retry-After": "3600" } });
    assert.equal(retryDelay(asked, 0, 30), 30);

    script = [unavailable()];
    await new MemoryClient(baseUrl).getAgent("a");
    const waited = received[1]!.at - received[0]!.at;
    assert.ok(waited >= 450 && waited < 2_000, `waited ${waited} ms without a Retry-After`);
  });

  test("maxRetryWait caps what Retry-After asks", async () => {
    script = [{ status: 429, headers: { "Retry-After": "3600" } }];
    const started = Date.now();
    await new MemoryClient(baseUrl, { maxRetryWait: 0.1 }).getAgent("a");
    assert.equal(received.length, 2);
    assert.ok(Date.now() - started < 2_000);
  });

  test("retries spent: the last answer raises, with its Retry-After", async () => {
    script = [unavailable("0"), unavailable("0"), unavailable("7")];
    await assert.rejects(new MemoryClient(baseUrl, { maxRetries: 2 }).getAgent("a"), (error: unknown) => {
      assert.ok(error instanceof ServiceUnavailable && error instanceof ServerError);
      assert.equal(error.retryAfter, 7);
      assert.equal(error.detail, "scripted 503");
      return true;
    });
    assert.equal(received.length, 3, "one call and two retries");
  });

  test("maxRetries 0: never sent again", async () => {
    script = [{ status: 429, headers: { "Retry-After": "0" } }];
    await assert.rejects(new MemoryClient(baseUrl, { maxRetries: 0 }).getAgent("a"), RateLimitError);
    assert.equal(received.length, 1);
  });

  test("other errors are not retried", async () => {
    script = [{ status: 500 }, { status: 502, headers: { "Content-Type": "text/html" }, body: "<h1>Bad gateway</h1>" }];
    await assert.rejects(new MemoryClient(baseUrl).getAgent("a"), (error: unknown) =>
      error instanceof ServerError && !(error instanceof ServiceUnavailable) && error.status === 500);
    await assert.rejects(new MemoryClient(baseUrl).getAgent("a"), (error: unknown) =>
      error instanceof ServerError && error.detail === "<h1>Bad gateway</h1>", "a proxy's page is the detail");
    assert.equal(received.length, 2);
  });
});

describe("a 503 is retried only where the call is safe to repeat", () => {
  const client = () => new MemoryClient(baseUrl);

  test("creating a key: a 429 is retried (refused before it ran), a 503 is not", async () => {
    script = [{ status: 429, headers: { "Retry-After": "0" } }];
    await client().createKey({ name: "k", role: "read" });
    assert.equal(received.length, 2);

    received = [];
    script = [unavailable("5")];
    await assert.rejects(client().createKey({ name: "k", role: "read" }), (error: unknown) =>
      error instanceof ServiceUnavailable && error.retryAfter === 5);
    assert.equal(received.length, 1, "it might have been made: not sent again");
  });

  test("writing a memory: retried after a 503 only with an idempotency key", async () => {
    const memory = { content: "c", namespace: "agent:a", kind: "fact" as const };
    script = [unavailable("0")];
    await assert.rejects(client().memoryWrite("a", memory), ServiceUnavailable);
    assert.equal(received.length, 1);

    received = [];
    script = [unavailable("0")];
    await client().memoryWrite("a", { ...memory, idempotency_key: "k1" });
    assert.equal(received.length, 2);
    assert.equal(JSON.parse(received[1]!.body).idempotency_key, "k1");
  });

  test("a startup block: retried in mode always, not in first-run or digest", async () => {
    script = [unavailable("0")];
    await client().getStartupBlock("a", { mode: "always" });
    assert.equal(received.length, 2);

    for (const mode of ["first-run", "digest"] as const) {
      received = [];
      script = [unavailable("0")];
      await assert.rejects(client().getStartupBlock("a", { mode, session_id: "s" }), ServiceUnavailable);
      assert.equal(received.length, 1, mode);
      assert.match(received[0]!.url, new RegExp(`mode=${mode}`));
    }
  });

  test("updating and deleting a memory, forming and searching are retried", async () => {
    const ok: Answer = { status: 200, body: OK_BODY };
    script = [unavailable("0"), ok, unavailable("0"), ok, unavailable("0"), ok, unavailable("0"), ok];
    await client().memoryUpdate("a", "m", { title: "t" });
    await client().memoryDelete("a", "m");
    await client().formMemories("s");
    await client().searchMemoriesWithBody("a", { query: "q" });
    assert.deepEqual(received.map((r) => r.method), ["PATCH", "PATCH", "DELETE", "DELETE", "POST", "POST", "POST", "POST"]);
  });

  test("the raw api client retries by the same rules", async () => {
    script = [unavailable("0")];
    const { data, response } = await client().api.GET("/v1/agents/{agent_id}", { params: { path: { agent_id: "a" } } });
    assert.equal(response.status, 200);
    assert.deepEqual(data, { ok: true });
    assert.equal(received.length, 2);

    received = [];
    script = [unavailable("0")];
    const made = await client().api.POST("/v1/keys", { body: { name: "k", role: "read" } });
    assert.equal(made.response.status, 503);
    assert.equal(received.length, 1);
  });
});

test("an attempt that takes longer than the timeout is aborted", async () => {
  script = [{ status: 0 }];
  const started = Date.now();
  await assert.rejects(new MemoryClient(baseUrl, { timeout: 0.3, maxRetries: 0 }).getAgent("a"), /TimeoutError|aborted/);
  assert.ok(Date.now() - started < 3_000);
});

test("the key goes in the Authorization header; ids are escaped in the path", async () => {
  await new MemoryClient(`${baseUrl}/`, { apiKey: "msk_secret" }).memoryGet("a/b", "m?x");
  assert.equal(received[0]!.url, "/v1/agents/a%2Fb/memories/m%3Fx");
  assert.equal(received[0]!.authorization, "Bearer msk_secret");
});
