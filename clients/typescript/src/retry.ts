/**
 * When a call is sent again: the Python client's rules (memory_service/client/_common.py),
 * so that both clients treat the service's 429 and 503 alike.
 *
 * A 429 is answered before the request runs (rate limits are checked first), so any call
 * may be sent again. A 503 (a store down or overloaded, a formation not finished in time)
 * may come after the request did its work, so only a call that is safe to repeat is sent
 * again: every call but creating a key, writing a memory without an idempotency key, and a
 * startup block in mode first-run or digest (which remembers what it sent). The wait is what
 * Retry-After asks (seconds or an HTTP date), else 0.5, 1, 2, ... seconds; never more than
 * the cap.
 */

export const DEFAULT_MAX_RETRIES = 3;
export const DEFAULT_MAX_RETRY_WAIT = 30; // seconds: the longest one wait may be, whatever Retry-After asks
export const DEFAULT_TIMEOUT = 150; // seconds: POST /form waits up to FORM_WAIT_SECONDS (120 by default)
export const BACKOFF_BASE = 0.5; // seconds, without a Retry-After: 0.5, 1, 2, ...

export interface RetryPolicy {
  /** How many times a call is sent again after a 429 or 503 (0: never). */
  maxRetries: number;
  /** The longest one wait may be, in seconds, whatever Retry-After asks. */
  maxRetryWait: number;
  /** Seconds one attempt may take before it is aborted (0: no limit). */
  timeout: number;
}

/** Seconds the answer's Retry-After asks for (delay-seconds or an HTTP date), if any. */
export function retryAfter(response: Response, now: number = Date.now()): number | undefined {
  const value = response.headers.get("Retry-After");
  if (value === null) return undefined;
  const trimmed = value.trim();
  if (/^\d+(\.\d+)?$/.test(trimmed)) return Math.max(0, Number(trimmed));
  const when = Date.parse(trimmed);
  if (Number.isNaN(when)) return undefined;
  return Math.max(0, (when - now) / 1000);
}

/** Seconds to wait before attempt `attempt + 1`: Retry-After when given, else an
 * exponential backoff; never more than `cap`. */
export function retryDelay(response: Response, attempt: number, cap: number): number {
  const asked = retryAfter(response);
  return Math.min(cap, asked ?? BACKOFF_BASE * 2 ** attempt);
}

/** Whether an error answer may be retried: 429 always, 503 only for a call safe to repeat. */
export function retryable(status: number, idempotent: boolean): boolean {
  return status === 429 || (status === 503 && idempotent);
}

/**
 * Whether a request is safe to send again after a 503, by the Python client's `idempotent=`
 * arguments: POST /v1/keys (create_key) never; POST /v1/agents/{id}/memories (memory_write)
 * only with an idempotency_key; GET /v1/agents/{id}/startup/block only in mode always (the
 * default). Paths are matched at their end, so a base URL with a prefix works too.
 */
export function safeToRepeat(method: string, url: URL, body: string | undefined): boolean {
  const path = url.pathname;
  if (method === "POST" && /\/v1\/keys$/.test(path)) return false;
  if (method === "POST" && /\/v1\/agents\/[^/]+\/memories$/.test(path)) {
    try {
      const parsed: unknown = body ? JSON.parse(body) : undefined;
      const key = (parsed as { idempotency_key?: unknown } | undefined)?.idempotency_key;
      return typeof key === "string" && key.length > 0;
    } catch {
      return false;
    }
  }
  if (method === "GET" && /\/v1\/agents\/[^/]+\/startup\/block$/.test(path)) {
    const mode = url.searchParams.get("mode");
    return mode === null || mode === "always";
  }
  return true;
}

const sleep = (seconds: number) => new Promise<void>((resolve) => setTimeout(resolve, seconds * 1000));

/**
 * A fetch that sends a request again on a 429 or 503 as the rules above say, and answers the
 * last response (an error one included: the caller turns it into an exception). The body is
 * read once, so that each attempt sends it whole.
 */
export function retryingFetch(base: typeof fetch, policy: RetryPolicy): (request: Request) => Promise<Response> {
  return async (request: Request): Promise<Response> => {
    const body = request.body === null ? undefined : await request.text();
    const idempotent = safeToRepeat(request.method, new URL(request.url), body);
    for (let attempt = 0; ; attempt++) {
      const signal = policy.timeout > 0
        ? AbortSignal.any([request.signal, AbortSignal.timeout(policy.timeout * 1000)])
        : request.signal;
      const response = await base(new Request(request.url, { method: request.method, headers: request.headers, body, signal }));
      if (response.status < 400 || attempt >= policy.maxRetries || !retryable(response.status, idempotent)) {
        return response;
      }
      await response.body?.cancel(); // free the connection while waiting
      await sleep(retryDelay(response, attempt, policy.maxRetryWait));
    }
  };
}
