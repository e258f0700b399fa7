// A real `rota serve` for the tests, and programs as child processes. The
// binary is $ROTA_BIN (.ci/run sets it to the debug build), else the
// checkout's target/debug/rota.
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { accessSync, constants, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync, openSync, closeSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { setTimeout as sleep } from "node:timers/promises";

const here = dirname(fileURLToPath(import.meta.url));
/** clients/typescript/dist (the compiled tests run from dist/test). */
export const DIST_DIR = resolve(here, "..");
const REPO_DIR = resolve(DIST_DIR, "../../..");

export const ADMIN_TOKEN = "admin-token-for-the-typescript-client";
export const SUBMIT_TOKEN = "submit-token-for-the-typescript-client";
export const WORKER_TOKEN = "worker-token-for-the-typescript-client";
const WORKER_KEY = "a-worker-lease-key-of-at-least-32-bytes-for-typescript";

const WORKFLOWS: Record<string, string> = {
  // The README's workflow: what examples/submit.ts submits.
  greet: `
name: greet
version: 1
steps:
  - name: wait
    agent: delay
    with: { for: "100ms" }
  - name: echo
    agent: exec
    with: { command: ["cat"], stdin: { hello: "{{ input.name }}" } }
`,
  // What examples/worker.ts serves.
  hello: `
name: hello
version: 1
steps:
  - name: greet
    agent: greeter
    with: { name: "{{ input.name }}" }
`,
  // A step that waits for the signal \`approved\`; the next reads its data.
  approval: `
name: approval
version: 1
steps:
  - name: approval
    wait: approved
    timeout: 2m
  - name: echo
    agent: exec
    with: { command: ["cat"], stdin: { by: "{{ steps.approval.output.by }}" } }
`,
  // A quick step of a workflow the tests pause (no other test uses it).
  gated: `
name: gated
version: 1
steps:
  - name: pass
    agent: delay
    with: { ms: 1 }
`,
  // A step that runs a child workflow (\`parcel\`, one quick step).
  shipment: `
name: shipment
version: 1
steps:
  - name: ship
    workflow: parcel
    timeout: 1m
`,
  parcel: `
name: parcel
version: 1
steps:
  - name: book
    agent: delay
    with: { ms: 1 }
`,
  // A step that sleeps: a task to cancel, or to wait for in vain.
  nap: `
name: nap
version: 1
steps:
  - name: sleep
    agent: delay
    with: { for: "60s" }
    timeout: 2m
`,
  // A remote step whose policy fails HTTP 503 at once.
  picky: `
name: picky
version: 1
steps:
  - name: call
    agent: payments
    with: { n: 1 }
    timeout: 30s
    retry: { attempts: 3, backoff: 20ms, max_backoff: 50ms, non_retryable: [503] }
`,
  // Retryable and permanent faults.
  pay: `
name: pay
version: 1
steps:
  - name: charge
    agent: payments
    with: { card: "{{ input.card }}", flaky: "{{ input.flaky }}" }
    timeout: 30s
    retry: { attempts: 2, backoff: 20ms, max_backoff: 50ms }
`,
  // One slow step for the workers killed or stopped in the middle of it.
  slow: `
name: slow
version: 1
steps:
  - name: work
    agent: slow
    with: { sleep_ms: "{{ input.sleep_ms }}" }
    timeout: 60s
`,
  // Steps that count how many run at once.
  count: `
name: count
version: 1
steps:
  - name: hold
    agent: counted
    with: { hold_ms: "{{ input.hold_ms }}" }
    timeout: 60s
`,
};
const REMOTE_AGENTS = ["greeter", "payments", "slow", "counted"];

function rotaBin(): string {
  const path = process.env.ROTA_BIN || join(REPO_DIR, "target/debug/rota");
  try {
    accessSync(path, constants.X_OK);
  } catch {
    throw new Error(`no rota binary at ${path}: build it (cargo build -p rota) or set ROTA_BIN`);
  }
  return path;
}

/** `rota serve` on a temporary SQLite file and a free loopback port. */
export class Server {
  readonly url: string;
  private constructor(
    private readonly process: ChildProcess,
    private readonly dir: string,
    url: string,
  ) {
    this.url = url;
  }

  static async start(): Promise<Server> {
    const dir = mkdtempSync(join(tmpdir(), "rota-typescript-"));
    mkdirSync(join(dir, "workflows"));
    for (const [name, text] of Object.entries(WORKFLOWS)) writeFileSync(join(dir, "workflows", `${name}.yaml`), text);
    writeFileSync(
      join(dir, "auth.toml"),
      `[[tokens]]\nname = "admin"\ntoken = "${ADMIN_TOKEN}"\nscopes = ["admin"]\n\n` +
        `[[tokens]]\nname = "shop"\ntoken = "${SUBMIT_TOKEN}"\nscopes = ["submit"]\n\n` +
        `[[tokens]]\nname = "workers"\ntoken = "${WORKER_TOKEN}"\nscopes = ["agent:${REMOTE_AGENTS.join(",")}"]\n`,
    );
    const log = openSync(join(dir, "serve.log"), "w");
    const env: NodeJS.ProcessEnv = { ...process.env, ROTA_WORKER_KEY: WORKER_KEY, RUST_LOG: "info" };
    delete env.ROTA_API_TOKEN;
    const child = spawn(
      rotaBin(),
      ["--store", `sqlite://${join(dir, "rota.db")}`, "--durability", "normal", "serve", "--workflows", join(dir, "workflows"),
        "--listen", "127.0.0.1:0", "--auth", join(dir, "auth.toml"), "--remote-agent", REMOTE_AGENTS.join(","), "--instance-id", "typescript-tests", "--shutdown-grace", "1s"],
      { env, stdio: ["ignore", log, log] },
    );
    closeSync(log);
    const deadline = Date.now() + 30_000;
    while (Date.now() < deadline) {
      const found = /listening on (http:\/\/[0-9.:]+)/.exec(readFileSync(join(dir, "serve.log"), "utf8"));
      if (found?.[1]) return new Server(child, dir, found[1]);
      if (child.exitCode !== null) break;
      await sleep(50);
    }
    child.kill("SIGKILL");
    throw new Error(`rota serve did not start listening:\n${readFileSync(join(dir, "serve.log"), "utf8")}`);
  }

  /** Runs `rota ARGS` on the server's store; its standard output. */
  rota(args: string[]): string {
    return execFileSync(rotaBin(), ["--store", `sqlite://${join(this.dir, "rota.db")}`, ...args], { encoding: "utf8", timeout: 30_000 });
  }

  /** SIGTERM, then SIGKILL if it does not stop within 20 s. */
  async stop(): Promise<void> {
    if (this.process.exitCode === null) {
      const exited = new Promise((done) => this.process.once("exit", done));
      this.process.kill("SIGTERM");
      const timer = new AbortController();
      const late = sleep(20_000, "late", { signal: timer.signal }).catch(() => "");
      if ((await Promise.race([exited, late])) === "late") this.process.kill("SIGKILL");
      timer.abort(); // a pending timer would keep the test process alive
    }
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/** A compiled program (under dist/) as a child process, its output collected. */
export class Child {
  readonly process: ChildProcess;
  stdout = "";
  stderr = "";

  constructor(script: string, server: Server, token: string, extra: Record<string, string> = {}) {
    this.process = spawn(process.execPath, [join(DIST_DIR, script)], {
      env: { ...process.env, ROTA_URL: server.url, ROTA_TOKEN: token, ...extra },
      stdio: ["ignore", "pipe", "pipe"],
    });
    this.process.stdout?.on("data", (chunk) => (this.stdout += chunk));
    this.process.stderr?.on("data", (chunk) => (this.stderr += chunk));
  }

  /** Resolves once stderr has a line matching `pattern`. */
  async waitFor(pattern: RegExp, timeoutMs = 20_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (!pattern.test(this.stderr)) {
      if (Date.now() > deadline) throw new Error(`no line matching ${pattern} within ${timeoutMs} ms:\n${this.stderr}`);
      await sleep(20);
    }
  }

  /** Its exit code, once it exited (`null` if killed by a signal). */
  exited(timeoutMs = 30_000): Promise<number | null> {
    if (this.process.exitCode !== null || this.process.signalCode !== null) return Promise.resolve(this.process.exitCode);
    return new Promise((done, failed) => {
      const timer = setTimeout(() => failed(new Error(`still running after ${timeoutMs} ms:\n${this.stderr}`)), timeoutMs);
      this.process.once("exit", (code) => {
        clearTimeout(timer);
        done(code);
      });
    });
  }

  /** Stops it if it still runs: SIGTERM (a worker killed in a long poll would leave the server a receive that takes the next request for a lease), then SIGKILL. */
  async close(): Promise<void> {
    if (this.process.exitCode !== null || this.process.signalCode !== null) return;
    this.process.kill("SIGTERM");
    try {
      await this.exited(20_000);
    } catch {
      this.process.kill("SIGKILL");
    }
  }
}

export function fresh(prefix: string): string {
  return `${prefix}-${Math.random().toString(16).slice(2, 10)}`;
}
