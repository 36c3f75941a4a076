//! Extractors whose rejections are problem documents, so malformed input gets
//! the same `application/problem+json` 4xx as every other error.

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use crate::Problem;

/// `axum::Json` with problem-document rejections: 400 unparseable, 415 not
/// JSON, 413 too large, 422 well-formed but the wrong shape.
#[derive(Debug, Clone, Copy, Default)]
pub struct Json<T>(pub T);

impl<T, S> FromRequest<S> for Json<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = Problem;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(value)) => Ok(Self(value)),
            Err(rejection) => Err(json_problem(&rejection)),
        }
    }
}

fn json_problem(rejection: &JsonRejection) -> Problem {
    match rejection {
        JsonRejection::MissingJsonContentType(_) => Problem::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported-media-type",
            "send the body as Content-Type: application/json",
        ),
        JsonRejection::JsonDataError(e) => Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid-body",
            e.body_text(),
        ),
        JsonRejection::JsonSyntaxError(e) => Problem::bad_request(e.body_text()),
        other if other.status() == StatusCode::PAYLOAD_TOO_LARGE => Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload-too-large",
            "the request body is too large",
        ),
        other => Problem::bad_request(other.body_text()),
    }
}

/// `axum::extract::Path` with a 400 problem document when a segment does not parse.
#[derive(Debug, Clone, Copy, Default)]
pub struct Path<T>(pub T);

impl<T, S> FromRequestParts<S> for Path<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(value)) => Ok(Self(value)),
            Err(rejection) => Err(path_problem(&rejection)),
        }
    }
}

fn path_problem(rejection: &PathRejection) -> Problem {
    Problem::bad_request(format!("bad path parameter: {}", rejection.body_text()))
}
