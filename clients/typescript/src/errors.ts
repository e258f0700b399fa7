/** The one error type for answers of the API that are errors. */

/**
 * The API answered with an error: `{"error": {"code", "reason"}}`.
 *
 * `code` is stable and meant for programs (`not_found`, `refused`,
 * `lease_lost`…; see the server's docs/api.md); `reason` is for people. An
 * answer that is not in that shape (a proxy's error page) gets the code
 * `http_<status>` and its text as the reason. Network failures are not API
 * errors: they stay fetch's `TypeError`.
 */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    readonly reason: string,
  ) {
    super(`${status} ${code}: ${reason}`);
    this.name = "ApiError";
  }

  /** The error carried by an answer's body, whatever its shape. */
  static fromAnswer(status: number, body: unknown): ApiError {
    let parsed = body;
    if (typeof body === "string") {
      try {
        parsed = JSON.parse(body);
      } catch {
        return new ApiError(status, `http_${status}`, body.trim());
      }
    }
    const error = (parsed as { error?: { code?: unknown; reason?: unknown } } | null)?.error;
    if (typeof error?.code === "string" && typeof error.reason === "string") {
      return new ApiError(status, error.code, error.reason);
    }
    return new ApiError(status, `http_${status}`, typeof body === "string" ? body : JSON.stringify(body));
  }
}
