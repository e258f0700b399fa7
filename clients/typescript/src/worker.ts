/**
 * The worker helper: serve agent queues over rota's worker protocol, as the
 * Python client's `Worker` does.
 *
 * `worker.step("agent", fn)` registers the function that runs the steps
 * workflows send to that (remote) agent. For each step request the worker
 * keeps the lease while `fn` runs, renewing it in the background (each
 * renewal measured from the `lease_until` the server answers, which never
 * passes the step's deadline); retries a `Retryable` fault (or any other
 * error) with the request's retry policy inside the deadline, then fails the
 * attempt as retryable; fails a `Permanent` fault at once; completes the
 * step with what `fn` returns (any JSON value). Past the deadline, once
 * the lease is lost (409 `lease_lost`, 410 `deadline_passed`), or once the
 * task was cancelled (410 `task_finished`, answered to the next renewal; the
 * task's history says the call was stopped), it sends nothing and aborts
 * `step.signal`: `fn` runs on, its result ignored.
 *
 * At most `concurrency` steps of each agent run at once. `run()` serves
 * until SIGTERM or SIGINT (or `stop()`): it asks for no more requests, lets
 * the receive in progress end (within `waitMs`; what it brings is worked on
 * too), finishes the steps in hand, and resolves. A second signal exits at
 * once. The receive is not cut short on purpose: the server leases what a
 * long poll finds even after its caller hung up, and nobody would answer
 * that request before its lease ran out.
 */

import { setTimeout as sleep } from "node:timers/promises";
import { hostname } from "node:os";

import { Api, type ClientOptions, type WorkRequest, unwrap } from "./client.js";
import { ApiError } from "./errors.js";

/** A fault that may go away: retried within the attempt, then reported as retryable. */
export class Retryable extends Error {
  override name = "Retryable";
  /**
   * What the fault was, in the words of a step's `retry.non_retryable`: an HTTP status (`"503"`) or a kind
   * (`"timeout"`, `"connection"`). When the step's policy lists it, the step fails at once instead of being retried.
   */
  readonly failureClass: string | undefined;
  constructor(message?: string, options: { failureClass?: string } = {}) {
    super(message);
    this.failureClass = options.failureClass;
  }
}

/** A fault that will not go away: reported at once; the task ends in `error` or compensates. */
export class Permanent extends Error {
  override name = "Permanent";
}

/** One step request being worked on: what a step function gets. */
export class Step<Input = Record<string, any>> {
  private readonly controller = new AbortController();

  constructor(readonly request: WorkRequest) {}

  /** The task. */
  get taskId(): string {
    return this.request.task_id;
  }
  /** The workflow and its version, `name@version`. */
  get workflow(): string {
    return this.request.workflow;
  }
  /** The step's name in the workflow. */
  get name(): string {
    return this.request.step;
  }
  /** The attempt (1-based); a new one after a failure or a timeout. */
  get attempt(): number {
    return this.request.attempt;
  }
  /** Whether this is the step's compensating action. */
  get compensate(): boolean {
    return this.request.compensate;
  }
  /** The step's input, its templates resolved. */
  get input(): Input {
    return this.request.input as Input;
  }
  /** The same for every delivery and attempt of the step: pass it on. */
  get idempotencyKey(): string {
    return this.request.idempotency_key;
  }
  /** How many times this request was delivered, this time included. */
  get deliveryCount(): number {
    return this.request.delivery_count;
  }
  /** The deadline, in ms since the epoch. */
  get completeBy(): number {
    return this.request.complete_by;
  }
  /** Milliseconds left before the deadline (0 once it has passed). */
  remainingMs(): number {
    return Math.max(0, this.request.complete_by - Date.now());
  }
  /** Aborted when the worker gives up on this request: pass it to what `fn` awaits. */
  get signal(): AbortSignal {
    return this.controller.signal;
  }
  /** @internal */
  abandon(): void {
    this.controller.abort();
  }
  toString(): string {
    return `${this.taskId}/${this.name}${this.compensate ? " (compensate)" : ""} attempt ${this.attempt}`;
  }
}

/** What a step function does: returns the step's output, or throws. */
export type StepFunction<Input = Record<string, any>> = (step: Step<Input>) => unknown;

export interface WorkerOptions extends ClientOptions {
  /** Steps of each agent at once (default 4). */
  concurrency?: number;
  /** The lease to hold, asked for at once after each receive and at every renewal (default: the server's). */
  leaseMs?: number;
  /** How long one receive waits for requests (default 5 s): also the longest a stop waits before the steps in hand. */
  waitMs?: number;
  /** Recorded as the owner of the leases (default `<host>-<pid>`). */
  name?: string;
  /** Where the worker says what it does (default: stderr). */
  log?: (line: string) => void;
}

/** Answers of `receive` that no retry will change: the worker stops and `run()` rejects with them. */
const FATAL_STATUSES = new Set([400, 401, 403, 404, 422]);
/** How much longer than its long-poll wait a receive may take on the wire. */
const RECEIVE_SLACK_MS = 10_000;

type Outcome =
  | { kind: "complete"; output: unknown }
  | { kind: "fail"; message: string; retryable: boolean; failureClass?: string }
  | { kind: "silent" };

/** A counting semaphore whose waiters are released (with `false`) on stop. */
class Slots {
  private waiters: ((got: boolean) => void)[] = [];
  constructor(private free: number) {}
  tryAcquire(): boolean {
    if (this.free === 0) return false;
    this.free -= 1;
    return true;
  }
  acquire(): Promise<boolean> {
    if (this.tryAcquire()) return Promise.resolve(true);
    return new Promise((resolve) => this.waiters.push(resolve));
  }
  release(): void {
    const next = this.waiters.shift();
    if (next) next(true);
    else this.free += 1;
  }
  wakeAll(): void {
    for (const waiter of this.waiters.splice(0)) waiter(false);
  }
}

interface Agent {
  name: string;
  fn: StepFunction<any>;
  concurrency: number;
  slots: Slots;
}

/** The wait after `tries` failed tries, in ms: exponential, capped, equal jitter. */
export function backoffMs(retry: WorkRequest["retry"], tries: number): number {
  const base = Math.min(retry.backoff_initial_ms * 2 ** (tries - 1), retry.backoff_max_ms);
  return base / 2 + (Math.random() * base) / 2;
}

/** Runs the steps of remote agents (see the module's documentation). */
export class Worker {
  readonly name: string;
  private readonly api: Api;
  private readonly options: Required<Pick<WorkerOptions, "concurrency" | "waitMs">> & WorkerOptions;
  private readonly agents = new Map<string, Agent>();
  private readonly inHand = new Set<Promise<void>>();
  private stopping = false;
  private fatal: ApiError | undefined;
  private readonly log: (line: string) => void;

  constructor(options: WorkerOptions = {}) {
    const concurrency = options.concurrency ?? 4;
    if (!(concurrency >= 1)) throw new RangeError(`concurrency must be at least 1, got ${concurrency}`);
    if (options.leaseMs !== undefined && options.leaseMs < 100) throw new RangeError(`leaseMs must be at least 100, got ${options.leaseMs}`);
    this.options = { ...options, concurrency, waitMs: options.waitMs ?? 5_000 };
    this.api = new Api(options);
    this.name = options.name ?? `${hostname().replace(/[^A-Za-z0-9._:-]/g, "-").slice(0, 80) || "worker"}-${process.pid}`;
    this.log = options.log ?? ((line) => process.stderr.write(`${line}\n`));
  }

  /** Registers the function that runs the steps of `agent`. */
  step<Input = Record<string, any>>(agent: string, fn: StepFunction<Input>, options: { concurrency?: number } = {}): this {
    if (this.agents.has(agent)) throw new Error(`agent ${agent} already has a function`);
    const concurrency = options.concurrency ?? this.options.concurrency;
    if (!(concurrency >= 1)) throw new RangeError(`concurrency must be at least 1, got ${concurrency}`);
    this.agents.set(agent, { name: agent, fn, concurrency, slots: new Slots(concurrency) });
    return this;
  }

  /** Stops asking for requests; `run()` resolves once the steps in hand are answered (or abandoned). */
  stop(): void {
    this.stopping = true;
    for (const agent of this.agents.values()) agent.slots.wakeAll();
  }

  /**
   * Serves every registered agent until `stop()`, SIGTERM or SIGINT (signals
   * handled unless `handleSignals` is false). Rejects with the `ApiError`
   * when the server refuses to serve an agent to this worker.
   */
  async run(options: { handleSignals?: boolean } = {}): Promise<void> {
    if (this.agents.size === 0) throw new Error("no agent: register a function with worker.step(AGENT, fn) first");
    const graceful = (signal: NodeJS.Signals) => {
      this.log(`${signal}: finishing the steps in hand, then stopping`);
      // A second signal finds no handler and ends the process at once.
      process.removeListener("SIGTERM", graceful);
      process.removeListener("SIGINT", graceful);
      this.stop();
    };
    if (options.handleSignals ?? true) {
      process.on("SIGTERM", graceful);
      process.on("SIGINT", graceful);
    }
    this.log(`serving ${[...this.agents.keys()].join(", ")} at ${this.api.url} as ${this.name}`);
    try {
      await Promise.all([...this.agents.values()].map((agent) => this.serve(agent)));
      while (this.inHand.size > 0) await Promise.all(this.inHand);
    } finally {
      process.removeListener("SIGTERM", graceful);
      process.removeListener("SIGINT", graceful);
    }
    this.log("stopped");
    if (this.fatal) throw this.fatal;
  }

  private async serve(agent: Agent): Promise<void> {
    let failures = 0;
    while (!this.stopping) {
      if (!(await agent.slots.acquire())) break;
      if (this.stopping) {
        agent.slots.release();
        break;
      }
      let taken = 1;
      while (taken < agent.concurrency && agent.slots.tryAcquire()) taken += 1;
      let requests: WorkRequest[] = [];
      try {
        const answer = await this.api.fetch.POST("/v1/workers/{agent}/receive", {
          params: { path: { agent: agent.name } },
          body: { max: taken, wait_ms: this.options.waitMs, worker: this.name },
          signal: this.api.deadline(this.options.waitMs + RECEIVE_SLACK_MS),
        });
        requests = unwrap(answer).requests;
        failures = 0;
      } catch (error) {
        if (error instanceof ApiError && FATAL_STATUSES.has(error.status)) {
          this.log(`receive of ${agent.name} refused: ${error.message}`);
          this.fatal = error;
          this.stop();
        } else {
          failures += 1;
          this.log(`receive of ${agent.name} failed (${String(error)}); trying again`);
        }
      }
      for (let i = requests.length; i < taken; i += 1) agent.slots.release();
      for (const request of requests) this.start(agent, request);
      if (failures > 0) await sleep(Math.min(100 * 2 ** failures, 5_000));
    }
  }

  private start(agent: Agent, request: WorkRequest): void {
    const done: Promise<void> = this.work(agent, new Step(request))
      .catch((error) => this.log(`${request.task_id}/${request.step}: the worker failed (${String(error)}); the lease runs out`))
      .finally(() => {
        agent.slots.release();
        this.inHand.delete(done);
      });
    this.inHand.add(done);
  }

  /** Runs one request with its lease renewed, then answers it (or not). */
  private async work(agent: Agent, step: Step<any>): Promise<void> {
    this.log(`${step}: started (delivery ${step.deliveryCount})`);
    let outcome: Outcome | undefined;
    const running = attempt(agent.fn, step, this.log).then((result) => {
      outcome = result;
    });
    let leaseUntil = step.request.lease_until;
    let renewAt = this.options.leaseMs !== undefined ? Date.now() : renewalDue(leaseUntil);
    for (;;) {
      const wake = new AbortController();
      await Promise.race([running, sleep(Math.max(0, Math.min(renewAt, step.completeBy) - Date.now()), undefined, { signal: wake.signal }).catch(() => {})]);
      wake.abort();
      if (outcome) break;
      if (Date.now() >= step.completeBy) {
        step.abandon();
        this.log(`${step}: deadline passed; no reply`);
        return;
      }
      if (Date.now() < renewAt) continue;
      try {
        const body = { lease_token: step.request.lease_token, lease_ms: this.options.leaseMs };
        const answer = await this.api.fetch.POST("/v1/workers/{agent}/renew", { params: { path: { agent: agent.name } }, body, signal: this.api.deadline() });
        leaseUntil = unwrap(answer).lease_until;
        renewAt = renewalDue(leaseUntil);
      } catch (error) {
        if (error instanceof ApiError) {
          // 409 lease_lost: the request is someone else's now; 410
          // deadline_passed or task_finished (a cancel): rota dropped it.
          // Either way: drop the work.
          step.abandon();
          this.log(`${step}: renewal refused (${error.code}); work dropped`);
          return;
        }
        this.log(`${step}: renewal failed (${String(error)}); trying again`);
        renewAt = Date.now() + Math.min(500, Math.max(50, (leaseUntil - Date.now()) / 3));
      }
    }
    await this.answer(agent, step, outcome);
  }

  private async answer(agent: Agent, step: Step<any>, outcome: Outcome): Promise<void> {
    if (outcome.kind === "silent" || step.remainingMs() <= 0) {
      step.abandon();
      this.log(`${step}: deadline passed; no reply`);
      return;
    }
    const token = step.request.lease_token;
    const path = { agent: agent.name };
    for (let tries = 1; ; tries += 1) {
      try {
        if (outcome.kind === "complete") {
          // The document types `output` as an object; any JSON value is accepted.
          const body = { lease_token: token, output: outcome.output as Record<string, never> };
          unwrap(await this.api.fetch.POST("/v1/workers/{agent}/complete", { params: { path }, body, signal: this.api.deadline() }));
          this.log(`${step}: succeeded`);
        } else {
          const body = { lease_token: token, message: outcome.message, retryable: outcome.retryable, class: outcome.failureClass ?? null };
          unwrap(await this.api.fetch.POST("/v1/workers/{agent}/fail", { params: { path }, body, signal: this.api.deadline() }));
          this.log(`${step}: failed (${outcome.retryable ? "retryable" : "permanent"}): ${outcome.message}`);
        }
        return;
      } catch (error) {
        if (error instanceof ApiError) {
          step.abandon();
          this.log(`${step}: reply refused (${error.code}); work dropped`);
          return;
        }
        // It may or may not have arrived: sending it again is safe (a second
        // answer is refused as lease_lost).
        const wait = Math.min(100 * 2 ** tries, 2_000);
        if (step.remainingMs() <= wait) {
          this.log(`${step}: reply failed (${String(error)}); deadline passed`);
          return;
        }
        this.log(`${step}: reply failed (${String(error)}); trying again`);
        await sleep(wait);
      }
    }
  }
}

/** When to renew a lease that runs to `leaseUntil`: once two thirds of what is left of it have passed. */
function renewalDue(leaseUntil: number): number {
  return Date.now() + Math.max(50, (leaseUntil - Date.now()) / 3);
}

/** Runs the function, retrying faults with the request's policy inside the deadline. */
async function attempt(fn: StepFunction<any>, step: Step<any>, log: (line: string) => void): Promise<Outcome> {
  const retry = step.request.retry;
  for (let tries = 1; ; tries += 1) {
    if (step.remainingMs() <= 0 || step.signal.aborted) return { kind: "silent" };
    let output: unknown;
    try {
      output = await fn(step);
    } catch (error) {
      if (error instanceof Permanent) return { kind: "fail", message: error.message || "permanent failure", retryable: false };
      const message = error instanceof Retryable ? error.message : error instanceof Error ? `${error.name}: ${error.message}` : String(error);
      if (step.remainingMs() <= 0 || step.signal.aborted) return { kind: "silent" };
      const failureClass = error instanceof Retryable ? error.failureClass : undefined;
      // The step's policy says this fault will not pass: no more tries here, and rota fails the step at once.
      if (failureClass !== undefined && (retry.non_retryable ?? []).includes(failureClass)) {
        return { kind: "fail", message, retryable: true, failureClass };
      }
      if (tries >= Math.max(1, retry.attempts_max)) return { kind: "fail", message, retryable: true, failureClass };
      const wait = backoffMs(retry, tries);
      if (wait >= step.remainingMs()) return { kind: "silent" };
      log(`${step}: try ${tries} failed (${message}); again in ${(wait / 1000).toFixed(2)}s`);
      await sleep(wait, undefined, { signal: step.signal }).catch(() => {});
      continue;
    }
    try {
      JSON.stringify(output);
    } catch (error) {
      return { kind: "fail", message: `the output is not JSON: ${String(error)}`, retryable: false };
    }
    return { kind: "complete", output: output === undefined ? null : output };
  }
}
