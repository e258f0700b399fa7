/** The client: submit tasks, read them, wait for them, follow their events, cancel, resubmit, pause and resume them. */

import createClient, { type Client as FetchClient } from "openapi-fetch";
import { setTimeout as sleep } from "node:timers/promises";

import { ApiError } from "./errors.js";
import type { components, paths } from "./schema.js";
import { messages } from "./sse.js";

/** A task with its input, output and steps. */
export type Task = components["schemas"]["TaskView"];
/** A task as listings show it. */
export type TaskSummary = components["schemas"]["TaskSummary"];
/** One operator action, as `GET /v1/audit` lists it. */
export type AuditEntry = components["schemas"]["AuditEntryView"];
/** A bulk action and how far it got. */
export type Batch = components["schemas"]["BatchView"];
/** Which tasks a batch acts on: the filters of `tasks`. */
export type BatchFilter = components["schemas"]["BatchFilterView"];
/** Which dead letters of a queue a `redrive` batch sends back. */
export type DeadLetterFilter = components["schemas"]["DeadLetterFilterView"];
/** Exact task counts by state, and their total. */
export type TaskCounts = components["schemas"]["TaskCounts"];

/** The search filters that `tasks` and `taskCounts` share. */
export interface TaskFilter {
  workflow?: string;
  /** Tasks having every one of these tags. */
  tags?: Record<string, string>;
  createdAfter?: string;
  createdBefore?: string;
  endedAfter?: string;
  endedBefore?: string;
  idPrefix?: string;
  /** The children of this task: the tasks its `workflow:` steps started. */
  parent?: string;
}

/** A filter as query parameters: one `tag=key=value` per tag. */
function searchQuery(filter: TaskFilter) {
  return {
    workflow: filter.workflow,
    tag: filter.tags === undefined ? undefined : Object.entries(filter.tags).map(([key, value]) => `${key}=${value}`),
    created_after: filter.createdAfter,
    created_before: filter.createdBefore,
    ended_after: filter.endedAfter,
    ended_before: filter.endedBefore,
    id_prefix: filter.idPrefix,
    parent: filter.parent,
  };
}
/** `pending`, `processing`, `processed`, `error`, `compensating`, `compensated`, `cancelled`. */
export type TaskState = components["schemas"]["TaskStateView"];
/** One entry of a task's history: a server-sent event's data, a webhook's body. */
export type Event = components["schemas"]["EventView"];
/** One attempt of one step, as a worker receives it. */
export type WorkRequest = components["schemas"]["WorkRequest"];
/** What a signal did: the step it went to, and whether it completed it now or is kept until the task gets there. */
export type SignalDelivery = components["schemas"]["SignalDelivery"];
/** What a callback did: the step and attempt its token named, and whether it completed the step. */
export type CallbackAccepted = components["schemas"]["CallbackAccepted"];
/** The latest version of a registered workflow, and whether it is paused. */
export type Workflow = components["schemas"]["WorkflowView"];
/** An operator's pause or resume of a workflow: who, why and when. */
export type WorkflowPause = components["schemas"]["WorkflowPauseView"];

/** The server when neither the `url` option nor `ROTA_URL` names one. */
export const DEFAULT_URL = "http://127.0.0.1:7878";

/** The states a task does not leave by itself (`error` may be resubmitted). */
export const TERMINAL_STATES: readonly TaskState[] = ["processed", "error", "compensated", "cancelled"];

export interface ClientOptions {
  /** The server's base URL; default `ROTA_URL`, else `http://127.0.0.1:7878`. */
  url?: string;
  /** The bearer token; default `ROTA_TOKEN`. */
  token?: string;
  /** How long one request may take, in ms (default 30 s). */
  timeoutMs?: number;
}

/** The typed openapi-fetch client of every route, and how to reach the server. */
export class Api {
  readonly url: string;
  /** Every route of `/openapi.json`, typed (openapi-fetch). */
  readonly fetch: FetchClient<paths>;
  readonly timeoutMs: number;

  constructor(options: ClientOptions = {}) {
    this.url = (options.url || process.env.ROTA_URL || DEFAULT_URL).replace(/\/+$/, "");
    const token = options.token ?? process.env.ROTA_TOKEN;
    this.timeoutMs = options.timeoutMs ?? 30_000;
    this.fetch = createClient<paths>({
      baseUrl: this.url,
      headers: token ? { Authorization: `Bearer ${token}` } : {},
    });
  }

  /** A signal that aborts a request after `ms` (default: the client's timeout). */
  deadline(ms = this.timeoutMs): AbortSignal {
    return AbortSignal.timeout(ms);
  }
}

/** The data of an openapi-fetch answer, or its error as an `ApiError`. */
export function unwrap<T>(answer: { data?: T; error?: unknown; response: Response }): T {
  if (!answer.response.ok || answer.error !== undefined) {
    throw ApiError.fromAnswer(answer.response.status, answer.error);
  }
  return answer.data as T;
}

/**
 * rota's HTTP API for programs that submit and follow tasks. Errors the API
 * answers throw `ApiError`; an unreachable server throws fetch's `TypeError`.
 */
export class Client {
  readonly api: Api;

  constructor(options: ClientOptions = {}) {
    this.api = new Api(options);
  }

  /**
   * Submits a task of `workflow` (its latest version unless `version` says).
   * `id` is the idempotency key: submitting an id that exists creates nothing
   * and returns that task, so a submit whose answer was lost can be sent again.
   * `priority` (-100 to 100; the workflow's `priority:`, or 0, when absent):
   * Schedulers claim higher priorities first, then in submission order, and
   * one claimed task in eight is the oldest waiting whatever its priority.
   */
  async submit(
    workflow: string,
    input?: unknown,
    options: {
      id?: string;
      version?: number;
      callbackUrl?: string;
      replyQueue?: string;
      startAt?: string;
      delay?: string;
      tags?: Record<string, string>;
      priority?: number;
    } = {},
  ): Promise<Task> {
    const body = {
      workflow,
      input,
      id: options.id,
      version: options.version,
      callback_url: options.callbackUrl,
      reply_queue: options.replyQueue,
      start_at: options.startAt,
      delay: options.delay,
      tags: options.tags,
      priority: options.priority,
    };
    return unwrap(await this.api.fetch.POST("/v1/tasks", { body, signal: this.api.deadline() }));
  }

  /** The task with its input, output and steps. */
  async status(id: string): Promise<Task> {
    return unwrap(await this.api.fetch.GET("/v1/tasks/{id}", { params: { path: { id } }, signal: this.api.deadline() }));
  }

  /** The task's events so far, oldest first. */
  async history(id: string): Promise<Event[]> {
    return unwrap(await this.api.fetch.GET("/v1/tasks/{id}/history", { params: { path: { id } }, signal: this.api.deadline() }));
  }

  /**
   * Tasks, newest first, that match every filter given: state, workflow,
   * holder, every one of `tags`, creation and end times (RFC 3339; `…After`
   * inclusive, `…Before` exclusive; an end time selects finished tasks), id
   * prefix and `parent` (its children). `before` pages: the tasks created before that task (pass a
   * page's last id).
   */
  async tasks(filter: TaskFilter & { state?: TaskState; lockedBy?: string; before?: string; limit?: number } = {}): Promise<TaskSummary[]> {
    const query = {
      ...searchQuery(filter),
      state: filter.state,
      locked_by: filter.lockedBy,
      before: filter.before,
      limit: filter.limit,
    };
    return unwrap(await this.api.fetch.GET("/v1/tasks", { params: { query }, signal: this.api.deadline() }));
  }

  /** Exact counts, by state, of the tasks matching the filters (as `tasks` takes them). */
  async taskCounts(filter: TaskFilter = {}): Promise<TaskCounts> {
    return unwrap(await this.api.fetch.GET("/v1/tasks/counts", { params: { query: searchQuery(filter) }, signal: this.api.deadline() }));
  }

  /**
   * Starts a bulk action: `cancel` or `resubmit` every task `filter`
   * selects (at least one filter; a resubmit without `state` selects the
   * tasks in Error), or `redrive` every dead letter `options.deadLetters`
   * selects (its `queue` is required; `filter` stays empty). The server's
   * Supervisor leader runs it; follow it with `batch`.
   */
  async createBatch(
    action: "cancel" | "resubmit" | "redrive",
    filter: BatchFilter = {},
    options: { reason?: string; deadLetters?: DeadLetterFilter } = {},
  ): Promise<Batch> {
    const body = { action, filter, dead_letters: options.deadLetters, reason: options.reason };
    return unwrap(await this.api.fetch.POST("/v1/batches", { body, signal: this.api.deadline() }));
  }

  /** A batch and how far it got. */
  async batch(id: string): Promise<Batch> {
    return unwrap(await this.api.fetch.GET("/v1/batches/{id}", { params: { path: { id } }, signal: this.api.deadline() }));
  }

  /**
   * Operator actions, newest first, with who did them and why: `since` an
   * RFC 3339 time, `action` one name (`task.cancel`, `dlq.redrive`…), `by`
   * exactly one name; `after` the `cursor` of the last entry of the
   * previous page.
   */
  async audit(filter: { since?: string; action?: string; by?: string; after?: string; limit?: number } = {}): Promise<AuditEntry[]> {
    return unwrap(await this.api.fetch.GET("/v1/audit", { params: { query: filter }, signal: this.api.deadline() }));
  }

  /** Stops a batch: the tasks it has not reached are left as they are. `reason` is kept in the audit log with who stopped it. */
  async stopBatch(id: string, options: { reason?: string } = {}): Promise<Batch> {
    const answer = await this.api.fetch.POST("/v1/batches/{id}/stop", {
      params: { path: { id } },
      body: { reason: options.reason ?? null },
      signal: this.api.deadline(),
    });
    return unwrap(answer);
  }

  /**
   * Waits until the task is terminal and returns it. Follows its event
   * stream, so it returns as soon as the task ends; throws an `Error` named
   * `TimeoutError` after `timeoutMs`.
   */
  async wait(id: string, options: { timeoutMs?: number } = {}): Promise<Task> {
    const signal = options.timeoutMs === undefined ? undefined : AbortSignal.timeout(options.timeoutMs);
    try {
      for await (const _ of this.events(id, { signal })) {
        // Only the end of the stream matters.
      }
    } catch (error) {
      if (signal?.aborted) {
        throw Object.assign(new Error(`task ${id} did not end within ${options.timeoutMs} ms`), { name: "TimeoutError" });
      }
      throw error;
    }
    return this.status(id);
  }

  /**
   * The task's events: its history (after the event `after`, if given), then
   * each one as it happens, until the task is terminal. A dropped stream is
   * opened again from the last event seen; `signal` stops it.
   */
  async *events(id: string, options: { after?: number; signal?: AbortSignal } = {}): AsyncGenerator<Event> {
    let after = options.after;
    for (;;) {
      const answer = await this.api.fetch.GET("/v1/tasks/{id}/events", {
        params: { path: { id }, query: after === undefined ? {} : { after } },
        headers: { Accept: "text/event-stream" },
        parseAs: "stream",
        signal: options.signal,
      });
      const body = unwrap(answer) as unknown as ReadableStream<Uint8Array> | null;
      try {
        if (body) {
          for await (const message of messages(body)) {
            if (message.event === "end") return;
            if (message.event === "message") {
              const event = JSON.parse(message.data) as Event;
              after = event.seq;
              yield event;
            }
          }
        }
      } catch (error) {
        // A dropped stream is opened again below; an abort is the caller's.
        if (options.signal?.aborted) throw error;
      }
      // The server closes streams when it stops; do not spin while it restarts.
      await sleep(200, undefined, { signal: options.signal });
    }
  }

  /** Cancels a task that has not finished; returns the state it moved to. `reason` is kept in its history with who cancelled it. */
  async cancel(id: string, options: { reason?: string } = {}): Promise<TaskState> {
    const answer = await this.api.fetch.POST("/v1/tasks/{id}/cancel", {
      params: { path: { id } },
      body: { reason: options.reason ?? null },
      signal: this.api.deadline(),
    });
    return unwrap(answer).state;
  }

  /**
   * Pauses a task that has not finished: it starts no new step until resumed (steps in flight finish). `reason` is
   * kept in its history with who paused it. Returns the task (`paused: true`).
   */
  async pause(id: string, options: { reason?: string } = {}): Promise<Task> {
    const answer = await this.api.fetch.POST("/v1/tasks/{id}/pause", {
      params: { path: { id } },
      body: { reason: options.reason ?? null },
      signal: this.api.deadline(),
    });
    return unwrap(answer);
  }

  /** Resumes a paused task; `reason` is kept in its history. Returns the task (`paused: false`). */
  async resume(id: string, options: { reason?: string } = {}): Promise<Task> {
    const answer = await this.api.fetch.POST("/v1/tasks/{id}/resume", {
      params: { path: { id } },
      body: { reason: options.reason ?? null },
      signal: this.api.deadline(),
    });
    return unwrap(answer);
  }

  /** The latest version of every registered workflow, sorted by name, each saying whether it is paused. */
  async workflows(): Promise<Workflow[]> {
    return unwrap(await this.api.fetch.GET("/v1/workflows", { signal: this.api.deadline() }));
  }

  /**
   * Pauses a workflow (every version): no Scheduler claims its tasks until it is resumed, so new ones wait `pending`;
   * tasks already running go on. `reason` is kept with who paused it. `ApiError` `refused` when it is paused already,
   * `unknown_workflow` when it is not registered.
   */
  async pauseWorkflow(name: string, options: { reason?: string } = {}): Promise<WorkflowPause> {
    const answer = await this.api.fetch.POST("/v1/workflows/{name}/pause", {
      params: { path: { name } },
      body: { reason: options.reason ?? null },
      signal: this.api.deadline(),
    });
    return unwrap(answer);
  }

  /** Resumes a paused workflow: its waiting tasks are claimed again. `ApiError` `refused` when it is not paused. */
  async resumeWorkflow(name: string, options: { reason?: string } = {}): Promise<WorkflowPause> {
    const answer = await this.api.fetch.POST("/v1/workflows/{name}/resume", {
      params: { path: { name } },
      body: { reason: options.reason ?? null },
      signal: this.api.deadline(),
    });
    return unwrap(answer);
  }

  /**
   * Sends the signal `name` with `data` (JSON; `null` for none) to a task: it completes the step that waits for it
   * (`wait: name`), now or when the task gets there, and `data` becomes that step's output.
   */
  async signal(id: string, name: string, data: unknown = null): Promise<SignalDelivery> {
    const answer = await this.api.fetch.POST("/v1/tasks/{id}/signals/{name}", {
      params: { path: { id, name } },
      body: data as never,
      signal: this.api.deadline(),
    });
    return unwrap(answer);
  }

  /**
   * Completes the attempt of a callback step (`callback: true`) that
   * `token` names, with `output` as the step's output: what the remote
   * service that got the step's request does when its work is done. The
   * token is the request's `Rota-Callback-Token` header (or
   * `{{ callback.token }}` in its input) and is the credential: no API
   * token is needed. An `ApiError` `unknown_callback` for a token that
   * names no waiting step, `refused` when its attempt is over or the
   * token was used; either way nothing changed.
   */
  async completeCallback(token: string, output: unknown = null): Promise<CallbackAccepted> {
    return this.callback(token, { output });
  }

  /**
   * Fails the attempt `token` names (see `completeCallback`): for good
   * unless `retryable`, in which case the step is tried again as a new
   * attempt with a new token, counted against the task's `max_failures`.
   */
  async failCallback(token: string, error: string, options: { retryable?: boolean } = {}): Promise<CallbackAccepted> {
    return this.callback(token, { error, retryable: options.retryable ?? false });
  }

  private async callback(token: string, body: { output?: unknown; error?: string; retryable?: boolean }): Promise<CallbackAccepted> {
    const answer = await this.api.fetch.POST("/v1/callbacks/{token}", {
      params: { path: { token } },
      body: body as never,
      signal: this.api.deadline(),
    });
    return unwrap(answer);
  }

  /**
   * Runs a task that ended in `error` again (its failed steps, or just `step`); returns its new state.
   * With `options.input` (which needs `step`), the task's input is replaced first, and `step` and every
   * step that depends on it run again on it; the history records the old and the new input. `options.reason` is kept
   * in its history with who asked.
   */
  async resubmit(id: string, step?: string, options: { input?: unknown; reason?: string } = {}): Promise<TaskState> {
    const { input } = options;
    const reason = options.reason ?? null;
    if (input !== undefined && step === undefined) {
      throw new TypeError("a new input needs the step to resubmit from");
    }
    const signal = this.api.deadline();
    const answer =
      step === undefined
        ? await this.api.fetch.POST("/v1/tasks/{id}/resubmit", { params: { path: { id } }, body: { reason }, signal })
        : await this.api.fetch.POST("/v1/tasks/{id}/steps/{step}/resubmit", {
            params: { path: { id, step } },
            body: input === undefined ? { reason } : { input, reason },
            signal,
          });
    return unwrap(answer).state;
  }
}
