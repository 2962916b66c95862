/**
 * The client against the real service (test/server.ts): the session loop (record, form,
 * context, search), the memory tools, errors raised as their classes with nothing stored,
 * and keys: every call goes over HTTP on loopback to the Python server.
 */

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { promisify } from "node:util";
import { after, before, describe, test } from "node:test";

import {
  AuthenticationError, ConflictError, InvalidRequest, MemoryApiError, MemoryClient, NotFoundError, PermissionDenied,
  RateLimitError,
} from "../src/index.js";
import { startServer, type RunningServer } from "./server.js";

const AGENT = "ts-agent";
const USER = "alice";
const SESSION = "ts-session-1";

let server: RunningServer;
let operator: MemoryClient;
let client: MemoryClient; // the agent's own write key, as an application would hold

before(async () => {
  // Webhooks to loopback allowed: this machine resolves no public name (a webhook test below).
  server = await startServer({ MEMORY_WRITE_AGENTS: JSON.stringify([AGENT]), WEBHOOK_ALLOW_PRIVATE: "true" });
  operator = new MemoryClient(server.baseUrl, { apiKey: server.operatorKey });
  const made = await operator.createKey({ name: "ts-tests", role: "write", agents: [AGENT] });
  assert.match(made.key, /^msk_/);
  client = new MemoryClient(server.baseUrl, { apiKey: made.key });
  await operator.putAgent(AGENT, {}); // an agent's settings are the operator's
});

after(async () => {
  await server?.stop();
});

describe("the session loop", () => {
  const said = [
    "Hi! I'm planning a trip to Lisbon with my friend Bob in early June.",
    "I prefer window seats on flights, and please always keep the total budget under 2000 euros.",
    "The flight from Berlin leaves on June 3rd at 9am and we land in Lisbon at 11:40.",
  ];

  test("record, form, context and search", async () => {
    const recorded = [];
    for (const [i, content] of said.entries()) {
      recorded.push(await client.recordMessage(SESSION, { agent_id: AGENT, user_id: USER, role: "user", content }));
      await client.recordMessage(SESSION, {
        agent_id: AGENT, user_id: USER, role: "assistant", content: `Noted (${i}).`, message_id: `reply-${i}`,
      });
    }
    assert.deepEqual(recorded.map((r) => r.sequence), [1, 3, 5]);
    assert.ok(recorded.every((r) => /^[0-9a-f]{32}$/.test(r.message_id)), "the client makes a message id");
    // The same message id again is the same message: recorded once.
    const again = await client.recordMessage(SESSION, {
      agent_id: AGENT, user_id: USER, role: "assistant", content: "Noted (0).", message_id: "reply-0",
    });
    assert.equal(again.sequence, 2);

    const formed = await client.formMemories(SESSION, { wait: true });
    const counts = Object.values(formed.memories ?? {}).reduce((a, b) => a + b, 0);
    assert.ok(counts > 0, `formation stored memories: ${JSON.stringify(formed)}`);
    const session = await client.getSession(SESSION);
    assert.equal(session.pending_job, null);

    const context = await client.getContext({
      agent_id: AGENT, user_id: USER, session_id: SESSION, query: "when does the flight leave?",
    });
    assert.match(context.xml, /^<\w/);
    assert.match(context.xml, /9am/);
    assert.ok(context.chars <= context.budget);
    // The session's latest messages the host sends the model itself are not shown again.
    const windowed = await client.getContext({
      agent_id: AGENT, user_id: USER, session_id: SESSION, query: "when does the flight leave?", host_window: 2,
    });
    assert.equal(windowed.recall?.host_window, 2);

    const found = await client.searchMemories({ agent_id: AGENT, query: "flight Berlin", scope: "user", user_id: USER, top_k: 3 });
    assert.ok(found.results.length > 0);
    assert.match(found.results[0]!.content, /Berlin/);
    assert.ok(Object.keys(found.results[0]!.explanation.signals).length > 0, "each result is explained");

    const posted = await client.searchMemoriesWithBody(AGENT, { query: "flight Berlin", scope: "user", user_id: USER, top_k: 3 });
    assert.deepEqual(posted.results.map((h) => h.id), found.results.map((h) => h.id));
  });

  test("the agent's LLM usage and budget", async () => {
    await operator.putAgent(AGENT, { llm_budget: { tokens_per_day: 5000, when_spent: "wait" } });
    try {
      const usage = await operator.agentUsage(AGENT);
      assert.equal(usage.budget.tokens_per_day, 5000);
      assert.equal(usage.day.limit, 5000);
      assert.equal(usage.day.formations, 0); // the rule extractor spends no tokens
      await assert.rejects(operator.putAgent(AGENT, { llm_budget: { tokens_per_day: 0 } }), InvalidRequest);
    } finally {
      await operator.putAgent(AGENT, {});
    }
  });

  test("a read key may search but not record", async () => {
    const made = await operator.createKey({ name: "ts-read", role: "read", agents: [AGENT] });
    const reader = new MemoryClient(server.baseUrl, { apiKey: made.key });
    await reader.searchMemories({ agent_id: AGENT, query: "flight" });
    await assert.rejects(
      reader.recordMessage(SESSION, { agent_id: AGENT, user_id: USER, role: "user", content: "not stored" }),
      PermissionDenied,
    );
  });

  test("the server's own 429 raises RateLimitError with its Retry-After once retries are spent", async () => {
    const made = await operator.createKey({ name: "ts-slow", role: "read", agents: [AGENT], requests_per_minute: 1 });
    const slow = new MemoryClient(server.baseUrl, { apiKey: made.key, maxRetries: 0 });
    await slow.getAgent(AGENT);
    await assert.rejects(slow.getAgent(AGENT), (error: unknown) => {
      assert.ok(error instanceof RateLimitError, String(error));
      assert.equal(error.status, 429);
      assert.ok(error.retryAfter !== undefined && error.retryAfter > 0 && error.retryAfter <= 60, String(error.retryAfter));
      return true;
    });
  });

  test("a wrong key is refused", async () => {
    const stranger = new MemoryClient(server.baseUrl, { apiKey: "msk_not-a-key" });
    await assert.rejects(stranger.getAgent(AGENT), (error: unknown) => {
      assert.ok(error instanceof AuthenticationError);
      assert.equal(error.status, 401);
      assert.equal(error.method, "GET");
      assert.equal(error.path, `/v1/agents/${AGENT}`);
      return true;
    });
  });
});

describe("the memory tools", () => {
  const namespace = `agent:${AGENT}`;

  test("write, get, update, delete, undelete", async () => {
    const written = await client.memoryWrite(AGENT, {
      content: "The office moves to Lyon in June.", namespace, kind: "fact", title: "Office move",
      tags: ["office", "plans"], confidence: 0.8,
    });
    assert.deepEqual(written.tags, ["office", "plans"]);
    assert.equal(written.deleted_at, null);

    const got = await client.memoryGet(AGENT, written.id);
    assert.equal(got.content, "The office moves to Lyon in June.");
    assert.ok((got.access_count ?? 0) >= 1);

    const updated = await client.memoryUpdate(AGENT, written.id, { title: "Office move (confirmed)", confidence: 0.95 });
    assert.equal(updated.title, "Office move (confirmed)");
    assert.equal(updated.content, got.content);
    const cleared = await client.memoryUpdate(AGENT, written.id, { title: null }); // null clears, the rest stays
    assert.equal(cleared.title, null);
    assert.equal(cleared.confidence, 0.95);

    const found = await client.searchMemoriesWithBody(AGENT, { query: "office Lyon", tags: ["office"] });
    assert.deepEqual(found.results.map((h) => h.id), [written.id]);

    const deleted = await client.memoryDelete(AGENT, written.id);
    assert.equal(deleted.id, written.id);
    assert.deepEqual(await client.memoryDelete(AGENT, written.id), deleted, "a second delete answers the same dates");
    const ids = async () => (await client.searchMemoriesWithBody(AGENT, { query: "office Lyon" })).results.map((h) => h.id);
    assert.ok(!(await ids()).includes(written.id), "a deleted memory is not found");
    await assert.rejects(client.memoryUpdate(AGENT, written.id, { title: "too late" }), ConflictError);

    const restored = await client.memoryUndelete(AGENT, written.id);
    assert.equal(restored.deleted_at, null);
    assert.equal((await ids())[0], written.id, "an undeleted memory is found again");
  });

  test("forget a message with what was formed from it, undo it; re-form windows (docs/forget.md, docs/reform.md)", async () => {
    const session = "ts-forget";
    for (const [i, content] of ["I am planning a trip to Lisbon.", "My grandmother's maiden name is Quillfeather."].entries()) {
      await client.recordMessage(session, { agent_id: AGENT, user_id: "ada", role: "user", content, message_id: `${session}-${i}` });
    }
    await client.formMemories(session);
    const message = (await client.listMemories(AGENT, { session_id: session, kind: ["message"] })).memories
      .find((m) => m.content.includes("Quillfeather"));
    assert.ok(message);
    const report = await client.memoryForget(AGENT, message.id);
    assert.equal(report.mode, "soft");
    assert.ok(report.undoable && (report.reformed ?? []).length === 1 && report.memory_ids.includes(message.id));
    const found = await client.searchMemoriesWithBody(AGENT, { query: "Quillfeather grandmother" });
    assert.ok(!found.results.some((h) => h.content.includes("Quillfeather")), "nothing formed from it is found");
    assert.equal((await client.memoryUndelete(AGENT, message.id)).deleted_at, null);
    await assert.rejects(client.memoryForget(AGENT, "no-such-memory"), NotFoundError);
    await assert.rejects(client.memoryForget(AGENT, message.id, { mode: "hard" }), PermissionDenied); // admin's
    const hard = await operator.memoryForget(AGENT, message.id, { mode: "hard" });
    assert.equal(hard.undoable, false);

    await assert.rejects(client.reformWindows(AGENT, { dry_run: true }), PermissionDenied); // admin's
    const dry = await operator.reformWindows(AGENT, { session_id: session, dry_run: true });
    assert.equal(dry.windows, 1);
    assert.equal(dry.reformed, 0);
    const done = await operator.reformWindows(AGENT, { session_id: session, run_id: "ts-run" });
    assert.ok(done.done && done.reformed === 1);
  });

  test("correct, then undo the correction", async () => {
    const wrong = await client.memoryWrite(AGENT, { content: "The office moves to Lille in June.", namespace, kind: "fact" });
    const done = await client.memoryCorrect(AGENT, wrong.id, { content: "The office moves to Lyon in March." });
    assert.equal(done.corrected.id, wrong.id);
    assert.equal(done.corrected.corrected_by, done.correction.id);
    assert.equal(done.correction.corrects, wrong.id);
    assert.equal(done.correction.content, "The office moves to Lyon in March.");
    const ids = async () => (await client.searchMemoriesWithBody(AGENT, { query: "office moves" })).results.map((h) => h.id);
    assert.ok(!(await ids()).includes(wrong.id), "a corrected memory is not found");
    await assert.rejects(client.memoryCorrect(AGENT, wrong.id, { content: "Again" }), ConflictError);
    const undone = await client.memoryUncorrect(AGENT, wrong.id);
    assert.equal(undone.memory.corrected_by, null);
    assert.ok(undone.correction?.deleted_at, "the correction is deleted");
    assert.ok((await ids()).includes(wrong.id), "found again once the correction is undone");
  });

  test("an idempotency key writes one memory", async () => {
    const memory = { content: "Standup moves to 9:30.", namespace, kind: "fact" as const, idempotency_key: "standup-1" };
    const first = await client.memoryWrite(AGENT, memory);
    const second = await client.memoryWrite(AGENT, memory);
    assert.equal(second.id, first.id);
  });

  test("write blocks: observations, entities and facts", async () => {
    const items = [
      { kind: "entity", name: "Alice", type: "person" },
      { kind: "edge", source: "Alice", target: "Porto", rel_type: "lives_in" },
      { kind: "observation", name: "Porto", text: "Porto has a lovely riverside" },
    ];
    const text = `<memory_write>${JSON.stringify(items)}</memory_write>`;
    const out = await client.parseWrites(AGENT, { text, namespace: `user:${AGENT}:${USER}` });
    assert.equal(out.blocks, 1);
    assert.equal(out.written.length, 1);
    assert.match(out.written[0]!.content, /riverside/);
    assert.ok((out.facts ?? []).some((f) => f.current), "the edge became a current fact");
    const again = await client.parseWrites(AGENT, { text, namespace: `user:${AGENT}:${USER}` });
    assert.ok((again.already_stored ?? []).includes(out.written[0]!.id), "repeatable: nothing new");

    const entities = await client.listEntities(AGENT, { user_id: USER, name: "Alice" });
    const alice = entities.entities.find((e) => e.name.toLowerCase() === "alice");
    assert.ok(alice, JSON.stringify(entities));
    const detail = await client.getEntity(AGENT, alice.id);
    assert.ok(detail.facts.some((f) => /Porto/.test(f.text)), JSON.stringify(detail.facts));
  });

  test("bad input raises InvalidRequest and stores nothing", async () => {
    const audited = async () => (await operator.readAudit({ agent_id: AGENT, limit: 500 })).entries.length;
    const entriesBefore = await audited();
    await assert.rejects(client.memoryWrite(AGENT, { content: "", namespace, kind: "fact" }), InvalidRequest);
    await assert.rejects(
      // A kind the schema does not know: the type checker refuses it too, hence the cast.
      client.memoryWrite(AGENT, { content: "Gossip about the canteen.", namespace, kind: "gossip" as "fact" }),
      (error: unknown) => error instanceof InvalidRequest && error.status === 422 && /kind/.test(error.detail),
    );
    await assert.rejects(client.memoryGet(AGENT, "no-such-memory"), NotFoundError);
    assert.equal(await audited(), entriesBefore, "no change was audited");
    const hits = (await client.searchMemoriesWithBody(AGENT, { query: "gossip canteen" })).results;
    assert.ok(!hits.some((h) => /canteen/.test(h.content)), JSON.stringify(hits));
  });

  test("every error is a MemoryApiError with the service's sentence", async () => {
    await assert.rejects(client.memoryGet(AGENT, "missing"), (error: unknown) => {
      assert.ok(error instanceof MemoryApiError);
      assert.equal(error.name, "NotFoundError");
      assert.ok(error.detail.length > 0);
      return true;
    });
  });
});

describe("secrets kept out (docs/redaction.md)", () => {
  const key = "sk-proj-Q7xWm2Lp9RtY4vBn8KcZ3dHf6JsA1gUe";

  test("a message's and a memory's secrets are redacted, and the answer says which kinds", async () => {
    const recorded = await client.recordMessage("ts-secrets", {
      agent_id: AGENT, user_id: USER, role: "user", content: `my key is ${key} and my password is hunter2`,
    });
    assert.deepEqual(recorded.redacted, { api_key: 1, password: 1 });
    const written = await client.memoryWrite(AGENT, {
      content: `the deploy key is ${key}`, namespace: `agent:${AGENT}`, kind: "fact",
    });
    assert.equal(written.content, "the deploy key is [redacted:api_key]");
    assert.deepEqual(written.redacted, { api_key: 1 });
  });

  test("an agent whose policy refuses: InvalidRequest naming the kind, never the value", async () => {
    const other = "ts-refusing";
    await operator.putAgent(other, { redaction: { mode: "refuse", kinds: ["api_key"] } });
    await assert.rejects(
      operator.recordMessage("ts-secrets-2", { agent_id: other, user_id: USER, role: "user", content: `key ${key}` }),
      (error: unknown) => error instanceof InvalidRequest && error.status === 422 && /holds 1 api_key/.test(error.detail)
        && !error.detail.includes(key),
    );
    assert.equal((await operator.getAgent(other)).redaction?.mode, "refuse");
  });
});

describe("change events and webhooks (docs/events.md)", () => {
  test("a write is an event of the stream; a webhook is put, read, listed and deleted", async () => {
    const written = await client.memoryWrite(AGENT, {
      content: "The heron nests by the lock.", namespace: `agent:${AGENT}`, kind: "fact",
    });
    const stream = await operator.eventStream(AGENT, { after: "0-0", timeout: 1 });
    const events = stream.split("\n").filter((line) => line.startsWith("data:")).map((line) => JSON.parse(line.slice(5)));
    assert.ok(events.some((e) => e.type === "written" && e.memory_ids.includes(written.id)), stream);
    const hook = await operator.putWebhook(AGENT, "crm", {
      url: "http://127.0.0.1:9/memory", secret: "a-secret-of-sixteen-or-more", // nothing listens: never delivered
    });
    assert.equal(hook.url, "http://127.0.0.1:9/memory");
    assert.ok(!JSON.stringify(hook).includes("a-secret-of-sixteen"), "the secret is never answered back");
    assert.equal((await operator.getWebhook(AGENT, "crm")).id, "crm");
    assert.deepEqual((await operator.listWebhooks(AGENT)).map((h) => h.id), ["crm"]);
    assert.deepEqual((await operator.webhookDeadLetters(AGENT, "crm")).dead_letters, []);
    await assert.rejects(operator.replayDeadLetter(AGENT, "crm", "1-0"), NotFoundError);
    await assert.rejects(operator.dropDeadLetter(AGENT, "crm", "1-0"), NotFoundError);
    await assert.rejects(operator.putWebhook(AGENT, "bad", { url: "ftp://x.example", secret: "a-secret-of-sixteen-or-more" }),
      InvalidRequest);
    await operator.deleteWebhook(AGENT, "crm");
    assert.deepEqual(await operator.listWebhooks(AGENT), []);
    await assert.rejects(client.listWebhooks(AGENT), PermissionDenied); // a write key: webhooks are the admin's
  });
});

describe("operations", () => {
  test("health, liveness and metrics", async () => {
    assert.deepEqual(await client.checkHealth(), { ok: true });
    assert.equal((await client.checkLiveness()).ok, true);
    const detailed = (await operator.checkHealth({ detail: true })) as Record<string, unknown>;
    assert.ok(Object.keys(detailed).length > 1, JSON.stringify(detailed));
    await assert.rejects(client.checkHealth({ detail: true }), PermissionDenied);
    assert.match(await operator.getMetrics(), /# TYPE memory_service_/);
  });
});

describe("the documentation", () => {
  const PACKAGE = join(import.meta.dirname, "..", "..");
  const example = readFileSync(join(PACKAGE, "examples", "quickstart.mjs"), "utf8");

  test("the quickstart runs against the server", async () => {
    // It imports the package by its name: Node resolves that to this package's dist/ (built by `npm run build`).
    const { stdout } = await promisify(execFile)(process.execPath, [join(PACKAGE, "examples", "quickstart.mjs")], {
      env: { ...process.env, MEMORY_SERVICE_URL: server.baseUrl, MEMORY_SERVICE_API_KEY: server.operatorKey },
    });
    assert.match(stdout, /formed: \{.*\d/);
    assert.match(stdout, /memory block, \d+ of \d+ chars:\n</);
    assert.match(stdout, /9am/);
  });

  test("the package's README and the docs' TypeScript page show the quickstart as it is", () => {
    for (const page of [join(PACKAGE, "README.md"), join(PACKAGE, "..", "..", "docs", "typescript.md")]) {
      assert.ok(readFileSync(page, "utf8").includes(example), `${page} shows examples/quickstart.mjs`);
    }
  });
});
