// The committed src/schema.ts is what openapi-typescript makes of the committed openapi.json
// (the Python suite checks openapi.json against the API: tests/test_ts_client.py). Run by
// `make test-ts`; `make ts-client` regenerates both.
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const here = join(import.meta.dirname, "..");
const scratch = mkdtempSync(join(tmpdir(), "ts-client-check-"));
try {
  const fresh = join(scratch, "schema.ts");
  const generate = JSON.parse(readFileSync(join(here, "package.json"), "utf8")).scripts.generate
    .replace("src/schema.ts", fresh).split(" ");
  execFileSync(join(here, "node_modules", ".bin", generate[0]), generate.slice(1), { cwd: here, stdio: "pipe" });
  if (readFileSync(fresh, "utf8") !== readFileSync(join(here, "src", "schema.ts"), "utf8")) {
    console.error("src/schema.ts is not what openapi-typescript makes of openapi.json: run `make ts-client`");
    process.exit(1);
  }
  console.log("src/schema.ts is up to date with openapi.json");
} finally {
  rmSync(scratch, { recursive: true, force: true });
}
