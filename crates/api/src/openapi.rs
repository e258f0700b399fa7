//! The `/v1` routes, registered together with their OpenAPI operations, so
//! that the document at `/openapi.json` lists exactly the routes served.
//!
//! The answers that every route can give are stated here once rather than
//! on each handler: 401 and 403 (every `/v1` route but the callbacks is
//! behind the token check), and 503 on the routes that read the store
//! before answering.

use utoipa::openapi::path::{Operation, PathItem};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::{Content, OpenApi as Document, Ref, RefOr, Response, ResponseBuilder};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::{ApiState, audit, batches, callbacks, events, queues, schedules, status, tasks, workers, workflows};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "rota",
        description = "Durable task orchestration (Scheduler Agent Supervisor over competing-consumer queues). \
            Errors are `{\"error\": {\"code\", \"reason\"}}`; times are milliseconds since the Unix epoch.",
        license(name = "Apache-2.0", identifier = "Apache-2.0")
    ),
    components(schemas(crate::error::ErrorBody)),
    modifiers(&BearerAuth),
    tags(
        (name = "tasks", description = "Submit, inspect, cancel, resubmit, pause and resume tasks; alerts"),
        (name = "batches", description = "Bulk actions: cancel or resubmit every task a filter selects, as a durable batch"),
        (name = "audit", description = "Every operator action, with who did it and why"),
        (name = "events", description = "Live task events (server-sent events)"),
        (name = "workflows", description = "The workflow registry"),
        (name = "schedules", description = "Cron schedules that start tasks: list with next fire times, create, pause, resume, trigger, delete"),
        (name = "queues", description = "Queue counts, pause and resume; circuit breakers"),
        (name = "dead letters", description = "Dead-lettered messages"),
        (name = "status", description = "The running processes, the Supervisors' leader, and recent activity per minute"),
        (name = "callbacks", description = "Remote services complete callback steps with the step's one-time token (no bearer token)"),
        (name = "workers", description = "The worker protocol: external agents receive step requests with a lease, renew it, and complete or fail them"),
    )
)]
struct ApiDoc;

/// Declares the bearer-token security scheme that the operations name.
struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        let mut bearer = Http::new(HttpAuthScheme::Bearer);
        bearer.description = Some("A token configured with its scopes (admin, operator, read, submit, agent)".into());
        components.add_security_scheme("bearer", SecurityScheme::Http(bearer));
    }
}

/// The `/v1` routes that take no bearer token, with their documentation:
/// each carries its own credential.
pub(crate) fn public_routes() -> OpenApiRouter<ApiState> {
    let mut public = OpenApiRouter::new().routes(routes!(callbacks::callback));
    add_response(public.get_openapi_mut(), "503", "Store unavailable");
    public
}

/// Every `/v1` route behind the token check, with its documentation.
pub(crate) fn routes() -> OpenApiRouter<ApiState> {
    let mut from_the_store = OpenApiRouter::new()
        .routes(routes!(tasks::submit))
        .routes(routes!(tasks::list))
        .routes(routes!(tasks::counts))
        .routes(routes!(tasks::get))
        .routes(routes!(tasks::history))
        .routes(routes!(tasks::cancel))
        .routes(routes!(tasks::pause_task))
        .routes(routes!(tasks::resume_task))
        .routes(routes!(tasks::signal))
        .routes(routes!(tasks::resubmit))
        .routes(routes!(tasks::resubmit_step))
        .routes(routes!(tasks::alerts))
        .routes(routes!(batches::list, batches::create))
        .routes(routes!(batches::get))
        .routes(routes!(batches::stop))
        .routes(routes!(audit::list))
        .routes(routes!(events::task_events))
        .routes(routes!(workflows::list))
        .routes(routes!(workflows::register))
        .routes(routes!(workflows::latest))
        .routes(routes!(workflows::version))
        .routes(routes!(workflows::pause))
        .routes(routes!(workflows::resume))
        .routes(routes!(schedules::list, schedules::create))
        .routes(routes!(schedules::get, schedules::delete))
        .routes(routes!(schedules::pause))
        .routes(routes!(schedules::resume))
        .routes(routes!(schedules::trigger))
        .routes(routes!(queues::list))
        .routes(routes!(queues::get))
        .routes(routes!(queues::pause))
        .routes(routes!(queues::resume))
        .routes(routes!(queues::dead_letters))
        .routes(routes!(queues::redrive_all))
        .routes(routes!(queues::redrive_one))
        .routes(routes!(queues::purge))
        .routes(routes!(queues::breakers))
        .routes(routes!(status::instances))
        .routes(routes!(status::activity))
        .routes(routes!(workers::receive))
        .routes(routes!(workers::renew))
        .routes(routes!(workers::complete))
        .routes(routes!(workers::fail));
    add_response(from_the_store.get_openapi_mut(), "503", "Store unavailable");
    // A definition is validated in memory, and the event stream answers
    // before its first read of the store.
    let without_the_store = OpenApiRouter::new().routes(routes!(workflows::validate)).routes(routes!(events::all_events));
    let mut all = OpenApiRouter::with_openapi(ApiDoc::openapi()).merge(from_the_store).merge(without_the_store);
    add_response(all.get_openapi_mut(), "401", "No valid token");
    // Unless the route says more precisely what its scope must name.
    add_response(all.get_openapi_mut(), "403", "Out of scope");
    all
}

/// Documents the error answer `status` on every operation of `document`
/// that does not document that status itself.
fn add_response(document: &mut Document, status: &str, description: &str) {
    let error: RefOr<Response> = ResponseBuilder::new()
        .description(description)
        .content("application/json", Content::new(Some(Ref::from_schema_name("ErrorBody"))))
        .into();
    for item in document.paths.paths.values_mut() {
        for operation in operations(item) {
            operation.responses.responses.entry(status.to_owned()).or_insert_with(|| error.clone());
        }
    }
}

fn operations(item: &mut PathItem) -> impl Iterator<Item = &mut Operation> {
    [&mut item.get, &mut item.put, &mut item.post, &mut item.delete, &mut item.options, &mut item.head, &mut item.patch, &mut item.trace]
        .into_iter()
        .filter_map(Option::as_mut)
}
