/**
 * The client of the memory-service HTTP API: one method per operation of the OpenAPI schema,
 * named after its operationId (`record_message` -> `recordMessage`), each typed by the
 * types openapi-typescript generated from that schema (src/schema.ts), so a route that
 * changes breaks the build here rather than a caller at run time.
 *
 * Bodies and query parameters are the wire's own objects (snake_case fields, ISO 8601
 * strings for times), exactly as the schema and the service's docs name them. Errors raise
 * the classes of ./errors.ts; 429 and 503 answers are retried by the Python client's rules
 * (./retry.ts). `api` is the typed openapi-fetch client underneath, with the same key and
 * retries, for a call this class does not wrap.
 */

import createClient, { type Client } from "openapi-fetch";

import { errorFor } from "./errors.js";
import { DEFAULT_MAX_RETRIES, DEFAULT_MAX_RETRY_WAIT, DEFAULT_TIMEOUT, retryingFetch } from "./retry.js";
import type { components, operations, paths } from "./schema.js";

export const VERSION = "0.1.0";

export type Schemas = components["schemas"];
/** The query parameters of an operation, by operationId. */
export type QueryOf<K extends keyof operations> = NonNullable<operations[K]["parameters"]["query"]>;
/** The JSON body of an operation, by operationId. */
export type BodyOf<K extends keyof operations> =
  operations[K] extends { requestBody?: { content: { "application/json": infer B } } } ? B : never;

/** A message to record; `message_id` is made by the client when not given, so that a
 * retried request is recognised as the same message (the answer carries it). */
export type MessageInput = BodyOf<"record_message">;

export interface MemoryClientOptions {
  /** Sent as `Authorization: Bearer <key>`; none for a keyless loopback server. */
  apiKey?: string;
  /** Times a 429, or a 503 of a call safe to repeat, is retried (default 3; 0: never). */
  maxRetries?: number;
  /** The longest one wait may be, in seconds, whatever Retry-After asks (default 30). */
  maxRetryWait?: number;
  /** Seconds one attempt may take (default 150: POST /form may wait for the worker); 0: no limit. */
  timeout?: number;
  /** The fetch underneath (default: the global one). */
  fetch?: typeof fetch;
}

type Result = { data?: unknown; error?: unknown; response: Response };

export class MemoryClient {
  readonly baseUrl: string;
  /** The typed openapi-fetch client underneath: `api.GET("/v1/agents/{agent_id}", ...)`. */
  readonly api: Client<paths>;

  constructor(baseUrl: string, options: MemoryClientOptions = {}) {
    const { maxRetries = DEFAULT_MAX_RETRIES, maxRetryWait = DEFAULT_MAX_RETRY_WAIT, timeout = DEFAULT_TIMEOUT } = options;
    if (maxRetries < 0 || maxRetryWait < 0 || timeout < 0) {
      throw new RangeError("maxRetries, maxRetryWait and timeout must be at least 0");
    }
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    const headers: Record<string, string> = { "User-Agent": `memory-service-client-ts/${VERSION}` };
    if (options.apiKey) headers.Authorization = `Bearer ${options.apiKey}`;
    const base = options.fetch ?? globalThis.fetch;
    this.api = createClient<paths>({
      baseUrl: this.baseUrl, headers, fetch: retryingFetch(base, { maxRetries, maxRetryWait, timeout }),
    });
  }

  /** The answer's data, or the error class of its status thrown. */
  private async unwrap<R extends Result>(method: string, pending: Promise<R>): Promise<NonNullable<R["data"]>> {
    const { data, error, response } = await pending;
    if (!response.ok || error !== undefined) throw errorFor(response, error, method);
    return data as NonNullable<R["data"]>;
  }

  // The session loop.

  /** Record one message (POST /v1/sessions/{session_id}/messages). */
  recordMessage(sessionId: string, message: MessageInput) {
    const body = { ...message, message_id: message.message_id ?? crypto.randomUUID().replaceAll("-", "") };
    return this.unwrap("POST", this.api.POST("/v1/sessions/{session_id}/messages", {
      params: { path: { session_id: sessionId } }, body,
    }));
  }

  /** Record many messages of the agent's sessions in one request
   * (POST /v1/agents/{agent_id}/messages/batch); each answered on its own in `items`. */
  recordBatch(agentId: string, batch: BodyOf<"record_batch">) {
    return this.unwrap("POST", this.api.POST("/v1/agents/{agent_id}/messages/batch", {
      params: { path: { agent_id: agentId } }, body: batch,
    }));
  }

  /** Form the session's pending window now; with `wait` (the default), answer once it is stored. */
  formMemories(sessionId: string, query: QueryOf<"form_memories"> = {}) {
    return this.unwrap("POST", this.api.POST("/v1/sessions/{session_id}/form", {
      params: { path: { session_id: sessionId }, query },
    }));
  }

  /** The session's gate, formation cursor and pending job. */
  getSession(sessionId: string) {
    return this.unwrap("GET", this.api.GET("/v1/sessions/{session_id}", { params: { path: { session_id: sessionId } } }));
  }

  /** The memory block for one model call (GET /v1/context). */
  getContext(query: QueryOf<"get_context">) {
    return this.unwrap("GET", this.api.GET("/v1/context", { params: { query } }));
  }

  /** Search an agent's memories by query parameters (GET /v1/search); every result explained. */
  searchMemories(query: QueryOf<"search_memories">) {
    return this.unwrap("GET", this.api.GET("/v1/search", { params: { query } }));
  }

  /** Search an agent's memories with a JSON body (POST /v1/agents/{agent_id}/search): the
   * filters of GET /v1/search and `as_of`, `include_superseded`. */
  searchMemoriesWithBody(agentId: string, request: BodyOf<"search_memories_with_body">) {
    return this.unwrap("POST", this.api.POST("/v1/agents/{agent_id}/search", {
      params: { path: { agent_id: agentId } }, body: request,
    }));
  }

  // The memory tools: an agent reads and curates its own memories.

  /** One memory (counts an access). */
  memoryGet(agentId: string, memoryId: string) {
    return this.unwrap("GET", this.api.GET("/v1/agents/{agent_id}/memories/{memory_id}", {
      params: { path: { agent_id: agentId, memory_id: memoryId } },
    }));
  }

  /** Write a new memory. Not retried after a 503 (it might have been stored), unless an
   * `idempotency_key` is given: the same key writes one memory and answers it again. */
  memoryWrite(agentId: string, memory: BodyOf<"memory_write">) {
    return this.unwrap("POST", this.api.POST("/v1/agents/{agent_id}/memories", {
      params: { path: { agent_id: agentId } }, body: memory,
    }));
  }

  /** Change the fields given; the others stay (`title`, `confidence` or `tags` null clears it). */
  memoryUpdate(agentId: string, memoryId: string, change: BodyOf<"memory_update">) {
    return this.unwrap("PATCH", this.api.PATCH("/v1/agents/{agent_id}/memories/{memory_id}", {
      params: { path: { agent_id: agentId, memory_id: memoryId } }, body: change,
    }));
  }

  /** Soft-delete a memory until its purge date (a second delete answers the same dates). */
  memoryDelete(agentId: string, memoryId: string) {
    return this.unwrap("DELETE", this.api.DELETE("/v1/agents/{agent_id}/memories/{memory_id}", {
      params: { path: { agent_id: agentId, memory_id: memoryId } },
    }));
  }

  /** Bring back a soft-deleted memory before its purge date. */
  memoryUndelete(agentId: string, memoryId: string) {
    return this.unwrap("POST", this.api.POST("/v1/agents/{agent_id}/memories/{memory_id}/undelete", {
      params: { path: { agent_id: agentId, memory_id: memoryId } },
    }));
  }

  /** Forget a message or a memory with everything formed from it: "soft" (undone by memoryUndelete) or "hard"
   * (for good; an admin key). Asked again after a failure, it finishes the forget. */
  memoryForget(agentId: string, memoryId: string, request: BodyOf<"memory_forget"> = { mode: "soft" }) {
    return this.unwrap("POST", this.api.POST("/v1/agents/{agent_id}/memories/{memory_id}/forget", {
      params: { path: { agent_id: agentId, memory_id: memoryId } }, body: request,
    }));
  }

  /** Re-form the agent's formed windows with the extractor configured now (dry_run counts; run_id resumes). */
  reformWindows(agentId: string, request: BodyOf<"reform_windows"> = {}) {
    return this.unwrap("POST", this.api.POST("/v1/agents/{agent_id}/reform", {
      params: { path: { agent_id: agentId } }, body: request,
    }));
  }

  /**
   * The memory was wrong (not outdated: that is `memoryUpdate`): a new memory with the right content replaces
   * it, the old one is kept as history (`corrected_by`) and its knowledge-graph facts close as wrong.
   */
  memoryCorrect(agentId: string, memoryId: string, correction: BodyOf<"memory_correct">) {
    return this.unwrap("POST", this.api.POST("/v1/agents/{agent_id}/memories/{memory_id}/correct", {
      params: { path: { agent_id: agentId, memory_id: memoryId } }, body: correction,
    }));
  }

  /** Undo the correction of `memoryId` (the memory corrected): live again, its correction soft-deleted. */
  memoryUncorrect(agentId: string, memoryId: string) {
    return this.unwrap("POST", this.api.POST("/v1/agents/{agent_id}/memories/{memory_id}/uncorrect", {
      params: { path: { agent_id: agentId, memory_id: memoryId } },
    }));
  }

  /** Store the <memory_write>/<shadow_write> blocks of a model's output (repeatable for the same message). */
  parseWrites(agentId: string, request: BodyOf<"parse_writes">) {
    return this.unwrap("POST", this.api.POST("/v1/agents/{agent_id}/writes/parse", {
      params: { path: { agent_id: agentId } }, body: request,
    }));
  }

  // The knowledge graph.

  /** One page of the agent's entities, by name; pass the page's `next` as `cursor` for the next. */
  listEntities(agentId: string, query: QueryOf<"list_entities"> = {}) {
    return this.unwrap("GET", this.api.GET("/v1/agents/{agent_id}/entities", {
      params: { path: { agent_id: agentId }, query },
    }));
  }

  /** One entity with its facts (those true `as_of`; all with `include_superseded`) and neighbours. */
  getEntity(agentId: string, entityId: string, query: QueryOf<"get_entity"> = {}) {
    return this.unwrap("GET", this.api.GET("/v1/agents/{agent_id}/entities/{entity_id}", {
      params: { path: { agent_id: agentId, entity_id: entityId }, query },
    }));
  }

  /** Undo the invalidation of a fact (a current fact raises ConflictError). */
  restoreFact(agentId: string, factId: string) {
    return this.unwrap("POST", this.api.POST("/v1/agents/{agent_id}/facts/{fact_id}/restore", {
      params: { path: { agent_id: agentId, fact_id: factId } },
    }));
  }

  /** Undo a merge: `alias` becomes an entity of its own again. */
  splitEntity(agentId: string, entityId: string, request: BodyOf<"split_entity">) {
    return this.unwrap("POST", this.api.POST("/v1/agents/{agent_id}/entities/{entity_id}/split", {
      params: { path: { agent_id: agentId, entity_id: entityId } }, body: request,
    }));
  }

  // Agents and shards.

  /** Create or replace the agent's settings (a setting not given takes its default). */
  putAgent(agentId: string, settings: BodyOf<"put_agent"> = {}) {
    return this.unwrap("PUT", this.api.PUT("/v1/agents/{agent_id}", {
      params: { path: { agent_id: agentId } }, body: settings,
    }));
  }

  getAgent(agentId: string) {
    return this.unwrap("GET", this.api.GET("/v1/agents/{agent_id}", { params: { path: { agent_id: agentId } } }));
  }

  /** The agent's LLM usage today and this month (UTC) against its budgets (docs/llm-budgets.md). */
  agentUsage(agentId: string) {
    return this.unwrap("GET", this.api.GET("/v1/agents/{agent_id}/usage", { params: { path: { agent_id: agentId } } }));
  }

  /** Create or replace a shard (a topic the agent keeps facts and suggestions on). */
  putShard(agentId: string, shardId: string, shard: BodyOf<"put_shard">) {
    return this.unwrap("PUT", this.api.PUT("/v1/agents/{agent_id}/shards/{shard_id}", {
      params: { path: { agent_id: agentId, shard_id: shardId } }, body: shard,
    }));
  }

  listShards(agentId: string) {
    return this.unwrap("GET", this.api.GET("/v1/agents/{agent_id}/shards", { params: { path: { agent_id: agentId } } }));
  }

  // Browsing what the service holds: each list one page, newest first; pass its `next` as `cursor`.

  /** The agents the key reaches, with their counts of users and sessions. */
  listAgents(query: QueryOf<"list_agents"> = {}) {
    return this.unwrap("GET", this.api.GET("/v1/agents", { params: { query } }));
  }

  /** The agent's users, by id. */
  listUsers(agentId: string, query: QueryOf<"list_users"> = {}) {
    return this.unwrap("GET", this.api.GET("/v1/agents/{agent_id}/users", {
      params: { path: { agent_id: agentId }, query },
    }));
  }

  /** The agent's sessions, newest first, each with its gate, formation cursor and pending window. */
  listSessions(agentId: string, query: QueryOf<"list_sessions"> = {}) {
    return this.unwrap("GET", this.api.GET("/v1/agents/{agent_id}/sessions", {
      params: { path: { agent_id: agentId }, query },
    }));
  }

  /** The agent's memories, newest first, filtered by namespace, user, session, kind, tag, time and state. */
  listMemories(agentId: string, query: QueryOf<"list_memories"> = {}) {
    return this.unwrap("GET", this.api.GET("/v1/agents/{agent_id}/memories", {
      params: { path: { agent_id: agentId }, query },
    }));
  }

  /** One memory with its provenance (messages, window, extractor), access count and audit history. */
  getMemoryDetail(agentId: string, memoryId: string) {
    return this.unwrap("GET", this.api.GET("/v1/agents/{agent_id}/memories/{memory_id}/detail", {
      params: { path: { agent_id: agentId, memory_id: memoryId } },
    }));
  }

  // Startup records.

  /** Create or replace a startup record (the same record again changes nothing). */
  putStartupRecord(agentId: string, recordId: string, record: BodyOf<"put_startup_record">) {
    return this.unwrap("PUT", this.api.PUT("/v1/agents/{agent_id}/startup/{record_id}", {
      params: { path: { agent_id: agentId, record_id: recordId } }, body: record,
    }));
  }

  /** The agent's startup records, by priority then id. */
  listStartupRecords(agentId: string) {
    return this.unwrap("GET", this.api.GET("/v1/agents/{agent_id}/startup", { params: { path: { agent_id: agentId } } }));
  }

  /** Delete a startup record; `deleted` says whether there was one. */
  deleteStartupRecord(agentId: string, recordId: string) {
    return this.unwrap("DELETE", this.api.DELETE("/v1/agents/{agent_id}/startup/{record_id}", {
      params: { path: { agent_id: agentId, record_id: recordId } },
    }));
  }

  /** The startup records for one model call. In modes first-run and digest the call remembers
   * what it sent, so it is not retried after a 503. */
  getStartupBlock(agentId: string, query: QueryOf<"get_startup_block"> = {}) {
    return this.unwrap("GET", this.api.GET("/v1/agents/{agent_id}/startup/block", {
      params: { path: { agent_id: agentId }, query },
    }));
  }

  // Keys, audit, users.

  /** Make a key (the answer holds it, this once). Not retried after a 503: it might have been made. */
  createKey(key: BodyOf<"create_key">) {
    return this.unwrap("POST", this.api.POST("/v1/keys", { body: key }));
  }

  listKeys() {
    return this.unwrap("GET", this.api.GET("/v1/keys"));
  }

  revokeKey(keyId: string) {
    return this.unwrap("DELETE", this.api.DELETE("/v1/keys/{key_id}", { params: { path: { key_id: keyId } } }));
  }

  /** A page of the audit log, newest first; pass the page's `next` as `before` for older ones. */
  readAudit(query: QueryOf<"read_audit"> = {}) {
    return this.unwrap("GET", this.api.GET("/v1/audit", { params: { query } }));
  }

  /** Erase everything of the user with the agent (a second call reports zeros). */
  eraseUser(agentId: string, userId: string) {
    return this.unwrap("DELETE", this.api.DELETE("/v1/agents/{agent_id}/users/{user_id}", {
      params: { path: { agent_id: agentId, user_id: userId } },
    }));
  }

  exportUser(agentId: string, userId: string) {
    return this.unwrap("GET", this.api.GET("/v1/agents/{agent_id}/users/{user_id}/export", {
      params: { path: { agent_id: agentId, user_id: userId } },
    }));
  }

  // Change events and webhooks (docs/events.md).

  /** The agent's change events as server-sent events, as text, until `timeout` seconds pass
   * (the stream stays open until then: give one); `after`: resume after this event id
   * ("0-0": every event the stream still holds). Each event is an `id:`, `event:` and `data:`
   * (its JSON) block. */
  async eventStream(agentId: string, query: QueryOf<"event_stream"> = {}): Promise<string> {
    const text = await this.unwrap("GET", this.api.GET("/v1/agents/{agent_id}/events", {
      params: { path: { agent_id: agentId }, query }, parseAs: "text",
    }));
    return text ?? "";
  }

  /** Create or replace a webhook: every event of the agent POSTed to `url`, signed with `secret`
   * (never answered back). */
  putWebhook(agentId: string, webhookId: string, webhook: BodyOf<"put_webhook">) {
    return this.unwrap("PUT", this.api.PUT("/v1/agents/{agent_id}/webhooks/{webhook_id}", {
      params: { path: { agent_id: agentId, webhook_id: webhookId } }, body: webhook,
    }));
  }

  /** A webhook's delivery state: its cursor, failed attempts, next attempt, dead letters. */
  getWebhook(agentId: string, webhookId: string) {
    return this.unwrap("GET", this.api.GET("/v1/agents/{agent_id}/webhooks/{webhook_id}", {
      params: { path: { agent_id: agentId, webhook_id: webhookId } },
    }));
  }

  listWebhooks(agentId: string) {
    return this.unwrap("GET", this.api.GET("/v1/agents/{agent_id}/webhooks", { params: { path: { agent_id: agentId } } }));
  }

  deleteWebhook(agentId: string, webhookId: string) {
    return this.unwrap("DELETE", this.api.DELETE("/v1/agents/{agent_id}/webhooks/{webhook_id}", {
      params: { path: { agent_id: agentId, webhook_id: webhookId } },
    }));
  }

  /** The events a webhook gave up on after its retries. */
  webhookDeadLetters(agentId: string, webhookId: string) {
    return this.unwrap("GET", this.api.GET("/v1/agents/{agent_id}/webhooks/{webhook_id}/dead-letters", {
      params: { path: { agent_id: agentId, webhook_id: webhookId } },
    }));
  }

  /** Deliver a dead letter again (the worker sends it once more). */
  replayDeadLetter(agentId: string, webhookId: string, eventId: string) {
    return this.unwrap("POST", this.api.POST("/v1/agents/{agent_id}/webhooks/{webhook_id}/dead-letters/{event_id}/replay", {
      params: { path: { agent_id: agentId, webhook_id: webhookId, event_id: eventId } },
    }));
  }

  /** Drop a dead letter. */
  dropDeadLetter(agentId: string, webhookId: string, eventId: string) {
    return this.unwrap("DELETE", this.api.DELETE("/v1/agents/{agent_id}/webhooks/{webhook_id}/dead-letters/{event_id}", {
      params: { path: { agent_id: agentId, webhook_id: webhookId, event_id: eventId } },
    }));
  }

  // Operations.

  /** Readiness (`detail`: each dependency, an operator key). A 503 raises ServiceUnavailable.
   * The route reads `?detail=true` itself, so the schema does not list it. */
  checkHealth(options: { detail?: boolean } = {}) {
    const querySerializer = () => (options.detail ? "detail=true" : "");
    return this.unwrap("GET", this.api.GET("/health", { querySerializer }));
  }

  /** Liveness: the process answers. */
  checkLiveness() {
    return this.unwrap("GET", this.api.GET("/health/live"));
  }

  /** The Prometheus counters, as text (an operator key). */
  async getMetrics(): Promise<string> {
    const text = await this.unwrap("GET", this.api.GET("/metrics", { parseAs: "text" }));
    return text ?? ""; // an empty answer (no counter yet) has no body to parse
  }
}
