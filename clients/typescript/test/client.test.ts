// The client against a real server: submit, wait, status, list, history,
// events, cancel, resubmit, and how errors arrive.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { after, before, describe, test } from "node:test";

import { ApiError, Client, Permanent, Worker } from "rota-client";

import { ADMIN_TOKEN, Child, DIST_DIR, SUBMIT_TOKEN, Server, WORKER_TOKEN, fresh } from "./support.js";

let server: Server;
before(async () => {
  server = await Server.start();
});
after(async () => {
  await server.stop();
});

const admin = () => new Client({ url: server.url, token: ADMIN_TOKEN });

describe("submit and wait", () => {
  test("the submit example prints the task's result", async () => {
    // The program README shows, run as it is, with a submit-only token.
    const program = new Child("examples/submit.js", server, SUBMIT_TOKEN);
    assert.equal(await program.exited(60_000), 0, program.stderr);
    assert.equal(program.stdout.trim(), 'processed {"echo":{"hello":"ada"},"wait":{"slept_ms":100}}');
  });

  test("README shows the examples as they are", () => {
    const readme = readFileSync(join(DIST_DIR, "../../../README.md"), "utf8");
    for (const program of ["submit.ts", "worker.ts"]) {
      assert.ok(readme.includes(readFileSync(join(DIST_DIR, "../examples", program), "utf8")), program);
    }
  });

  test("a delayed submit waits pending with its start time", async () => {
    const client = admin();
    const later = await client.submit("greet", { name: "ann" }, { id: fresh("d"), delay: "1h" });
    assert.equal(later.state, "pending");
    assert.ok(later.not_before >= later.created_at + 3_600_000);
    const at = await client.submit("greet", { name: "ann" }, { id: fresh("d"), startAt: "2000-01-01T00:00:00Z" });
    assert.equal((await client.wait(at.id, { timeoutMs: 30_000 })).state, "processed", "a start already past runs now");
  });

  test("a signal completes the step that waits for it", async () => {
    const client = admin();
    const id = fresh("s");
    await client.submit("approval", {}, { id });
    const delivery = await client.signal(id, "approved", { by: "ada" });
    assert.equal(delivery.step, "approval");
    const done = await client.wait(id, { timeoutMs: 30_000 });
    assert.equal(done.state, "processed");
    assert.deepEqual(done.output, { approval: { by: "ada" }, echo: { by: "ada" } });
    assert.deepEqual(done.steps.map((step) => step.waits_for), ["approved", null]);
    await assert.rejects(client.signal(id, "approved"), (err: ApiError) => err.code === "refused");
    const other = fresh("s");
    await client.submit("approval", {}, { id: other });
    await assert.rejects(client.signal(other, "rejected"), (err: ApiError) => err.code === "invalid_signal");
    await client.signal(other, "approved"); // without data: JSON null
    const approval = (await client.wait(other, { timeoutMs: 30_000 })).steps[0]!;
    assert.deepEqual([approval.state, approval.output], ["completed", null]);
  });

  test("a callback completes or fails the step whose request carried its token", async () => {
    // A remote service that accepts each request and keeps its token.
    const tokens: string[] = [];
    const service = createServer((request, response) => {
      request.resume();
      request.on("end", () => {
        tokens.push(String(request.headers["rota-callback-token"] ?? ""));
        response.writeHead(202).end();
      });
    });
    await new Promise<void>((resolve) => service.listen(0, "127.0.0.1", resolve));
    try {
      const { port } = service.address() as AddressInfo;
      const payout = {
        name: "payout",
        version: 1,
        on_exhausted: "error",
        max_failures: 1,
        steps: [{ name: "payout", agent: "http", callback: true, timeout: "5m", with: { method: "POST", url: `http://127.0.0.1:${port}/payouts` } }],
      };
      const registered = await fetch(`${server.url}/v1/workflows`, {
        method: "POST",
        headers: { authorization: `Bearer ${ADMIN_TOKEN}`, "content-type": "application/json" },
        body: JSON.stringify(payout),
      });
      assert.ok(registered.ok, await registered.text());
      const nextToken = async (count: number) => {
        const deadline = Date.now() + 30_000;
        while (tokens.length < count) {
          assert.ok(Date.now() < deadline, "the service got no request");
          await new Promise((resolve) => setTimeout(resolve, 20));
        }
        return tokens[count - 1]!;
      };

      // The service's client needs no API token: the callback token is the credential.
      const serviceClient = new Client({ url: server.url });
      const paid = fresh("cb");
      await admin().submit("payout", {}, { id: paid });
      const token = await nextToken(1);
      const accepted = await serviceClient.completeCallback(token, { payout_id: "po-1" });
      assert.deepEqual(accepted, { task_id: paid, step: "payout", attempt: 1, completed: true });
      const done = await admin().wait(paid, { timeoutMs: 30_000 });
      assert.deepEqual([done.state, done.output], ["processed", { payout: { payout_id: "po-1" } }]);
      await assert.rejects(serviceClient.completeCallback(token), (err: ApiError) => err.code === "refused");
      await assert.rejects(serviceClient.failCallback("not-a-token", "declined"), (err: ApiError) => err.code === "unknown_callback");

      const declined = fresh("cb");
      await admin().submit("payout", {}, { id: declined });
      const failed = await serviceClient.failCallback(await nextToken(2), "card declined");
      assert.equal(failed.completed, false);
      const ended = await admin().wait(declined, { timeoutMs: 30_000 });
      assert.equal(ended.state, "error");
      assert.ok(ended.error?.includes("card declined"), ended.error ?? "no error");
    } finally {
      service.close();
    }
  });

  test("a task submitted with a reply queue keeps it", async () => {
    const client = admin();
    const task = await client.submit("greet", { name: "eve" }, { id: fresh("r"), replyQueue: "ts.replies" });
    assert.equal(task.reply_queue, "ts.replies");
    assert.equal((await client.wait(task.id, { timeoutMs: 30_000 })).state, "processed");
    await assert.rejects(client.submit("greet", {}, { replyQueue: "rota.tasks" }), (err: ApiError) => {
      assert.equal(err.status, 422);
      assert.ok(err.reason.startsWith("reply_queue: "), err.reason);
      return true;
    });
  });

  test("submit is idempotent by id and wait returns the terminal task", async () => {
    const client = admin();
    const id = fresh("g");
    const task = await client.submit("greet", { name: "bob" }, { id });
    assert.deepEqual([task.id, task.workflow, task.version], [id, "greet", 1]);
    const again = await client.submit("greet", { name: "someone else" }, { id });
    assert.deepEqual(again.input, { name: "bob" }, "the id is the idempotency key");

    const done = await client.wait(id, { timeoutMs: 30_000 });
    assert.equal(done.state, "processed");
    assert.deepEqual((done.output as Record<string, unknown>).echo, { hello: "bob" });
    assert.deepEqual(done.steps.map((step) => step.state), ["completed", "completed"]);
    assert.deepEqual(await client.status(id), done);
  });

  test("tasks lists and filters", async () => {
    const client = admin();
    const finished = fresh("list-done");
    const sleeping = fresh("list-nap");
    await client.submit("greet", { name: "c" }, { id: finished });
    await client.submit("nap", undefined, { id: sleeping });
    await client.wait(finished, { timeoutMs: 30_000 });

    const processed = (await client.tasks({ state: "processed", workflow: "greet", limit: 1000 })).map((task) => task.id);
    assert.ok(processed.includes(finished));
    assert.ok(!processed.includes(sleeping));
    const naps = (await client.tasks({ workflow: "nap" })).map((task) => task.id);
    assert.ok(naps.includes(sleeping) && !naps.includes(finished));
    assert.equal((await client.tasks({ limit: 1 })).length, 1);
    await client.cancel(sleeping);
  });

  test("a parent's children are listed and counted", async () => {
    const client = admin();
    const parent = fresh("shipment");
    await client.submit("shipment", undefined, { id: parent });
    assert.equal((await client.wait(parent, { timeoutMs: 30_000 })).state, "processed");
    const children = await client.tasks({ parent });
    assert.deepEqual(children.map((task) => [task.id, task.workflow]), [[`${parent}/ship#1`, "parcel"]]);
    assert.equal((await client.taskCounts({ parent })).counts.processed, 1);
    assert.deepEqual(await client.tasks({ parent: children[0]!.id }), [], "a child without children of its own");
  });

  test("tasks are found and counted by tags, times and id prefix", async () => {
    const client = admin();
    const prefix = fresh("tagged");
    const customer = fresh("customer");
    for (const [n, region] of ["eu", "us", "eu"].entries()) {
      const task = await client.submit("nap", undefined, { id: `${prefix}-${n}`, tags: { customer, region } });
      assert.deepEqual(task.tags, { customer, region });
    }
    const both = (await client.tasks({ tags: { customer, region: "eu" } })).map((task) => task.id);
    assert.deepEqual(both, [`${prefix}-2`, `${prefix}-0`]);
    assert.deepEqual((await client.tasks({ idPrefix: `${prefix}-1` })).map((task) => task.id), [`${prefix}-1`]);
    const recent = await client.tasks({ tags: { customer }, createdAfter: "2000-01-01T00:00:00Z", limit: 2 });
    assert.equal(recent.length, 2);
    await client.cancel(`${prefix}-1`);
    const ended = (await client.tasks({ tags: { customer }, endedAfter: "2000-01-01T00:00:00Z" })).map((task) => task.id);
    assert.deepEqual(ended, [`${prefix}-1`]);
    const counts = await client.taskCounts({ tags: { customer } });
    assert.deepEqual([counts.total, counts.counts.cancelled], [3, 1]);
    assert.equal((await client.taskCounts({ idPrefix: prefix, workflow: "greet" })).total, 0);
    await assert.rejects(client.tasks({ createdAfter: "yesterday" }), (error: unknown) => {
      return error instanceof ApiError && error.status === 400 && error.code === "invalid_query";
    });
    for (const n of [0, 2]) {
      await client.cancel(`${prefix}-${n}`);
    }
  });

  test("a task keeps the priority it was submitted with", async () => {
    const client = admin();
    const urgent = await client.submit("nap", undefined, { id: fresh("urgent"), priority: 100 });
    assert.equal(urgent.priority, 100);
    assert.equal((await client.status(urgent.id)).priority, 100);
    const normal = await client.submit("nap", undefined, { id: fresh("normal") });
    assert.equal(normal.priority, 0);
    await assert.rejects(client.submit("nap", undefined, { id: fresh("too-low"), priority: -101 }), (error: unknown) => {
      return error instanceof ApiError && error.status === 422 && error.code === "invalid_body";
    });
    await client.cancel(urgent.id);
    await client.cancel(normal.id);
  });

  test("a batch cancels the tasks its filter selects", async () => {
    const client = admin();
    const customer = fresh("bulk");
    const ids = [fresh("bulk-task"), fresh("bulk-task"), fresh("bulk-task")];
    for (const id of ids) {
      await client.submit("nap", undefined, { id, tags: { customer } });
    }
    let batch = await client.createBatch("cancel", { tag: [`customer=${customer}`] }, { reason: "test" });
    assert.deepEqual([batch.total, batch.state, batch.reason], [3, "running", "test"]);
    const deadline = Date.now() + 30_000;
    while (batch.state === "running") {
      assert.ok(Date.now() < deadline, `the batch did not finish: ${JSON.stringify(batch)}`);
      await new Promise((resolve) => setTimeout(resolve, 100));
      batch = await client.batch(batch.id);
    }
    assert.deepEqual([batch.state, batch.done, batch.failed], ["done", 3, 0]);
    for (const id of ids) {
      assert.equal((await client.status(id)).state, "cancelled");
    }
    assert.equal((await client.stopBatch(batch.id, { reason: "done by hand" })).state, "done");
    await assert.rejects(client.stopBatch(batch.id, { reason: "x".repeat(1001) }), (error: unknown) => {
      return error instanceof ApiError && error.status === 422 && error.code === "invalid_body";
    });
    await assert.rejects(client.createBatch("cancel", {}), (error: unknown) => error instanceof ApiError && error.status === 422);
    // The batch is in the audit log, and so are the cancels it made.
    const created = await client.audit({ action: "batch.create", limit: 100 });
    assert.ok(created.some((entry) => entry.target === batch.id), JSON.stringify(created));
    const cancels = new Set((await client.audit({ action: "task.cancel", limit: 1000 })).map((entry) => entry.target));
    assert.ok(ids.every((id) => cancels.has(id)), JSON.stringify([...cancels]));
    const [first] = await client.audit({ limit: 1 });
    assert.ok(first);
    const [next] = await client.audit({ limit: 1, after: first.cursor });
    assert.ok(next);
    assert.notEqual(next.cursor, first.cursor);
    await assert.rejects(client.audit({ action: "task.explode" }), (error: unknown) => error instanceof ApiError && error.status === 400);
  });

  test("a redrive batch sends back the dead letters its filter selects", async () => {
    const client = admin();
    const queue = fresh("ts.dlq");
    server.rota(["queue", "send", queue, "--body", '{"n":1}']);
    server.rota(["queue", "send", queue, "--body", '{"n":2}']);
    for (const delivery of JSON.parse(server.rota(["queue", "receive", queue, "--max", "10", "--json"])) as { body: { n: number }; lease_token: string }[]) {
      server.rota(["queue", "dead-letter", queue, delivery.lease_token, "--reason", delivery.body.n === 1 ? "agent timeout" : "HTTP 400"]);
    }
    let batch = await client.createBatch("redrive", {}, { deadLetters: { queue, reason_contains: "timeout" }, reason: "fixed" });
    assert.deepEqual([batch.action, batch.total, batch.dead_letters?.queue], ["redrive", 1, queue]);
    const deadline = Date.now() + 30_000;
    while (batch.state === "running") {
      assert.ok(Date.now() < deadline, `the batch did not finish: ${JSON.stringify(batch)}`);
      await sleep(100);
      batch = await client.batch(batch.id);
    }
    assert.deepEqual([batch.state, batch.done, batch.skipped], ["done", 1, 0]);
    const back = JSON.parse(server.rota(["queue", "receive", queue, "--max", "10", "--json"])) as { body: { n: number } }[];
    assert.deepEqual(back.map((delivery) => delivery.body.n), [1], "only the timed-out one went back");
    await assert.rejects(
      client.createBatch("redrive"),
      (error: unknown) => error instanceof ApiError && error.status === 422 && error.reason.startsWith("dead_letters"),
    );
  });

  test("tasks page with before", async () => {
    const client = admin();
    const ids = [fresh("page"), fresh("page"), fresh("page")];
    for (const id of ids) {
      await client.submit("nap", undefined, { id });
    }
    const page = (await client.tasks({ workflow: "nap", before: ids[2], limit: 2 })).map((task) => task.id);
    assert.deepEqual(page, [ids[1], ids[0]]);
    for (const id of ids) {
      await client.cancel(id);
    }
  });

  test("events follow a task until it ends and resume after a seq", async () => {
    const client = admin();
    const id = fresh("ev");
    await client.submit("greet", { name: "dee" }, { id });
    const events = [];
    for await (const event of client.events(id)) events.push(event);
    const kinds = events.map((event) => event.kind);
    assert.equal(kinds[0], "received");
    assert.equal(kinds.at(-1), "processed");
    assert.ok(kinds.includes("step_completed"));
    assert.deepEqual(events, await client.history(id));

    const resumed = [];
    for await (const event of client.events(id, { after: events[1]!.seq })) resumed.push(event);
    assert.deepEqual(resumed, events.slice(2));
  });

  test("wait gives up after its timeout; a cancelled task ends", async () => {
    const client = admin();
    const id = fresh("nap");
    await client.submit("nap", undefined, { id });
    const started = Date.now();
    await assert.rejects(client.wait(id, { timeoutMs: 1_000 }), { name: "TimeoutError" });
    assert.ok(Date.now() - started < 10_000);
    assert.equal(await client.cancel(id), "cancelled");
    assert.equal((await client.wait(id, { timeoutMs: 30_000 })).state, "cancelled");
  });

  test("a paused task says so until resumed", async () => {
    const client = admin();
    const id = fresh("paused");
    await client.submit("nap", undefined, { id });
    const paused = await client.pause(id, { reason: "maintenance" });
    assert.equal(paused.paused, true);
    await assert.rejects(client.pause(id), { status: 409, code: "refused" });
    assert.equal((await client.status(id)).paused, true);
    const resumed = await client.resume(id);
    assert.equal(resumed.paused, false);
    await assert.rejects(client.resume(id), { status: 409, code: "refused" });
    const history = await client.history(id);
    const kinds = history.map((event) => event.kind).filter((kind) => kind === "paused" || kind === "resumed");
    assert.deepEqual(kinds, ["paused", "resumed"]);
    assert.deepEqual(history.find((event) => event.kind === "paused")!.detail, { by: "api token with scope admin (admin)", reason: "maintenance" });
    await assert.rejects(client.pause("no-such-task"), { status: 404, code: "not_found" });
    assert.equal(await client.cancel(id, { reason: "not needed" }), "cancelled");
    const cancelled = (await client.history(id)).find((event) => event.kind === "cancelled")!;
    assert.deepEqual(cancelled.detail, { compensate: false, by: "api token with scope admin (admin)", reason: "not needed" });
  });

  test("a paused workflow's tasks wait until it is resumed", async () => {
    const client = admin();
    const id = fresh("gated");
    try {
      const paused = await client.pauseWorkflow("gated", { reason: "maintenance" });
      assert.deepEqual(
        [paused.workflow, paused.paused, paused.by, paused.reason],
        ["gated", true, "api token with scope admin (admin)", "maintenance"],
      );
      const listed = (await client.workflows()).find((workflow) => workflow.name === "gated")!;
      assert.equal(listed.paused, true);
      assert.deepEqual(listed.pause, paused);
      await assert.rejects(client.pauseWorkflow("gated"), { status: 409, code: "refused" });
      await client.submit("gated", undefined, { id });
      await sleep(500);
      const waiting = await client.status(id);
      assert.deepEqual([waiting.state, waiting.workflow_paused], ["pending", true]);
    } finally {
      const resumed = await client.resumeWorkflow("gated");
      assert.equal(resumed.paused, false);
    }
    assert.equal((await client.wait(id, { timeoutMs: 30_000 })).state, "processed");
    await assert.rejects(client.pauseWorkflow("no-such-workflow"), { status: 404, code: "unknown_workflow" });
  });

  test("a task in error runs again when resubmitted", async () => {
    const client = admin();
    let declined = true;
    const worker = new Worker({ url: server.url, token: WORKER_TOKEN, waitMs: 500, log: () => {} });
    worker.step<{ card: string }>("payments", (step) => {
      if (declined) throw new Permanent("card declined");
      return { charged: step.input.card };
    });
    const running = worker.run({ handleSignals: false });
    try {
      const id = fresh("resubmit");
      await client.submit("pay", { card: "ok", flaky: false }, { id });
      const failed = await client.wait(id, { timeoutMs: 30_000 });
      assert.equal(failed.state, "error");
      assert.match(failed.steps[0]!.last_error ?? "", /card declined/);
      await assert.rejects(client.cancel(id), { status: 409, code: "refused" });

      declined = false;
      assert.ok(["pending", "processing"].includes(await client.resubmit(id, undefined, { reason: "the card works now" })));
      const done = await client.wait(id, { timeoutMs: 30_000 });
      assert.deepEqual([done.state, done.output], ["processed", { charge: { charged: "ok" } }]);
      const detail = (await client.history(id)).find((event) => event.kind === "resubmitted")!.detail as { by: string; reason: string };
      assert.deepEqual([detail.by, detail.reason], ["api token with scope admin (admin)", "the card works now"]);
      await assert.rejects(client.resubmit(id, "charge"), { code: "refused" });
    } finally {
      worker.stop();
      await running;
    }
  });

  test("a step runs again on a new input", async () => {
    const client = admin();
    const worker = new Worker({ url: server.url, token: WORKER_TOKEN, waitMs: 500, log: () => {} });
    worker.step<{ card: string }>("payments", (step) => {
      if (step.input.card === "expired") throw new Permanent("card expired");
      return { charged: step.input.card };
    });
    const running = worker.run({ handleSignals: false });
    try {
      const id = fresh("new-input");
      await client.submit("pay", { card: "expired", flaky: false }, { id });
      assert.equal((await client.wait(id, { timeoutMs: 30_000 })).state, "error");
      await assert.rejects(client.resubmit(id, undefined, { input: { card: "new" } }), TypeError);

      const renewed = { card: "renewed", flaky: false };
      assert.ok(["pending", "processing"].includes(await client.resubmit(id, "charge", { input: renewed, reason: "renewed card" })));
      const done = await client.wait(id, { timeoutMs: 30_000 });
      assert.deepEqual([done.state, done.input, done.output], ["processed", renewed, { charge: { charged: "renewed" } }]);
      const resubmitted = (await client.history(id)).filter((event) => event.kind === "resubmitted");
      assert.equal(resubmitted.length, 1);
      assert.deepEqual((resubmitted[0]!.detail as { input: unknown }).input, { old: { card: "expired", flaky: false }, new: renewed });
      assert.equal((resubmitted[0]!.detail as { reason: string }).reason, "renewed card");
      await assert.rejects(client.resubmit(id, "charge", { input: { card: "again" } }), { code: "refused" });
      assert.deepEqual((await client.status(id)).input, renewed);
    } finally {
      worker.stop();
      await running;
    }
  });
});

describe("errors", () => {
  test("every error is an ApiError with the server's code and reason", async () => {
    const client = admin();
    const cases: [() => Promise<unknown>, number, string, string][] = [
      [() => client.status("no-such-task"), 404, "not_found", "no-such-task"],
      [() => client.submit("no-such-workflow"), 404, "unknown_workflow", "no-such-workflow"],
      [() => client.tasks({ state: "bogus" as never }), 400, "invalid_query", "state"],
      [() => client.tasks({ limit: 0 }), 400, "invalid_query", "limit"],
      [() => client.tasks({ before: "no-such-task" }), 400, "invalid_query", "before"],
      [() => new Client({ url: server.url, token: "not-a-token-of-this-server" }).tasks(), 401, "unauthorized", ""],
      // A submit token lists its own tasks, but may not cancel.
      [() => new Client({ url: server.url, token: SUBMIT_TOKEN }).cancel("no-such-task"), 403, "forbidden", ""],
    ];
    for (const [call, status, code, named] of cases) {
      const error = await call().then(
        () => assert.fail(`${code}: no error`),
        (error: unknown) => error,
      );
      assert.ok(error instanceof ApiError, String(error));
      assert.deepEqual([error.status, error.code], [status, code], error.message);
      assert.ok(error.reason.includes(named), error.reason);
    }
  });

  test("an answer that is not the API's error shape keeps its status", () => {
    const error = ApiError.fromAnswer(502, "<html>Bad Gateway</html>");
    assert.deepEqual([error.status, error.code, error.reason], [502, "http_502", "<html>Bad Gateway</html>"]);
  });

  test("an unreachable server is fetch's TypeError", async () => {
    await assert.rejects(new Client({ url: "http://127.0.0.1:9", timeoutMs: 5_000 }).status("x"), TypeError);
  });
});
