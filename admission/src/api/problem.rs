//! What every admin resource answers when a request is wrong or the store
//! is down: the `invalid-field` problem, the check of an event id in a path,
//! and the mapping of a Redis error to `upstream-unavailable`. The rules of a
//! resource's own fields stay with its body (the event settings' rules are
//! in `events`).

use axum::http::StatusCode;
use boxoffice_contract::keys::valid_event_id;
use boxoffice_contract::Problem;

pub(crate) fn invalid(field: &str, rule: &str) -> Problem {
    Problem::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid-field",
        format!("{field}: {rule}"),
    )
}

pub(crate) fn redis_down(error: redis::RedisError) -> Problem {
    tracing::error!(%error, "redis error");
    Problem::unavailable(
        "upstream-unavailable",
        "the waiting-room store is unavailable",
        1,
    )
}

/// 422 unless the path's event id can live in a key and a URL.
pub(crate) fn check_event_id(event_id: &str) -> Result<(), Problem> {
    if valid_event_id(event_id) {
        Ok(())
    } else {
        Err(invalid(
            "event_id",
            "1-64 characters of A-Z, a-z, 0-9, '-' and '_'",
        ))
    }
}
