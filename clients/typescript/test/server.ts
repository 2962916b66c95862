/**
 * The real memory-service for the tests: `python -m memory_service.cli serve` from this
 * checkout, on loopback, on a temporary embedded store, with the hash embedder (no model to
 * load) and keys required (an operator key made here), so the client's Authorization header
 * is exercised. MEMORY_SERVICE_PYTHON names the interpreter (default: the repo's .venv).
 */

import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";

export const REPO = resolve(import.meta.dirname, "..", "..", "..", ".."); // .test-build/test -> the repo

export interface RunningServer {
  baseUrl: string;
  operatorKey: string;
  stop(): Promise<void>;
}

/** A port free now on 127.0.0.1 (the server binds it a moment later). */
async function freePort(): Promise<number> {
  return new Promise((done, fail) => {
    const probe = createServer();
    probe.once("error", fail);
    probe.listen(0, "127.0.0.1", () => {
      const address = probe.address();
      probe.close(() => (typeof address === "object" && address ? done(address.port) : fail(new Error("no port"))));
    });
  });
}

export async function startServer(extraEnv: Record<string, string> = {}): Promise<RunningServer> {
  const python = process.env.MEMORY_SERVICE_PYTHON ?? join(REPO, ".venv", "bin", "python");
  const dataDir = mkdtempSync(join(tmpdir(), "memory-service-ts-"));
  const port = await freePort();
  const operatorKey = randomBytes(24).toString("base64url");
  const env: Record<string, string> = {};
  for (const [name, value] of Object.entries(process.env)) {
    // The store's URLs of the caller's environment would take the server off the embedded store.
    if (value !== undefined && !/^(FALKORDB_URL|REDIS_URL|MONGODB_URI)$/i.test(name)) env[name] = value;
  }
  Object.assign(env, {
    PYTHONPATH: REPO, EMBEDDER: "hash", API_AUTH: "keys", OPERATOR_API_KEY: operatorKey, ...extraEnv,
  });
  // cwd: the data directory, so that no .env of the caller's is read.
  const child = spawn(python, ["-m", "memory_service.cli", "serve", "--host", "127.0.0.1", "--port", String(port),
    "--data-dir", join(dataDir, "store"), "--log-level", "warning"], { cwd: dataDir, env, stdio: ["ignore", "ignore", "pipe"] });
  let log = "";
  child.stderr?.on("data", (chunk: Buffer) => { log = (log + chunk.toString()).slice(-20_000); });
  const baseUrl = `http://127.0.0.1:${port}`;
  try {
    await waitUntilLive(baseUrl, child, () => log);
  } catch (error) {
    await stopChild(child);
    rmSync(dataDir, { recursive: true, force: true });
    throw error;
  }
  return {
    baseUrl,
    operatorKey,
    async stop() {
      await stopChild(child);
      rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

async function waitUntilLive(baseUrl: string, child: ChildProcess, log: () => string): Promise<void> {
  const deadline = Date.now() + 90_000;
  while (Date.now() < deadline) {
    if (child.exitCode !== null) throw new Error(`the server exited (${child.exitCode}):\n${log()}`);
    try {
      const answer = await fetch(`${baseUrl}/health`);
      if (answer.ok) return;
    } catch {
      // not listening yet
    }
    await new Promise((done) => setTimeout(done, 200));
  }
  throw new Error(`the server did not answer within 90 s:\n${log()}`);
}

async function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((done) => child.once("exit", () => done()));
  child.kill("SIGTERM");
  const killer = setTimeout(() => child.kill("SIGKILL"), 15_000);
  await exited;
  clearTimeout(killer);
}
