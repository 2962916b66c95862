import { generateText, stepCountIs, wrapLanguageModel } from "ai";
import { MockLanguageModelV3 } from "ai/test";
import { MemoryClient } from "memory-service-client";
import { memoryMiddleware, memoryTools } from "memory-service-client/ai-sdk";

const client = new MemoryClient(process.env.MEMORY_SERVICE_URL ?? "http://127.0.0.1:8080", {
  apiKey: process.env.MEMORY_SERVICE_API_KEY, // none on a server bound to loopback
});
const session = { client, agentId: "travel-bot", userId: "alice", sessionId: "lisbon-trip" };
await client.putAgent(session.agentId, {});
await client.recordMessage(session.sessionId, {
  agent_id: session.agentId, user_id: session.userId, role: "user",
  content: "The flight from Berlin leaves on June 3rd at 9am.",
});

// Your provider's model, e.g. openai("gpt-4o-mini"). Here the AI SDK's mock, which answers
// from the system prompt it is given, so that this runs without a key.
const llm = new MockLanguageModelV3({
  doGenerate: async ({ prompt }) => ({
    content: [{ type: "text", text: /9am/.test(prompt[0].content) ? "It leaves at 9am." : "I do not know." }],
    finishReason: { unified: "stop", raw: undefined },
    usage: { inputTokens: { total: 0, noCache: 0, cacheRead: 0, cacheWrite: 0 },
             outputTokens: { total: 0, text: 0, reasoning: 0 } },
    warnings: [],
  }),
});

const model = wrapLanguageModel({ model: llm, middleware: memoryMiddleware(session) });
const { text } = await generateText({
  model,
  system: "You are a travel assistant.",
  prompt: "When does my flight leave?",
  tools: memoryTools(session), // memory_search, memory_get, memory_write, ... for the model to call
  stopWhen: stepCountIs(3),
});
console.log(text);
console.log(llm.doGenerateCalls[0].prompt[0].content); // the system prompt, with the memory block
