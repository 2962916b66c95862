/**
 * The client's errors, as the Python client's (memory_service/client/errors.py): one class
 * per family of answers, each carrying the status and the service's own sentence (`detail`),
 * so that a caller catches `NotFoundError` rather than comparing numbers.
 */

import { retryAfter } from "./retry.js";

const DETAIL_CHARS = 2_000; // of an answer that is not the service's JSON (a proxy's page): enough to see what it is

/** The API answered an error. `status` is the HTTP status, `detail` the service's sentence
 * saying what was wrong (which field, which limit, which key). */
export class MemoryApiError extends Error {
  readonly status: number;
  readonly detail: string;
  readonly method: string;
  readonly path: string;
  /** Seconds, from the answer's Retry-After (429, 503). */
  readonly retryAfter: number | undefined;

  constructor(status: number, detail: string, options: { method?: string; path?: string; retryAfter?: number } = {}) {
    const { method = "", path = "" } = options;
    super(`${status} ${method} ${path}: ${detail}`.replace(/ {2,}/g, " "));
    this.name = new.target.name;
    this.status = status;
    this.detail = detail;
    this.method = method;
    this.path = path;
    this.retryAfter = options.retryAfter;
  }
}

/** 400, 413 or 422: malformed input; nothing was stored. */
export class InvalidRequest extends MemoryApiError {}
/** 401: no key, or a malformed, unknown or revoked one. */
export class AuthenticationError extends MemoryApiError {}
/** 403: a valid key whose agents, users or role do not cover the request. */
export class PermissionDenied extends MemoryApiError {}
/** 404: no such session, agent, key or memory (or one of another agent: the same answer). */
export class NotFoundError extends MemoryApiError {}
/** 409: the request contradicts what is stored. */
export class ConflictError extends MemoryApiError {}
/** 429: the key's requests or tokens per minute are spent; raised once the retries are spent. */
export class RateLimitError extends MemoryApiError {}
/** 5xx. */
export class ServerError extends MemoryApiError {}
/** 503: a store is down or overloaded, or a formation did not finish in time; raised once the
 * retries are spent (or at once for a call that is not retried). */
export class ServiceUnavailable extends ServerError {}

const BY_STATUS: Record<number, typeof MemoryApiError> = {
  400: InvalidRequest, 413: InvalidRequest, 422: InvalidRequest, 401: AuthenticationError, 403: PermissionDenied,
  404: NotFoundError, 409: ConflictError, 429: RateLimitError, 503: ServiceUnavailable,
};

/** The exception for an error answer; `body` is what openapi-fetch read of it (JSON or text). */
export function errorFor(response: Response, body: unknown, method: string): MemoryApiError {
  const status = response.status;
  const Kind = BY_STATUS[status] ?? (status >= 500 ? ServerError : MemoryApiError);
  return new Kind(status, detailOf(body, response), {
    method, path: new URL(response.url || "http://unknown/").pathname, retryAfter: retryAfter(response),
  });
}

function detailOf(body: unknown, response: Response): string {
  if (typeof body === "string") return body.slice(0, DETAIL_CHARS) || response.statusText;
  const detail = body !== null && typeof body === "object" ? (body as { detail?: unknown }).detail : undefined;
  if (typeof detail === "string") return detail;
  return JSON.stringify(detail ?? body ?? response.statusText).slice(0, DETAIL_CHARS);
}
