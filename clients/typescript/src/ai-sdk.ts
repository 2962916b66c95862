/**
 * The Vercel AI SDK integration (`memory-service-client/ai-sdk`, docs/integrations/vercel-ai-sdk.md):
 * the service's session loop as a language-model middleware, and its memory tools as AI SDK
 * tools, over this package's MemoryClient (one API request per step, under its key).
 *
 * `memoryMiddleware` wraps any model (`wrapLanguageModel`): before each call it records the
 * prompt's latest user message and puts the session's memory block (GET /v1/context, for
 * that message) into the system prompt; after it, it records the model's reply (generate
 * and stream alike). The messages the prompt already holds are the block's `host_window`,
 * so it never repeats what the model reads anyway. `memoryTools` gives the model
 * memory_search, memory_get, memory_write, memory_update, memory_delete and memory_undelete,
 * bound to one user and session: the model names no agent, user or session, so it cannot
 * reach another's (and the API confines a key limited to some users as it always does).
 *
 * Typed by the AI SDK's own middleware type (ai 6: specification v3), so a change of the
 * SDK's interface breaks the build here rather than at run time.
 */

import { tool, type LanguageModelMiddleware } from "ai";
import { z } from "zod";

import type { MemoryClient, Schemas } from "./client.js";

type Middleware = Required<Pick<LanguageModelMiddleware, "transformParams" | "wrapGenerate" | "wrapStream">>;
type CallOptions = Parameters<Middleware["transformParams"]>[0]["params"];
type PromptMessage = CallOptions["prompt"][number];
type StreamResult = Awaited<ReturnType<Parameters<Middleware["wrapStream"]>[0]["doStream"]>>;
type StreamPart = StreamResult["stream"] extends ReadableStream<infer Part> ? Part : never;

/** The most messages a host may say it sends itself (the API's MAX_HOST_WINDOW). */
export const MAX_HOST_WINDOW = 1000;

/** Where the calls go: the client (its key decides what they may do) and whose session it is. */
export interface MemorySession {
  client: MemoryClient;
  agentId: string;
  userId: string;
  sessionId: string;
}

export interface MemoryMiddlewareOptions extends MemorySession {
  /** The memory block's size in characters (default: the server's). */
  budget?: number;
  /** chat (the default), task or document: the agent's recall settings for it apply. */
  contextType?: "chat" | "task" | "document";
  /** Record the user's message and the model's reply (default true); false when the
   * application records the conversation itself. */
  record?: boolean;
  /** Names this turn (e.g. the UI message's id): the recorded messages' ids are made from it
   * rather than from their position in the prompt. */
  turnId?: string;
  /** Called with what failed, and the call goes on without it (no memory block, or the
   * message not recorded). Without it a failure fails the model call. */
  onError?: (error: unknown, during: "context" | "record") => void;
}

/** The text of a prompt message (its text parts; a system message is text). */
function textOf(message: PromptMessage): string {
  if (typeof message.content === "string") return message.content;
  return message.content.map((part) => (part.type === "text" ? part.text : "")).join("");
}

/** A message id that is the same when the same call is made again (a retry, or the next
 * step of a tool loop), so the service records the message once. */
async function messageId(sessionId: string, turn: string, role: string, content: string): Promise<string> {
  const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode([sessionId, turn, role, content].join("\x1f")));
  return Array.from(new Uint8Array(digest).slice(0, 16), (b) => b.toString(16).padStart(2, "0")).join("");
}

/** The params with the memory block in the system prompt (after the application's own). */
function withMemory(params: CallOptions, xml: string): CallOptions {
  const [first, ...rest] = params.prompt;
  if (first?.role === "system") {
    return { ...params, prompt: [{ ...first, content: `${first.content}\n\n${xml}` }, ...rest] };
  }
  return { ...params, prompt: [{ role: "system", content: xml }, ...params.prompt] };
}

/** The language-model middleware of one user's session: the memory block in, the exchange recorded. */
export function memoryMiddleware(options: MemoryMiddlewareOptions): LanguageModelMiddleware {
  const { client, agentId, userId, sessionId, record = true } = options;

  async function guarded<T>(during: "context" | "record", work: () => Promise<T>): Promise<T | undefined> {
    try {
      return await work();
    } catch (error) {
      if (!options.onError) throw error;
      options.onError(error, during);
      return undefined;
    }
  }

  async function save(role: "user" | "assistant", content: string, position: number): Promise<void> {
    const id = await messageId(sessionId, options.turnId ?? String(position), role, content);
    await guarded("record", () => client.recordMessage(sessionId, {
      agent_id: agentId, user_id: userId, role, content, message_id: id,
    }));
  }

  const middleware: LanguageModelMiddleware & Middleware = {
    specificationVersion: "v3",

    async transformParams({ params }) {
      let position = params.prompt.length - 1;
      while (position >= 0 && params.prompt[position]!.role !== "user") position -= 1;
      const latest = position >= 0 ? textOf(params.prompt[position]!).trim() : "";
      if (record && latest) await save("user", latest, position);
      const shown = params.prompt.filter((message) => message.role === "user" || message.role === "assistant").length;
      const block = await guarded("context", () => client.getContext({
        agent_id: agentId, user_id: userId, session_id: sessionId, query: latest || undefined,
        budget: options.budget, context_type: options.contextType, host_window: Math.min(shown, MAX_HOST_WINDOW),
      }));
      return block ? withMemory(params, block.xml) : params;
    },

    async wrapGenerate({ doGenerate, params }) {
      const result = await doGenerate();
      const reply = result.content.map((part) => (part.type === "text" ? part.text : "")).join("").trim();
      if (record && reply) await save("assistant", reply, params.prompt.length);
      return result;
    },

    async wrapStream({ doStream, params }) {
      const { stream, ...rest } = await doStream();
      if (!record) return { stream, ...rest };
      let reply = "";
      const recording = new TransformStream<StreamPart, StreamPart>({
        transform(part, controller) {
          if (part.type === "text-delta") reply += part.delta;
          controller.enqueue(part);
        },
        async flush() {
          // Once the whole reply has streamed: a stream cut short records nothing.
          if (reply.trim()) await save("assistant", reply.trim(), params.prompt.length);
        },
      });
      return { stream: stream.pipeThrough(recording), ...rest };
    },
  };
  return middleware;
}

type Hit = Schemas["SearchHit"];
const PLACES = ["user", "session", "agent"] as const;
const WRITABLE_KINDS = ["fact", "directive", "suggestion", "observation", "episode"] as const;
const CLEARABLE = ["title", "confidence", "tags"] as const;
const memoryId = z.string().min(1).max(512).describe("the memory's id, as search or write answered it");
const tags = z.array(z.string().min(1).max(64)).max(20);

/** What a search shows the model of a hit: the memory and its score, not the explanation of it. */
function shown(hit: Hit) {
  return { id: hit.id, content: hit.content, kind: hit.kind, namespace: hit.namespace, title: hit.title ?? null,
    tags: hit.tags ?? [], age: hit.age, score: hit.score };
}

/** The memory tools of one user's session, for `generateText`/`streamText`'s `tools`. */
export function memoryTools(session: MemorySession) {
  const { client, agentId, userId, sessionId } = session;
  const namespace = { user: `user:${agentId}:${userId}`, session: `session:${sessionId}`, agent: `agent:${agentId}` };

  return {
    memory_search: tool({
      description: "Search the long-term memory: this user's memories (scope user, the default), this "
        + "conversation's (session) or the agent's shared knowledge (agent). Best first.",
      inputSchema: z.object({
        query: z.string().min(1).describe("what to look for, in plain words"),
        scope: z.enum(PLACES).default("user"),
        top_k: z.number().int().min(1).max(50).default(5).describe("results to return"),
        kinds: z.array(z.enum([...WRITABLE_KINDS, "message", "consolidated"])).optional()
          .describe("only these kinds (default: all)"),
        tags: tags.optional().describe("only memories carrying all of these tags"),
      }),
      execute: async ({ query, scope, top_k, kinds, tags }) => {
        const found = await client.searchMemoriesWithBody(agentId, {
          query, scope, top_k, kinds, tags,
          user_id: scope === "user" ? userId : undefined, session_id: scope === "session" ? sessionId : undefined,
        });
        return { results: found.results.map(shown) };
      },
    }),

    memory_get: tool({
      description: "Read one memory by id: content, title, tags, confidence, dates and provenance.",
      inputSchema: z.object({ memory_id: memoryId }),
      execute: async ({ memory_id }) => client.memoryGet(agentId, memory_id),
    }),

    memory_write: tool({
      description: "Remember something for later: about this user (where user, the default), this conversation "
        + "(session) or for every user (agent). Writes need the operator to have turned memory writes on.",
      inputSchema: z.object({
        content: z.string().min(1).describe("the memory, in one or a few self-contained sentences"),
        kind: z.enum(WRITABLE_KINDS).default("fact")
          .describe("fact, directive (how to behave), suggestion, observation or episode"),
        where: z.enum(PLACES).default("user"),
        title: z.string().max(200).optional(),
        tags: tags.optional(),
        confidence: z.number().min(0).max(1).optional().describe("how sure, 0 to 1"),
      }),
      execute: async ({ content, kind, where, title, tags, confidence }) =>
        client.memoryWrite(agentId, { content, kind, namespace: namespace[where], title, tags, confidence }),
    }),

    memory_update: tool({
      description: "Change the fields given of one memory; the others stay. To remove a title, confidence or tags, "
        + "name them in clear.",
      inputSchema: z.object({
        memory_id: memoryId,
        content: z.string().min(1).optional(),
        kind: z.enum(WRITABLE_KINDS).optional(),
        title: z.string().max(200).optional(),
        tags: tags.optional(),
        confidence: z.number().min(0).max(1).optional(),
        clear: z.array(z.enum(CLEARABLE)).optional().describe("fields to remove: title, confidence, tags"),
      }),
      execute: async ({ memory_id, clear = [], ...given }) => {
        const both = CLEARABLE.filter((field) => clear.includes(field) && given[field] !== undefined);
        if (both.length) throw new Error(`clear: ${both.join(", ")} both given a new value and cleared; do one or the other`);
        const change: Schemas["MemoryUpdate"] = Object.fromEntries(
          Object.entries(given).filter(([, value]) => value !== undefined));
        for (const field of clear) change[field] = null;
        return client.memoryUpdate(agentId, memory_id, change);
      },
    }),

    memory_correct: tool({
      description: "Correct a memory that was wrong (never true; for one that changed since, use memory_update): "
        + "the right content replaces it, the wrong one is kept as history only.",
      inputSchema: z.object({ memory_id: memoryId, content: z.string().min(1).describe("the right content") }),
      execute: async ({ memory_id, content }) => client.memoryCorrect(agentId, memory_id, { content }),
    }),

    memory_delete: tool({
      description: "Delete a memory: it leaves search at once; memory_undelete brings it back until its purge date.",
      inputSchema: z.object({ memory_id: memoryId }),
      execute: async ({ memory_id }) => client.memoryDelete(agentId, memory_id),
    }),

    memory_undelete: tool({
      description: "Bring back a deleted memory before its purge date.",
      inputSchema: z.object({ memory_id: memoryId }),
      execute: async ({ memory_id }) => client.memoryUndelete(agentId, memory_id),
    }),
  };
}
