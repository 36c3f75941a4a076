//! What the OpenAPI 3.1 documents of the gateway and the admission service
//! share: the bearer security schemes, the problem document, the
//! `/openapi.json`, `/healthz` and `/metrics` operations. Each service builds
//! its document from its routes (utoipa-axum's `routes!`), so a route cannot
//! be served undocumented, and serves it at `/openapi.json`.

use std::sync::{Arc, OnceLock};

use axum::Extension;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::OpenApi;
use utoipa::Modify;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// The bearer tokens of the public API, by the name operations refer to.
pub struct FanSecurity;

impl Modify for FanSecurity {
    fn modify(&self, openapi: &mut OpenApi) {
        add_bearer(
            openapi,
            "queue_ticket",
            "JWT",
            "The queue ticket `POST /v1/events/{event_id}/queue` answered (HS256, audience = the event).",
        );
        add_bearer(
            openapi,
            "access_token",
            "JWT",
            "The access token an admitted fan gets from the status call (EdDSA, short-lived, one purchase; verify with /.well-known/jwks.json).",
        );
        add_bearer(
            openapi,
            "order_token",
            "JWT",
            "The order token a purchase answered (EdDSA); reads that one order. The access token that bought the order reads it too.",
        );
    }
}

/// The admin API's bearer token.
pub struct AdminSecurity;

impl Modify for AdminSecurity {
    fn modify(&self, openapi: &mut OpenApi) {
        add_bearer(
            openapi,
            "admin_token",
            "opaque",
            "The shared admin secret, BOXOFFICE_ADMIN_TOKEN.",
        );
    }
}

fn add_bearer(openapi: &mut OpenApi, name: &str, format: &str, description: &str) {
    openapi
        .components
        .get_or_insert_with(Default::default)
        .add_security_scheme(
            name,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format(format)
                    .description(Some(description))
                    .build(),
            ),
        );
}

/// Where [`finish`] puts the document for `/openapi.json` to serve.
type DocumentCell = Arc<OnceLock<OpenApi>>;

/// Adds `/openapi.json` to a service's routes and splits them into the axum
/// router and the document, which that route then serves. Only that route
/// carries the document, so no other request pays for it.
pub fn finish<S: Clone + Send + Sync + 'static>(
    router: OpenApiRouter<S>,
) -> (axum::Router<S>, OpenApi) {
    let cell = DocumentCell::default();
    let document = OpenApiRouter::new()
        .routes(routes!(openapi_json))
        .layer(Extension(cell.clone()));
    let (routes, doc) = router.merge(document).split_for_parts();
    let _ = cell.set(doc.clone());
    (routes, doc)
}

/// This service's OpenAPI 3.1 document.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "meta",
    responses((status = 200, description = "This OpenAPI 3.1 document", content_type = "application/json"))
)]
async fn openapi_json(Extension(cell): Extension<DocumentCell>) -> axum::response::Response {
    use axum::response::IntoResponse;
    match cell.get() {
        Some(doc) => axum::Json(doc).into_response(),
        None => crate::Problem::unavailable("not-ready", "the document is being built", 1)
            .into_response(),
    }
}

/// Liveness: the process answers.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "meta",
    responses((status = 200, description = "The process is alive", body = String, content_type = "text/plain"))
)]
pub async fn healthz() -> &'static str {
    "ok"
}

/// Prometheus text exposition of this process's metrics.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "meta",
    responses((status = 200, description = "Prometheus text format 0.0.4", body = String, content_type = "text/plain"))
)]
pub async fn metrics() -> impl axum::response::IntoResponse {
    crate::telemetry::metrics_endpoint().await
}
