// The worker helper against a real server: the README's worker, retryable
// and permanent faults, lease renewal, the bound on steps at once, and
// workers killed (SIGKILL) or stopped (SIGTERM) in the middle of a step.
import assert from "node:assert/strict";
import { setTimeout as sleep } from "node:timers/promises";
import { after, before, describe, test } from "node:test";

import { ApiError, Client, Permanent, Retryable, Worker } from "rota-client";

import { ADMIN_TOKEN, Child, Server, SUBMIT_TOKEN, WORKER_TOKEN, fresh } from "./support.js";

let server: Server;
before(async () => {
  server = await Server.start();
});
after(async () => {
  await server.stop();
});

const admin = () => new Client({ url: server.url, token: ADMIN_TOKEN });
const quiet = () => {};

/** Runs the worker in this process while `body` runs, then stops it. */
async function running<T>(worker: Worker, body: () => Promise<T>): Promise<T> {
  const served = worker.run({ handleSignals: false });
  try {
    return await body();
  } finally {
    worker.stop();
    await served;
  }
}

describe("the example", () => {
  test("the worker example serves its agent and stops on SIGTERM", async () => {
    // The program README shows, run as it is, with a worker token.
    const worker = new Child("examples/worker.js", server, WORKER_TOKEN);
    try {
      const id = fresh("hello");
      await admin().submit("hello", { name: "ada" }, { id });
      const done = await admin().wait(id, { timeoutMs: 30_000 });
      assert.equal(done.state, "processed", worker.stderr);
      assert.deepEqual(done.output, { greet: { greeting: "hello, ada" } });

      // Idle in a long poll, it stops when the poll ends (5 s at most).
      const started = Date.now();
      worker.process.kill("SIGTERM");
      assert.equal(await worker.exited(20_000), 0, worker.stderr);
      assert.ok(Date.now() - started < 10_000);
    } finally {
      await worker.close();
    }
  });
});

describe("faults", () => {
  test("retryable faults are retried and permanent ones fail the task", async () => {
    const tries = new Map<string, number>();
    const worker = new Worker({ url: server.url, token: WORKER_TOKEN, waitMs: 500, log: quiet });
    worker.step<{ card: string; flaky: boolean }>("payments", (step) => {
      tries.set(step.taskId, (tries.get(step.taskId) ?? 0) + 1);
      if (step.input.card === "declined") throw new Permanent("card declined");
      if (step.input.card === "buggy" && step.attempt === 1) throw new TypeError("a bug counts as retryable");
      if (step.input.flaky && step.attempt === 1) throw new Retryable("payment gateway timed out");
      return { attempt: step.attempt, key: step.idempotencyKey };
    });
    const client = admin();
    const [flaky, declined, buggy] = [fresh("flaky"), fresh("declined"), fresh("buggy")];
    const [done, failed, fixed] = await running(worker, async () => {
      await client.submit("pay", { card: "ok", flaky: true }, { id: flaky });
      await client.submit("pay", { card: "declined", flaky: false }, { id: declined });
      await client.submit("pay", { card: "buggy", flaky: false }, { id: buggy });
      return Promise.all([flaky, declined, buggy].map((id) => client.wait(id, { timeoutMs: 60_000 })));
    });

    // Attempt 1 used its two tries and was reported retryable; rota sent attempt 2.
    assert.equal(done!.state, "processed");
    assert.deepEqual((done!.output as Record<string, unknown>).charge, { attempt: 2, key: `${flaky}/charge` });
    assert.equal(tries.get(flaky), 3);
    const stepFailed = (await client.history(flaky)).filter((event) => event.kind === "step_failed");
    assert.equal(stepFailed.length, 1);
    const detail = stepFailed[0]!.detail as { retryable: boolean; error: string };
    assert.equal(detail.retryable, true);
    assert.match(detail.error, /payment gateway timed out/);

    assert.equal(failed!.state, "error");
    assert.equal(tries.get(declined), 1, "a permanent fault is not retried");
    assert.match(failed!.steps[0]!.last_error ?? "", /card declined/);

    assert.equal(fixed!.state, "processed");
    assert.match(JSON.stringify(await client.history(buggy)), /TypeError/);
  });

  test("a worker whose token may not serve the agent stops with the error", async () => {
    const worker = new Worker({ url: server.url, token: SUBMIT_TOKEN, waitMs: 500, log: quiet });
    worker.step("payments", () => null);
    await assert.rejects(worker.run({ handleSignals: false }), (error: unknown) => error instanceof ApiError && error.code === "forbidden");
  });
});

describe("non_retryable", () => {
  test("a fault of a class the policy lists fails the step at once", async () => {
    let tries = 0;
    const worker = new Worker({ url: server.url, token: WORKER_TOKEN, waitMs: 500, log: quiet });
    worker.step("payments", () => {
      tries += 1;
      throw new Retryable("503 from upstream", { failureClass: "503" });
    });
    const id = fresh("picky");
    const failed = await running(worker, async () => {
      await admin().submit("picky", undefined, { id });
      return admin().wait(id, { timeoutMs: 60_000 });
    });
    assert.equal(failed.state, "error");
    assert.equal(tries, 1, "one try: the policy lists 503");
    assert.equal(failed.steps[0]!.last_error, "503 from upstream; not retried: HTTP status 503 is listed in retry.non_retryable");
  });
});

describe("leases", () => {
  test("the lease is renewed while a step outlives it", async () => {
    const worker = new Worker({ url: server.url, token: WORKER_TOKEN, waitMs: 500, leaseMs: 600, log: quiet });
    worker.step<{ sleep_ms: number }>("slow", async (step) => {
      await sleep(step.input.sleep_ms);
      return { delivery_count: step.deliveryCount };
    });
    const id = fresh("renewed");
    const done = await running(worker, async () => {
      await admin().submit("slow", { sleep_ms: 2_500 }, { id });
      return admin().wait(id, { timeoutMs: 60_000 });
    });
    assert.deepEqual(done.output, { work: { delivery_count: 1 } }, "delivered once: the lease was kept");
  });

  test("a step of a cancelled task is abandoned at its next renewal", async () => {
    const worker = new Worker({ url: server.url, token: WORKER_TOKEN, waitMs: 500, leaseMs: 600, log: quiet });
    let started!: () => void;
    const running_ = new Promise<void>((resolve) => (started = resolve));
    let abandoned = false;
    worker.step<{ sleep_ms: number }>("slow", async (step) => {
      started();
      await sleep(step.input.sleep_ms, undefined, { signal: step.signal }).catch(() => {
        abandoned = true;
      });
      return { finished: true };
    });
    const id = fresh("cancelled");
    await running(worker, async () => {
      await admin().submit("slow", { sleep_ms: 30_000 }, { id });
      await running_;
      assert.equal(await admin().cancel(id), "cancelled");
      const since = Date.now();
      while (!abandoned && Date.now() - since < 20_000) await sleep(20);
    });
    assert.ok(abandoned, "the renewal told the worker to stop");
    const stopped = (await admin().history(id)).filter((event) => event.kind === "call_stopped");
    assert.deepEqual(
      stopped.map((event) => [event.step, (event.detail as { agent: string }).agent]),
      [["work", "slow"]],
    );
    assert.equal((await admin().status(id)).state, "cancelled");
  });

  test("no more steps run at once than the concurrency", async () => {
    let now = 0;
    let most = 0;
    const worker = new Worker({ url: server.url, token: WORKER_TOKEN, waitMs: 500, concurrency: 2, log: quiet });
    worker.step<{ hold_ms: number }>("counted", async (step) => {
      now += 1;
      most = Math.max(most, now);
      await sleep(step.input.hold_ms);
      now -= 1;
      return null;
    });
    const ids = Array.from({ length: 6 }, () => fresh("count"));
    const states = await running(worker, async () => {
      for (const id of ids) await admin().submit("count", { hold_ms: 400 }, { id });
      return Promise.all(ids.map(async (id) => (await admin().wait(id, { timeoutMs: 60_000 })).state));
    });
    assert.deepEqual(states, Array(6).fill("processed"));
    assert.equal(most, 2);
  });

  test("a step of a killed worker is delivered again after its lease", async () => {
    const first = new Child("test/slow_worker.js", server, WORKER_TOKEN, { LEASE_MS: "1500" });
    const id = fresh("killed");
    await admin().submit("slow", { sleep_ms: 30_000 }, { id });
    await first.waitFor(new RegExp(`${id}/work attempt 1: started \\(delivery 1\\)`));
    await sleep(500); // past the first renewal, which set the 1.5 s lease
    first.process.kill("SIGKILL");
    await first.exited();
    const killedAt = Date.now();

    const second = new Child("test/slow_worker.js", server, WORKER_TOKEN, { LEASE_MS: "1500" });
    try {
      const done = await admin().wait(id, { timeoutMs: 60_000 });
      const output = (done.output as Record<string, { attempt: number; delivery_count: number; pid: number }>).work!;
      assert.equal(done.state, "processed", second.stderr);
      // The same attempt, delivered a second time, to the other worker.
      assert.deepEqual([output.attempt, output.delivery_count, output.pid], [1, 2, second.process.pid]);
      // Far sooner than the server's own 30 s lease: the worker's held.
      assert.ok(Date.now() - killedAt < 15_000);
    } finally {
      await second.close();
    }
  });

  test("SIGTERM lets the step in hand finish and takes no new one", async () => {
    const worker = new Child("test/slow_worker.js", server, WORKER_TOKEN, { LEASE_MS: "1500" });
    const inHand = fresh("in-hand");
    const later = fresh("later");
    try {
      await admin().submit("slow", { sleep_ms: 3_000 }, { id: inHand });
      await worker.waitFor(new RegExp(`${inHand}/work attempt 1: started`));
      worker.process.kill("SIGTERM");
      await worker.waitFor(/SIGTERM: finishing the steps in hand/);
      await admin().submit("slow", { sleep_ms: 0 }, { id: later });
      assert.equal(await worker.exited(30_000), 0, worker.stderr);
    } finally {
      await worker.close();
    }
    const log = worker.stderr;
    const done = await admin().status(inHand);
    assert.equal(done.state, "processed", log);
    assert.deepEqual(done.output, { work: { pid: worker.process.pid, delivery_count: 1, attempt: 1 } });
    assert.ok(log.indexOf(`${inHand}/work attempt 1: succeeded`) < log.indexOf("stopped"), log);
    assert.ok(!log.includes(later), "a stopping worker takes no new step");
    await admin().cancel(later);
  });

  test("SIGTERM twice exits at once", async () => {
    const worker = new Child("test/slow_worker.js", server, WORKER_TOKEN, { LEASE_MS: "1500" });
    const id = fresh("twice");
    try {
      await admin().submit("slow", { sleep_ms: 30_000 }, { id });
      await worker.waitFor(new RegExp(`${id}/work attempt 1: started`));
      await sleep(500); // past the first renewal, which set the 1.5 s lease
      worker.process.kill("SIGTERM");
      await worker.waitFor(/SIGTERM: finishing the steps in hand/);
      worker.process.kill("SIGTERM");
      await worker.exited(5_000);
      assert.equal(worker.process.signalCode, "SIGTERM", worker.stderr);
    } finally {
      await worker.close();
    }
    // Its step goes to the next worker after the lease.
    const again = new Child("test/slow_worker.js", server, WORKER_TOKEN, { LEASE_MS: "1500" });
    try {
      const done = await admin().wait(id, { timeoutMs: 60_000 });
      assert.equal((done.output as Record<string, { delivery_count: number }>).work!.delivery_count, 2, again.stderr);
    } finally {
      await again.close();
    }
  });
});
