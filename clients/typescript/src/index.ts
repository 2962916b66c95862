/** memory-service-client: a typed client of the memory-service HTTP API. */

export { MemoryClient, VERSION } from "./client.js";
export type { BodyOf, MemoryClientOptions, MessageInput, QueryOf, Schemas } from "./client.js";
export {
  AuthenticationError, ConflictError, InvalidRequest, MemoryApiError, NotFoundError, PermissionDenied,
  RateLimitError, ServerError, ServiceUnavailable,
} from "./errors.js";
export {
  BACKOFF_BASE, DEFAULT_MAX_RETRIES, DEFAULT_MAX_RETRY_WAIT, DEFAULT_TIMEOUT, retryAfter, retryDelay, retryable,
  retryingFetch, safeToRepeat,
} from "./retry.js";
export type { RetryPolicy } from "./retry.js";
export type { components, operations, paths } from "./schema.js";
