//! Admissions: an admitted fan's admission revoked, so its access token
//! stops working.

use axum::extract::State;
use axum::http::StatusCode;
use boxoffice_contract::event::now_ms;
use boxoffice_contract::extract::Path;
use boxoffice_contract::keys::EventKeys;
use boxoffice_contract::Problem;

use super::problem::{check_event_id, redis_down};
use crate::state::AppState;

/// Revokes the fan's current admission: 204, or 404 when the fan holds none.
#[utoipa::path(
    delete,
    path = "/admin/v1/events/{event_id}/admissions/{fan_id}",
    security(("admin_token" = [])),
    tag = "events",
    params(
        ("event_id" = String, Path, description = "The event"),
        ("fan_id" = String, Path, description = "The admitted fan"),
    ),
    responses(
        (status = 204, description = "Revoked: the fan's access token stops working"),
        (status = 401, description = "`unauthorized`: no or wrong admin token", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "`not-admitted`", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`invalid-field`", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "`upstream-unavailable`", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(super) async fn revoke(
    State(state): State<AppState>,
    Path((event_id, fan_id)): Path<(String, String)>,
) -> Result<StatusCode, Problem> {
    check_event_id(&event_id)?;
    let keys = EventKeys::new(&state.config.redis_prefix, &event_id);
    let mut redis = state.redis.clone();
    let (expiry, held_over): (Option<f64>, Option<String>) = redis::pipe()
        .zscore(keys.active(), &fan_id)
        .get(keys.held_over(&fan_id))
        .query_async(&mut redis)
        .await
        .map_err(redis_down)?;
    let Some(expiry) = expiry.map(|e| e as i64) else {
        return Err(Problem::not_found(
            "not-admitted",
            "this fan holds no admission",
        ));
    };
    // A renewed admission (a `seats-held` answer) keeps its first jti.
    let jti = boxoffice_contract::token::admission_jti_of(
        &event_id,
        &fan_id,
        expiry,
        held_over.as_deref(),
    );
    // Long enough to outlive the token it revokes.
    let ttl = ((expiry - now_ms()) / 1000).max(1) + 60;
    let revoked: i32 = redis::Script::new(include_str!("../revoke.lua"))
        .key(keys.active())
        .key(keys.jti(&jti))
        .arg(&fan_id)
        .arg(expiry)
        .arg(ttl)
        .invoke_async(&mut redis)
        .await
        .map_err(redis_down)?;
    if revoked == 0 {
        return Err(Problem::not_found(
            "not-admitted",
            "this fan holds no admission",
        ));
    }
    tracing::info!(%event_id, %fan_id, "admission revoked");
    Ok(StatusCode::NO_CONTENT)
}
