import { MemoryClient } from "memory-service-client";

const client = new MemoryClient(process.env.MEMORY_SERVICE_URL ?? "http://127.0.0.1:8080", {
  apiKey: process.env.MEMORY_SERVICE_API_KEY, // none on a server bound to loopback
});
const agent_id = "travel-bot", user_id = "alice", session = "lisbon-trip";

await client.putAgent(agent_id, {});
for (const content of [
  "I'm planning a trip to Lisbon with my friend Bob in early June.",
  "I prefer window seats, and please keep the total budget under 2000 euros.",
  "The flight from Berlin leaves on June 3rd at 9am.",
]) {
  await client.recordMessage(session, { agent_id, user_id, role: "user", content });
}
const formed = await client.formMemories(session); // waits until the window's memories are stored
console.log("formed:", formed.memories);

const context = await client.getContext({ agent_id, user_id, session_id: session, query: "When does the flight leave?" });
console.log(`memory block, ${context.chars} of ${context.budget} chars:\n${context.xml}`);

const found = await client.searchMemories({ agent_id, query: "flight", scope: "user", user_id, top_k: 3 });
for (const hit of found.results) console.log(hit.score.toFixed(2), hit.content);
