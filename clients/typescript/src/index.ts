/**
 * A client for rota's HTTP API, and a helper to write workers in TypeScript.
 *
 * `Client` submits, reads, waits for, follows, cancels, resubmits, pauses, resumes and signals tasks;
 * `Worker` runs the steps of remote agents (`worker.step("agent", fn)`).
 * Every error the API answers is an `ApiError` with its `code` and `reason`.
 * The types come from the server's `/openapi.json` (`schema.ts`, generated);
 * `client.api.fetch` reaches every other route, typed.
 */

export { Api, Client, DEFAULT_URL, TERMINAL_STATES, unwrap } from "./client.js";
export type {
  Batch,
  BatchFilter,
  CallbackAccepted,
  ClientOptions,
  DeadLetterFilter,
  Event,
  SignalDelivery,
  Task,
  TaskCounts,
  TaskFilter,
  TaskState,
  TaskSummary,
  Workflow,
  WorkflowPause,
  WorkRequest,
} from "./client.js";
export { ApiError } from "./errors.js";
export type { components, paths } from "./schema.js";
export { Permanent, Retryable, Step, Worker, backoffMs } from "./worker.js";
export type { StepFunction, WorkerOptions } from "./worker.js";
