//! The OpenAPI 3.1 documents of the public API (gateway) and the admin API
//! (admission), served at `/openapi.json`, against the routers that serve
//! them: every documented operation is served, every served route is
//! documented, and errors and security are described.

mod common;

use std::collections::BTreeSet;

use common::{Stack, ADMIN_TOKEN};
use reqwest::{Method, StatusCode};
use serde_json::Value;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

async fn document(stack: &Stack, base: &str) -> Value {
    let response = stack
        .http
        .get(format!("{base}/openapi.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let doc: Value = response.json().await.unwrap();
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3.1"),
        "{}",
        doc["openapi"]
    );
    doc
}

/// `(METHOD, /path/{template})` of every operation in the document.
fn operations(doc: &Value) -> BTreeSet<(String, String)> {
    doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .unwrap()
                .keys()
                .filter(|k| {
                    ["get", "put", "post", "patch", "delete", "head", "options"]
                        .contains(&k.as_str())
                })
                .map(|method| (method.to_uppercase(), path.clone()))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Calls an operation with made-up but well-formed parameters; fails if the
/// router does not know the route (its own 404 `not-found`) or the method (405).
async fn assert_served(stack: &Stack, base: &str, method: &str, template: &str) {
    let path = template
        .replace("{event_id}", "ev")
        .replace("{order_id}", &uuid::Uuid::new_v4().to_string())
        .replace("{fan_id}", "nobody")
        .replace("{file}", "dashboard.js");
    let mut request = stack
        .http
        .request(
            Method::from_bytes(method.as_bytes()).unwrap(),
            format!("{base}{path}"),
        )
        .bearer_auth(ADMIN_TOKEN);
    if matches!(method, "POST" | "PUT" | "PATCH") {
        request = request.json(&serde_json::json!({}));
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    let body = response.text().await.unwrap_or_default();
    assert_ne!(
        status,
        StatusCode::METHOD_NOT_ALLOWED,
        "{method} {template} is documented but not served: {body}"
    );
    let route_unknown = status == StatusCode::NOT_FOUND && body.contains("/problems/not-found");
    assert!(
        !route_unknown,
        "{method} {template} is documented but not served: {body}"
    );
}

/// Route registrations outside `utoipa_axum::routes!` in a crate's non-test
/// code: each would be served without being documented.
fn undocumented_registrations(src: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut dirs = vec![std::path::PathBuf::from(src)];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap();
            for (n, line) in code.lines().enumerate() {
                for call in [".route(", ".route_service(", ".nest(", ".nest_service("] {
                    if line.contains(call) {
                        found.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
                    }
                }
            }
        }
    }
    found
}

#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn documented_operations_and_served_routes_are_the_same_set(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let stack = Stack::start_with(pool_options, connect, false).await;
    stack.create_event("ev", 10, 10.0, 4).await;
    let manifest = env!("CARGO_MANIFEST_DIR");
    for (base, src, expected) in [
        (
            stack.gateway.clone(),
            format!("{manifest}/src"),
            &[
                ("GET", "/v1/events/{event_id}"),
                ("POST", "/v1/events/{event_id}/queue"),
                ("GET", "/v1/events/{event_id}/queue/status"),
                ("GET", "/v1/events/{event_id}/challenge"),
                ("POST", "/v1/events/{event_id}/orders"),
                ("GET", "/v1/orders/{order_id}"),
                ("GET", "/v1/orders/{order_id}/tickets.pdf"),
                ("GET", "/.well-known/jwks.json"),
                ("GET", "/"),
                ("GET", "/healthz"),
                ("GET", "/readyz"),
                ("GET", "/metrics"),
                ("GET", "/openapi.json"),
            ][..],
        ),
        (
            stack.admission.clone(),
            format!("{manifest}/../admission/src"),
            &[
                ("GET", "/admin/v1/events"),
                ("GET", "/admin/v1/events/{event_id}"),
                ("PUT", "/admin/v1/events/{event_id}"),
                ("PATCH", "/admin/v1/events/{event_id}"),
                ("DELETE", "/admin/v1/events/{event_id}/admissions/{fan_id}"),
                ("GET", "/admin/v1/events/{event_id}/history"),
                ("GET", "/admin/v1/capacity"),
                ("GET", "/admin/"),
                ("GET", "/admin"),
                ("GET", "/admin/assets/{file}"),
                ("GET", "/healthz"),
                ("GET", "/readyz"),
                ("GET", "/metrics"),
                ("GET", "/openapi.json"),
            ][..],
        ),
    ] {
        let doc = document(&stack, &base).await;
        let documented = operations(&doc);
        // Documented ⇒ served.
        for (method, path) in &documented {
            assert_served(&stack, &base, method, path).await;
        }
        // Served ⇒ documented: routes are only added through `routes!`, and
        // the API the README lists is all there.
        let stray = undocumented_registrations(&src);
        assert!(
            stray.is_empty(),
            "routes added outside utoipa_axum::routes! are served undocumented: {stray:#?}"
        );
        let expected: BTreeSet<(String, String)> = expected
            .iter()
            .map(|(m, p)| (m.to_string(), p.to_string()))
            .collect();
        assert_eq!(documented, expected, "{base}");
    }
    stack.stop().await;
}

#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn errors_are_problem_documents_and_tokens_are_security_schemes(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let stack = Stack::start_with(pool_options, connect, false).await;
    for (base, schemes, api_prefix) in [
        (
            stack.gateway.clone(),
            &["queue_ticket", "access_token", "order_token"][..],
            "/v1/",
        ),
        (stack.admission.clone(), &["admin_token"][..], "/admin/v1/"),
    ] {
        let doc = document(&stack, &base).await;
        for scheme in schemes {
            let s = &doc["components"]["securitySchemes"][scheme];
            assert_eq!(s["type"], "http", "{scheme}: {s}");
            assert_eq!(s["scheme"], "bearer", "{scheme}: {s}");
        }
        assert!(doc["components"]["schemas"]["Problem"].is_object());
        for (path, item) in doc["paths"].as_object().unwrap() {
            if !path.starts_with(api_prefix) {
                continue;
            }
            for (method, op) in item.as_object().unwrap() {
                let responses = op["responses"].as_object().unwrap();
                let errors: Vec<&Value> = responses
                    .iter()
                    .filter(|(code, _)| code.starts_with('4') || code.starts_with('5'))
                    .map(|(_, r)| r)
                    .collect();
                assert!(!errors.is_empty(), "{method} {path} documents no errors");
                for error in errors {
                    assert_eq!(
                        error["content"]["application/problem+json"]["schema"]["$ref"],
                        "#/components/schemas/Problem",
                        "{method} {path}: {error}"
                    );
                }
                let secured: BTreeSet<&str> = op["security"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .flat_map(|r| r.as_object().unwrap().keys().map(String::as_str))
                    .collect();
                if !secured.is_empty() {
                    assert!(
                        responses.contains_key("401"),
                        "{method} {path} takes a token but documents no 401"
                    );
                }
                if api_prefix == "/admin/v1/" {
                    assert!(secured.contains("admin_token"), "{method} {path}");
                }
            }
        }
        // The tokens that guard the fan's calls, by operation.
        if api_prefix == "/v1/" {
            let security =
                |path: &str, method: &str| doc["paths"][path][method]["security"].to_string();
            assert!(security("/v1/events/{event_id}/queue/status", "get").contains("queue_ticket"));
            assert!(security("/v1/events/{event_id}/orders", "post").contains("access_token"));
            assert!(security("/v1/orders/{order_id}", "get").contains("order_token"));
            assert_eq!(security("/v1/events/{event_id}/queue", "post"), "null");
        }
    }
    stack.stop().await;
}
