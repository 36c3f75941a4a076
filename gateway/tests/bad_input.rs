//! Bad input on every endpoint of the purchase path gets a problem document
//! with the right 4xx status and slug, never a 500.

mod common;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use boxoffice_contract::token::{generate_ed25519_pem, now_s, Claims, KeySet, TokenUse};
use common::{Stack, ADMIN_TOKEN};
use reqwest::{Method, StatusCode};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

struct Case {
    name: &'static str,
    method: Method,
    url: String,
    bearer: Option<String>,
    content_type: Option<&'static str>,
    body: Option<String>,
    status: u16,
    slug: &'static str,
}

fn case(name: &'static str, method: Method, url: String, status: u16, slug: &'static str) -> Case {
    Case {
        name,
        method,
        url,
        bearer: None,
        content_type: None,
        body: None,
        status,
        slug,
    }
}

impl Case {
    fn bearer(mut self, token: &str) -> Self {
        self.bearer = Some(token.to_owned());
        self
    }
    fn json(mut self, body: &str) -> Self {
        self.content_type = Some("application/json");
        self.body = Some(body.to_owned());
        self
    }
    fn raw(mut self, content_type: &'static str, body: &str) -> Self {
        self.content_type = Some(content_type);
        self.body = Some(body.to_owned());
        self
    }
}

#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn every_bad_request_gets_its_problem_document(
    options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let stack = Stack::start(options, connect).await;
    stack.create_event("ev", 10, 50.0, 2).await;
    stack.create_event("other", 10, 50.0, 2).await;
    let (_, joined) = stack.join("ev", "fan-1").await;
    let ticket = joined["queue_ticket"].as_str().unwrap().to_owned();
    let access = stack.wait_admitted("ev", &ticket).await;
    let (_, other_joined) = stack.join("other", "fan-2").await;
    let other_access = stack
        .wait_admitted("other", other_joined["queue_ticket"].as_str().unwrap())
        .await;
    let foreign_order = {
        let mut claims = Claims::new("boxoffice", "ev", "fan-1", TokenUse::Order, now_s(), 600);
        claims.order_id = Some(uuid::Uuid::now_v7());
        stack.keys.sign(&claims)
    };

    // Forgeries of an access token for fan-1 on "ev".
    let claims = Claims::new("boxoffice", "ev", "fan-1", TokenUse::Access, now_s(), 600);
    let b64 = |bytes: &[u8]| URL_SAFE_NO_PAD.encode(bytes);
    let payload = b64(&serde_json::to_vec(&claims).unwrap());
    let alg_none = format!("{}.{payload}.", b64(br#"{"alg":"none","typ":"JWT"}"#));
    let jwks = serde_json::to_value(stack.keys.jwks()).unwrap();
    let public_x = jwks["keys"][0]["x"].as_str().unwrap().to_owned();
    let mut confused_header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    confused_header.kid = jwks["keys"][0]["kid"].as_str().map(str::to_owned);
    let key_confusion = jsonwebtoken::encode(
        &confused_header,
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(public_x.as_bytes()),
    )
    .unwrap();
    let sign_with = |edit: &dyn Fn(&mut Claims)| {
        let mut c = claims.clone();
        edit(&mut c);
        stack.keys.sign(&c)
    };
    let expired = sign_with(&|c| {
        c.iat -= 7200;
        c.nbf -= 7200;
        c.exp = now_s() - 3600;
    });
    let not_yet = sign_with(&|c| c.nbf = now_s() + 3600);
    let wrong_issuer = sign_with(&|c| c.iss = "mallory".into());
    let retired = KeySet::from_pems(
        "boxoffice",
        &generate_ed25519_pem(),
        &[],
        common::QUEUE_SECRET,
    )
    .unwrap()
    .sign(&claims);
    let order_token_as_access = sign_with(&|c| c.token_use = TokenUse::Order);
    let tampered = {
        let token = stack.keys.sign(&claims);
        let (head, rest) = token.split_once('.').unwrap();
        let (_, sig) = rest.split_once('.').unwrap();
        let mut richer = claims.clone();
        richer.sub = "fan-9".into();
        format!(
            "{head}.{}.{sig}",
            b64(&serde_json::to_vec(&richer).unwrap())
        )
    };

    let g = &stack.gateway;
    let a = &stack.admission;
    let order_url = format!("{g}/v1/events/ev/orders");
    let some_order = format!("{g}/v1/orders/{}", uuid::Uuid::now_v7());
    let cases = vec![
        case("no such route", Method::GET, format!("{g}/v2/nothing"), 404, "not-found"),
        case("wrong method", Method::DELETE, format!("{g}/v1/events/ev/queue"), 405, "method-not-allowed"),
        case("admin: no such route", Method::GET, format!("{a}/admin/v2"), 404, "not-found"),
        case("unknown event", Method::GET, format!("{g}/v1/events/nope"), 404, "unknown-event"),
        case("event id with braces", Method::GET, format!("{g}/v1/events/a%7Bb%7D"), 404, "unknown-event"),
        case("join: malformed JSON", Method::POST, format!("{g}/v1/events/ev/queue"), 400, "bad-request").json("{\"fan_id\":"),
        case("join: not JSON", Method::POST, format!("{g}/v1/events/ev/queue"), 415, "unsupported-media-type").raw("text/plain", "fan-1"),
        case("join: wrong type", Method::POST, format!("{g}/v1/events/ev/queue"), 422, "invalid-body").json("{\"fan_id\":5}"),
        case("join: no fan id (a declared event)", Method::POST, format!("{g}/v1/events/ev/queue"), 422, "invalid-fan-id").json("{}"),
        case("join: bad fan id", Method::POST, format!("{g}/v1/events/ev/queue"), 422, "invalid-fan-id").json("{\"fan_id\":\"a b\"}"),
        case("join: unknown event", Method::POST, format!("{g}/v1/events/nope/queue"), 404, "unknown-event").json("{\"fan_id\":\"f\"}"),
        case("status: no ticket", Method::GET, format!("{g}/v1/events/ev/queue/status"), 401, "invalid-ticket"),
        case("status: garbage ticket", Method::GET, format!("{g}/v1/events/ev/queue/status"), 401, "invalid-ticket").bearer("garbage"),
        case("status: ticket of another event", Method::GET, format!("{g}/v1/events/other/queue/status"), 401, "invalid-ticket").bearer(&ticket),
        case("status: access token as ticket", Method::GET, format!("{g}/v1/events/ev/queue/status"), 401, "invalid-ticket").bearer(&access),
        case("buy: no token", Method::POST, order_url.clone(), 401, "invalid-token").json("{\"quantity\":1}"),
        case("buy: garbage token", Method::POST, order_url.clone(), 401, "invalid-token").bearer("x.y.z").json("{\"quantity\":1}"),
        case("buy: queue ticket", Method::POST, order_url.clone(), 401, "invalid-token").bearer(&ticket).json("{\"quantity\":1}"),
        case("buy: token of another event", Method::POST, order_url.clone(), 403, "wrong-event").bearer(&other_access).json("{\"quantity\":1}"),
        case("buy: alg none", Method::POST, order_url.clone(), 401, "invalid-token").bearer(&alg_none).json("{\"quantity\":1}"),
        case("buy: HS256 keyed with the public key", Method::POST, order_url.clone(), 401, "invalid-token").bearer(&key_confusion).json("{\"quantity\":1}"),
        case("buy: expired", Method::POST, order_url.clone(), 401, "invalid-token").bearer(&expired).json("{\"quantity\":1}"),
        case("buy: not yet valid", Method::POST, order_url.clone(), 401, "invalid-token").bearer(&not_yet).json("{\"quantity\":1}"),
        case("buy: wrong issuer", Method::POST, order_url.clone(), 401, "invalid-token").bearer(&wrong_issuer).json("{\"quantity\":1}"),
        case("buy: retired or foreign key", Method::POST, order_url.clone(), 401, "invalid-token").bearer(&retired).json("{\"quantity\":1}"),
        case("buy: order token", Method::POST, order_url.clone(), 401, "invalid-token").bearer(&order_token_as_access).json("{\"quantity\":1}"),
        case("buy: tampered payload", Method::POST, order_url.clone(), 401, "invalid-token").bearer(&tampered).json("{\"quantity\":1}"),
        case("buy: basic auth instead of bearer", Method::POST, order_url.clone(), 401, "invalid-token").json("{\"quantity\":1}"),
        case("buy: malformed JSON", Method::POST, order_url.clone(), 400, "bad-request").bearer(&access).json("{"),
        case("buy: zero", Method::POST, order_url.clone(), 422, "invalid-quantity").bearer(&access).json("{\"quantity\":0}"),
        case("buy: negative", Method::POST, order_url.clone(), 422, "invalid-quantity").bearer(&access).json("{\"quantity\":-3}"),
        case("buy: over the per-fan limit", Method::POST, order_url.clone(), 422, "invalid-quantity").bearer(&access).json("{\"quantity\":3}"),
        case("buy: huge", Method::POST, order_url.clone(), 422, "invalid-body").bearer(&access).json("{\"quantity\":1e40}"),
        case("order: not a uuid", Method::GET, format!("{g}/v1/orders/not-a-uuid"), 400, "bad-request").bearer(&foreign_order),
        case("order: no token", Method::GET, some_order.clone(), 401, "invalid-token"),
        case("order: garbage token", Method::GET, some_order.clone(), 401, "invalid-token").bearer("garbage"),
        case("order: token of another order", Method::GET, some_order.clone(), 404, "unknown-order").bearer(&foreign_order),
        case("order: queue ticket", Method::GET, some_order.clone(), 401, "invalid-token").bearer(&ticket),
        case("admin: no token", Method::GET, format!("{a}/admin/v1/events/ev"), 401, "unauthorized"),
        case("admin: wrong token", Method::GET, format!("{a}/admin/v1/events/ev"), 401, "unauthorized").bearer("nope"),
        case("admin: unknown event", Method::GET, format!("{a}/admin/v1/events/nope"), 404, "unknown-event").bearer(ADMIN_TOKEN),
        case("admin: malformed JSON", Method::PUT, format!("{a}/admin/v1/events/x"), 400, "bad-request").bearer(ADMIN_TOKEN).json("{"),
        case("admin: unknown field", Method::PUT, format!("{a}/admin/v1/events/x"), 422, "invalid-body").bearer(ADMIN_TOKEN)
            .json(r#"{"name":"x","capacity":1,"opens_at":"2026-01-01T00:00:00Z","admission_rate_per_s":1,"colour":"red"}"#),
        case("admin: negative rate", Method::PUT, format!("{a}/admin/v1/events/x"), 422, "invalid-field").bearer(ADMIN_TOKEN)
            .json(r#"{"name":"x","capacity":1,"opens_at":"2026-01-01T00:00:00Z","admission_rate_per_s":-1}"#),
        case("admin: bad event id", Method::PUT, format!("{a}/admin/v1/events/a:b"), 422, "invalid-field").bearer(ADMIN_TOKEN)
            .json(r#"{"name":"x","capacity":1,"opens_at":"2026-01-01T00:00:00Z","admission_rate_per_s":1}"#),
        case("admin: patch nothing", Method::PATCH, format!("{a}/admin/v1/events/ev"), 422, "invalid-field").bearer(ADMIN_TOKEN).json("{}"),
    ];

    let count = cases.len();
    for case in cases {
        let mut request = stack.http.request(case.method.clone(), &case.url);
        if let Some(token) = &case.bearer {
            request = request.bearer_auth(token);
        } else if case.name.contains("basic auth") {
            request = request.basic_auth("fan-1", Some("secret"));
        }
        if let Some(content_type) = case.content_type {
            request = request.header("content-type", content_type);
        }
        if let Some(body) = &case.body {
            request = request.body(body.clone());
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let content_type = response
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_owned());
        let body = response.text().await.unwrap();
        assert_eq!(
            status,
            StatusCode::from_u16(case.status).unwrap(),
            "{}: {body}",
            case.name
        );
        assert_eq!(
            content_type.as_deref(),
            Some("application/problem+json"),
            "{}",
            case.name
        );
        let problem: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert!(
            problem["type"]
                .as_str()
                .unwrap()
                .ends_with(&format!("/{}", case.slug)),
            "{}: {body}",
            case.name
        );
        assert_eq!(problem["status"], case.status, "{}", case.name);
    }

    assert!(count >= 40, "the suite has {count} cases");

    // None of it cost the fan the admission: the token still buys, once.
    let (status, body) = stack.buy("ev", &access, 1, Some("k")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let (status, body) = stack.buy("ev", &access, 1, Some("other-key")).await;
    assert_eq!(
        (
            status.as_u16(),
            body["type"].as_str().unwrap().ends_with("/token-used")
        ),
        (409, true),
        "a replayed jti"
    );
    let order_id = body_order(&stack, &access).await;
    let (status, body) = stack.order(&order_id, &other_access).await;
    assert_eq!(
        (
            status.as_u16(),
            body["type"].as_str().unwrap().ends_with("/unknown-order")
        ),
        (404, true),
        "another fan's order"
    );

    // Ops revoke an admission: the token stops working at once.
    let (_, joined) = stack.join("ev", "fan-3").await;
    let revoked_access = stack
        .wait_admitted("ev", joined["queue_ticket"].as_str().unwrap())
        .await;
    let revoke = |fan: &str| {
        stack
            .http
            .delete(format!(
                "{}/admin/v1/events/ev/admissions/{fan}",
                stack.admission
            ))
            .bearer_auth(ADMIN_TOKEN)
            .send()
    };
    assert_eq!(
        revoke("fan-3").await.unwrap().status(),
        StatusCode::NO_CONTENT
    );
    let (status, body) = stack.buy("ev", &revoked_access, 1, None).await;
    assert_eq!(
        (
            status.as_u16(),
            body["type"].as_str().unwrap().ends_with("/invalid-token")
        ),
        (401, true),
        "{body}"
    );
    assert_eq!(
        revoke("fan-3").await.unwrap().status(),
        StatusCode::NOT_FOUND,
        "nothing left to revoke"
    );
    stack.stop().await;
}

/// The order id the access token bought (the same Idempotency-Key replays it).
async fn body_order(stack: &Stack, access: &str) -> String {
    let (_, body) = stack.buy("ev", access, 1, Some("k")).await;
    body["order_id"].as_str().unwrap().to_owned()
}
