//! Extractors whose rejections are problem documents, so malformed input gets
//! the same `application/problem+json` 4xx as every other error.

use axum::body::Bytes;
use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
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
        if !plain_json(req.headers()) {
            return match axum::Json::<T>::from_request(req, state).await {
                Ok(axum::Json(value)) => Ok(Self(value)),
                Err(rejection) => Err(json_problem(&rejection)),
            };
        }
        // The usual body: parsed by `serde_json` alone, without axum's
        // parse of the content type as a MIME type and its path kept at
        // every step for the message of an error that mostly never comes
        // (about 1,200 instructions of a join's 73,000, in callgrind, built
        // with cargo's default release profile). A body it refuses is parsed
        // again axum's way, for the same message.
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|rejection| json_problem(&rejection.into()))?;
        match serde_json::from_slice(&bytes) {
            Ok(value) => Ok(Self(value)),
            Err(_) => match axum::Json::<T>::from_bytes(&bytes) {
                Ok(axum::Json(value)) => Ok(Self(value)),
                Err(rejection) => Err(json_problem(&rejection)),
            },
        }
    }
}

/// `Content-Type: application/json` and nothing more (in any case), as
/// every client of ours sends it; any other JSON type or parameters go
/// axum's way, whose parse decides.
fn plain_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"application/json"))
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

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Deserialize)]
    struct Sent {
        fan_id: String,
        #[serde(default)]
        count: Option<u32>,
    }

    async fn extract(content_type: &str, body: &'static str) -> Result<Sent, Problem> {
        let request = Request::builder()
            .method("POST")
            .header("content-type", content_type)
            .body(Body::from(body))
            .unwrap();
        Json::<Sent>::from_request(request, &())
            .await
            .map(|Json(value)| value)
    }

    /// A body sent as plain `application/json` (parsed by `serde_json`
    /// alone) is read as axum's way reads it (the same type with a
    /// parameter goes that way): the same value, or the same problem.
    #[tokio::test]
    async fn a_plain_json_body_is_read_as_axum_reads_it() {
        for body in [
            r#"{"fan_id":"f-1"}"#,
            r#" {"fan_id":"f-1","count":3} "#,
            r#"{"fan_id":"f-1","count":-3}"#,
            r#"{"fan_id":7}"#,
            r#"{"count":1}"#,
            r#"{"fan_id":"f-1"} x"#,
            r#"{"fan_id":"f-1""#,
            "",
            "[]",
            "null",
        ] {
            let plain = extract("application/json", body).await;
            let axums = extract("application/json; charset=utf-8", body).await;
            assert_eq!(plain, axums, "{body:?}");
            assert_eq!(extract("Application/JSON", body).await, axums, "{body:?}");
        }
        assert_eq!(
            extract("application/json", r#"{"fan_id":"f-1"}"#).await,
            Ok(Sent {
                fan_id: "f-1".into(),
                count: None
            })
        );
        let wrong_shape = extract("application/json", r#"{"fan_id":"f-1","count":-3}"#)
            .await
            .unwrap_err();
        assert_eq!(wrong_shape.status, 422);
        assert!(
            wrong_shape.detail.contains("count"),
            "{}",
            wrong_shape.detail
        );
    }

    #[tokio::test]
    async fn other_content_types_are_still_refused_or_read_as_axum_does() {
        assert_eq!(
            extract("text/plain", r#"{"fan_id":"f-1"}"#)
                .await
                .unwrap_err()
                .status,
            415
        );
        assert_eq!(
            extract("application/vnd.boxoffice+json", r#"{"fan_id":"f-1"}"#)
                .await
                .unwrap()
                .fan_id,
            "f-1"
        );
    }
}
