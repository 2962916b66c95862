/**
 * The Vercel AI SDK integration (src/ai-sdk.ts) with the SDK's own mock model
 * (MockLanguageModelV3 of `ai/test`) against the real service (test/server.ts): the memory
 * block reaches the system prompt, the exchange is recorded once (generate and stream, a
 * repeated call too), the memory tools run through generateText's tool loop and on their
 * own, and failures (the service down, a refusal, bad input) are what the options say.
 */

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { promisify } from "node:util";
import { after, before, describe, test } from "node:test";

import { generateText, stepCountIs, streamText, wrapLanguageModel, type ModelMessage } from "ai";
import { convertArrayToReadableStream, MockLanguageModelV3 } from "ai/test";
import type { z } from "zod";

import { memoryMiddleware, memoryTools, type MemorySession } from "../src/ai-sdk.js";
import { MemoryClient, NotFoundError, PermissionDenied } from "../src/index.js";
import { startServer, type RunningServer } from "./server.js";

const AGENT = "ai-agent";
const USER = "alice";

let server: RunningServer;
let operator: MemoryClient;
let client: MemoryClient;

const usage = {
  inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 },
  outputTokens: { total: 1, text: 1, reasoning: 0 },
};
const stop = { unified: "stop" as const, raw: undefined };

function replying(text: string) {
  return new MockLanguageModelV3({ doGenerate: { content: [{ type: "text", text }], finishReason: stop, usage, warnings: [] } });
}

function session(sessionId: string, over: Partial<MemorySession> = {}): MemorySession {
  return { client, agentId: AGENT, userId: USER, sessionId, ...over };
}

async function messages(sessionId: string): Promise<string[]> {
  const page = await client.listMemories(AGENT, { session_id: sessionId, kind: ["message"], limit: 200 });
  return page.memories.map((memory) => memory.content).reverse(); // listed newest first
}

/** The system prompt a mock model was given in its `n`-th call. */
function systemOf(model: MockLanguageModelV3, n = 0, stream = false): string {
  const prompt = (stream ? model.doStreamCalls : model.doGenerateCalls)[n]?.prompt ?? [];
  const first = prompt[0];
  return first?.role === "system" ? first.content : "";
}

before(async () => {
  server = await startServer({ MEMORY_WRITE_AGENTS: JSON.stringify([AGENT, "travel-bot"]) });
  operator = new MemoryClient(server.baseUrl, { apiKey: server.operatorKey });
  client = new MemoryClient(server.baseUrl, {
    apiKey: (await operator.createKey({ name: "ai-sdk", role: "write", agents: [AGENT] })).key,
  });
  await operator.putAgent(AGENT, {});
});

after(async () => {
  await server?.stop();
});

describe("memoryMiddleware", () => {
  test("generateText: the memory block in the system prompt, the exchange recorded once", async () => {
    await client.recordMessage("s-generate", { agent_id: AGENT, user_id: USER, role: "user", content: "I keep a pelican named Bo." });
    const llm = replying("Your pelican is called Bo.");
    const model = wrapLanguageModel({ model: llm, middleware: memoryMiddleware(session("s-generate")) });
    const asked = { model, system: "You are a helpful assistant.", prompt: "What is my pelican called?" };

    const { text } = await generateText(asked);
    assert.equal(text, "Your pelican is called Bo.");
    const system = systemOf(llm);
    assert.ok(system.startsWith("You are a helpful assistant.\n\n<"), system); // the application's own, then the block
    assert.match(system, /pelican named Bo/);
    assert.deepEqual(await messages("s-generate"), [
      "I keep a pelican named Bo.", "What is my pelican called?", "Your pelican is called Bo."]);

    await generateText(asked); // the same call again (a retry): the same messages, recorded once
    assert.equal((await messages("s-generate")).length, 3);
  });

  test("streamText: the reply recorded once it has streamed; without a system prompt the block is one", async () => {
    const llm = new MockLanguageModelV3({
      doStream: {
        stream: convertArrayToReadableStream([
          { type: "stream-start", warnings: [] },
          { type: "text-start", id: "t" },
          { type: "text-delta", id: "t", delta: "Bo eats " },
          { type: "text-delta", id: "t", delta: "sardines." },
          { type: "text-end", id: "t" },
          { type: "finish", finishReason: stop, usage },
        ]),
      },
    });
    const history: ModelMessage[] = [
      { role: "user", content: "Bo is my pelican." },
      { role: "assistant", content: "A fine bird." },
      { role: "user", content: "What does Bo eat?" },
    ];
    const model = wrapLanguageModel({ model: llm, middleware: memoryMiddleware(session("s-stream")) });
    const result = streamText({ model, messages: history });
    assert.equal(await result.text, "Bo eats sardines.");
    assert.match(systemOf(llm, 0, true), /^</);
    // The prompt's latest user message and the reply: the earlier ones are the application's to record.
    assert.deepEqual(await messages("s-stream"), ["What does Bo eat?", "Bo eats sardines."]);
  });

  test("record: false leaves the recording to the application; the prompt's messages are the host window", async () => {
    await client.recordMessage("s-window", { agent_id: AGENT, user_id: USER, role: "user", content: "My heron is Ada." });
    const llm = replying("Ada.");
    const middleware = memoryMiddleware({ ...session("s-window"), record: false });
    await generateText({ model: wrapLanguageModel({ model: llm, middleware }),
      messages: [{ role: "user", content: "My heron is Ada." }, { role: "user", content: "Who is my heron?" }] });
    assert.doesNotMatch(systemOf(llm), /heron is Ada/); // the model reads it in the prompt already
    assert.deepEqual(await messages("s-window"), ["My heron is Ada."]);
  });

  test("a failure fails the call, unless onError takes it", async () => {
    const down = new MemoryClient("http://127.0.0.1:9", { maxRetries: 0 }); // nothing listens on port 9
    const failing = wrapLanguageModel({ model: replying("Hi."), middleware: memoryMiddleware(session("s-down", { client: down })) });
    await assert.rejects(generateText({ model: failing, prompt: "Hello?", maxRetries: 0 }));

    const seen: string[] = [];
    const llm = replying("Hi.");
    const tolerant = memoryMiddleware({ ...session("s-down", { client: down }), onError: (_, during) => seen.push(during) });
    const { text } = await generateText({ model: wrapLanguageModel({ model: llm, middleware: tolerant }), prompt: "Hello?" });
    assert.equal(text, "Hi.");
    assert.deepEqual(seen, ["record", "context", "record"]);
    assert.equal(systemOf(llm), ""); // no block to give

    const rival = new MemoryClient(server.baseUrl, {
      apiKey: (await operator.createKey({ name: "rival", role: "write", agents: ["rival"] })).key,
    });
    const refused = wrapLanguageModel({ model: replying("Hi."), middleware: memoryMiddleware(session("s-rival", { client: rival })) });
    await assert.rejects(generateText({ model: refused, prompt: "Hello?", maxRetries: 0 }), PermissionDenied);
  });
});

/** A tool called as the SDK calls it: the input through its schema (defaults filled in), then execute. */
async function execute(tools: ReturnType<typeof memoryTools>, name: keyof ReturnType<typeof memoryTools>,
  input: unknown): Promise<Record<string, unknown>> {
  const schema = tools[name].inputSchema as unknown as z.ZodType;
  const run = tools[name].execute as unknown as (input: unknown, options: object) => PromiseLike<unknown>;
  return (await run(schema.parse(input), { toolCallId: "call-1", messages: [] })) as Record<string, unknown>;
}

describe("memoryTools", () => {

  test("the model writes a memory through generateText's tool loop", async () => {
    const llm = new MockLanguageModelV3({
      doGenerate: [
        { content: [{ type: "tool-call", toolCallId: "w1", toolName: "memory_write",
          input: JSON.stringify({ content: "Alice is allergic to peanuts.", kind: "fact", tags: ["health"] }) }],
        finishReason: { unified: "tool-calls", raw: undefined }, usage, warnings: [] },
        { content: [{ type: "tool-call", toolCallId: "g1", toolName: "memory_get", input: JSON.stringify({ memory_id: "" }) }],
          finishReason: { unified: "tool-calls", raw: undefined }, usage, warnings: [] },
        { content: [{ type: "text", text: "Noted." }], finishReason: stop, usage, warnings: [] },
      ],
    });
    const result = await generateText({ model: llm, prompt: "Remember: I am allergic to peanuts.",
      tools: memoryTools(session("s-tools")), stopWhen: stepCountIs(5) });
    assert.equal(result.text, "Noted.");
    const written = result.steps[0]!.toolResults[0]!.output as { id: string; namespace: string };
    assert.equal(written.namespace, `user:${AGENT}:${USER}`);
    const invalid = result.steps[1]!.content.find((part) => part.type === "tool-error");
    assert.ok(invalid, "an empty memory_id is refused by the tool's schema"); // and the model is told
    const stored = await client.memoryGet(AGENT, written.id);
    assert.deepEqual([stored.content, stored.tags], ["Alice is allergic to peanuts.", ["health"]]);
  });

  test("every tool, called on its own", async () => {
    const tools = memoryTools(session("s-tools"));
    const run = (name: keyof typeof tools, input: unknown) => execute(tools, name, input);

    const written = await run("memory_write", { content: "Alice flies to Lisbon on June 3rd.", kind: "fact", where: "user",
      title: "Flight", tags: ["travel"], confidence: 0.9 });
    const id = written.id as string;
    const found = await run("memory_search", { query: "Lisbon flight", scope: "user", top_k: 5 });
    const hits = found.results as { id: string; content: string; explanation?: unknown }[];
    assert.equal(hits[0]?.id, id);
    assert.equal(hits[0]?.explanation, undefined); // the hit, not how it was scored
    assert.equal((await run("memory_get", { memory_id: id })).title, "Flight");
    const updated = await run("memory_update", { memory_id: id, confidence: 0.5, clear: ["title", "tags"] });
    assert.deepEqual([updated.confidence, updated.title, updated.tags], [0.5, null, []]);
    await assert.rejects(run("memory_update", { memory_id: id, title: "New", clear: ["title"] }), /both given a new value/);
    assert.ok((await run("memory_delete", { memory_id: id })).purge_at);
    assert.equal((await run("memory_undelete", { memory_id: id })).deleted_at, null);
    await assert.rejects(run("memory_get", { memory_id: "no-such-memory" }), NotFoundError);

    const shared = await run("memory_write", { content: "The office closes at 6pm.", where: "agent" });
    assert.deepEqual([shared.namespace, shared.kind], [`agent:${AGENT}`, "fact"]);
  });

  test("a key limited to one user reaches that user's memories only", async () => {
    const alices = new MemoryClient(server.baseUrl, {
      apiKey: (await operator.createKey({ name: "alice", role: "write", agents: [AGENT], users: [USER] })).key,
    });
    const bob = memoryTools(session("s-bob", { client: alices, userId: "bob" }));
    await assert.rejects(execute(bob, "memory_search", { query: "peanuts", scope: "user", top_k: 5 }), PermissionDenied);
    await assert.rejects(execute(bob, "memory_write", { content: "Forged.", kind: "fact", where: "user" }), PermissionDenied);
    const asBob = wrapLanguageModel({ model: replying("Hi."), middleware: memoryMiddleware(session("s-bob", { client: alices, userId: "bob" })) });
    await assert.rejects(generateText({ model: asBob, prompt: "Hello?", maxRetries: 0 }), PermissionDenied);
  });
});

describe("the documentation", () => {
  const PACKAGE = join(import.meta.dirname, "..", "..");
  const example = readFileSync(join(PACKAGE, "examples", "ai-sdk.mjs"), "utf8");

  test("the AI SDK example runs against the server", async () => {
    const { stdout } = await promisify(execFile)(process.execPath, [join(PACKAGE, "examples", "ai-sdk.mjs")], {
      env: { ...process.env, MEMORY_SERVICE_URL: server.baseUrl, MEMORY_SERVICE_API_KEY: server.operatorKey },
    });
    assert.match(stdout, /^It leaves at 9am\.\nYou are a travel assistant\.\n\n<\w[\s\S]*9am/);
  });

  test("the integration's page and the README show the example as it is", () => {
    for (const page of [join(PACKAGE, "..", "..", "docs", "integrations", "vercel-ai-sdk.md"), join(PACKAGE, "README.md")]) {
      assert.ok(readFileSync(page, "utf8").includes(example), `${page} shows examples/ai-sdk.mjs`);
    }
  });
});
