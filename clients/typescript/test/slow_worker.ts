// A worker of the agent `slow` for the tests that kill or stop one: the
// first delivery of a step sleeps `input.sleep_ms`, later ones do not.
// LEASE_MS is the lease it holds. One step at a time, so that while it works
// it has no long poll open that a SIGKILL would leave behind on the server.
import { setTimeout as sleep } from "node:timers/promises";
import { Worker } from "rota-client";

const worker = new Worker({ leaseMs: Number(process.env.LEASE_MS), concurrency: 1 });
worker.step<{ sleep_ms: number }>("slow", async (step) => {
  if (step.deliveryCount === 1) await sleep(step.input.sleep_ms);
  return { pid: process.pid, delivery_count: step.deliveryCount, attempt: step.attempt };
});
await worker.run();
