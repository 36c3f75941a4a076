//! The served API documents tell the truth about what the services accept.
//! Requests are generated from `/openapi.json` itself (the gateway's and the
//! admission service's: bodies, query parameters, every field within its
//! stated type, range, pattern, length and enum, edges favoured) and sent to
//! the running services. A request valid under the document must not be
//! refused for a rule the document does not state, nothing may answer 5xx,
//! every answer must be one the operation documents, with the documented
//! schema, and a problem's type must be among those its status lists.

mod common;

use std::time::Duration;

use common::{Stack, ADMIN_TOKEN};
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::TestRunner;
use reqwest::Method;
use serde_json::{json, Map, Value};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// How many requests per operation.
const CASES: usize = 60;

/// Follows a local `$ref` (`#/components/schemas/X`).
fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
    match schema["$ref"].as_str() {
        Some(reference) => {
            let target = reference
                .strip_prefix('#')
                .and_then(|pointer| doc.pointer(pointer))
                .unwrap_or_else(|| panic!("unresolvable $ref {reference}"));
            resolve(doc, target)
        }
        None => schema,
    }
}

fn types(schema: &Value) -> Vec<&str> {
    match &schema["type"] {
        Value::String(t) => vec![t.as_str()],
        Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    }
}

/// Draws values the schema allows.
struct Generator {
    runner: TestRunner,
}

impl Generator {
    fn draw<S: Strategy>(&mut self, strategy: S) -> S::Value {
        strategy.new_tree(&mut self.runner).unwrap().current()
    }

    fn chance(&mut self, percent: u32) -> bool {
        self.draw(0u32..100) < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        let i = self.draw(0..items.len());
        &items[i]
    }

    fn value(&mut self, doc: &Value, schema: &Value) -> Value {
        let schema = resolve(doc, schema);
        for key in ["oneOf", "anyOf"] {
            if let Some(branches) = schema[key].as_array() {
                let branch = self.pick(branches).clone();
                return self.value(doc, &branch);
            }
        }
        if let Some(all) = schema["allOf"].as_array() {
            // The shapes here use allOf for one schema and its nullability.
            return self.value(doc, &all[0].clone());
        }
        if let Some(values) = schema["enum"].as_array() {
            return self.pick(values).clone();
        }
        let mut kinds = types(schema);
        if kinds.len() > 1 && kinds.contains(&"null") && self.chance(70) {
            kinds.retain(|k| *k != "null");
        }
        let kind = if kinds.is_empty() {
            "object"
        } else {
            *self.pick(&kinds)
        };
        match kind {
            "null" => Value::Null,
            "boolean" => json!(self.chance(50)),
            "integer" => json!(self.integer(schema)),
            "number" => json!(self.number(schema)),
            "string" => json!(self.string(schema)),
            "array" => {
                let n = self.draw(0usize..3);
                let items = schema["items"].clone();
                Value::Array((0..n).map(|_| self.value(doc, &items)).collect())
            }
            _ => {
                let required: Vec<&str> = schema["required"]
                    .as_array()
                    .map(|r| r.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                let mut object = Map::new();
                if let Some(properties) = schema["properties"].as_object() {
                    for (name, field) in properties {
                        if required.contains(&name.as_str()) || self.chance(50) {
                            object.insert(name.clone(), self.value(doc, field));
                        }
                    }
                }
                Value::Object(object)
            }
        }
    }

    fn integer(&mut self, schema: &Value) -> i64 {
        // JSON numbers beyond 2^53 are not exact in every client.
        let limit = 1i64 << 53;
        let low = schema["minimum"].as_i64().unwrap_or(-limit).max(-limit);
        let high = schema["maximum"].as_i64().unwrap_or(limit).min(limit);
        let low = schema["exclusiveMinimum"].as_i64().map_or(low, |m| m + 1);
        let high = schema["exclusiveMaximum"].as_i64().map_or(high, |m| m - 1);
        match self.draw(0u32..10) {
            0 => low,
            1 => high,
            2 => self.draw(low..=high.min(low.saturating_add(10))),
            _ => self.draw(low..=high),
        }
    }

    fn number(&mut self, schema: &Value) -> f64 {
        let low = schema["minimum"].as_f64();
        let high = schema["maximum"].as_f64().unwrap_or(1e9);
        let exclusive = schema["exclusiveMinimum"].as_f64();
        let floor = low.or(exclusive).unwrap_or(-1e9);
        let value = match self.draw(0u32..10) {
            0 => floor,
            1 => high,
            2 => floor + self.draw(0.0..1.0),
            _ => self.draw(floor..=high),
        };
        match exclusive {
            Some(e) if value <= e => e + (high - e) / 1e6,
            _ => value,
        }
    }

    fn string(&mut self, schema: &Value) -> String {
        match schema["format"].as_str() {
            Some("date-time") => {
                let offset = self.draw(-3 * 86_400i64..3 * 86_400);
                return (chrono::Utc::now() + chrono::Duration::seconds(offset)).to_rfc3339();
            }
            Some("uuid") => return uuid::Uuid::new_v4().to_string(),
            _ => {}
        }
        let min = schema["minLength"].as_u64().unwrap_or(0) as usize;
        let max = schema["maxLength"].as_u64().unwrap_or(40) as usize;
        if let Some(pattern) = schema["pattern"].as_str() {
            // Anchors say "the whole string"; the generator makes whole strings.
            let inner = pattern.trim_start_matches('^').trim_end_matches('$');
            let strategy = proptest::string::string_regex(inner)
                .unwrap_or_else(|e| panic!("pattern {pattern}: {e}"));
            return self.draw(strategy);
        }
        let length = self.draw(min..=max.max(min));
        if self.chance(80) {
            // Printable Unicode, mostly.
            let printable = proptest::string::string_regex(&format!("\\PC{{{length}}}")).unwrap();
            return self.draw(printable);
        }
        // Any Unicode the JSON string can carry, controls and all.
        self.draw(proptest::collection::vec(proptest::char::any(), length))
            .into_iter()
            .collect()
    }
}

/// Every way `value` fails `schema`.
fn mismatches(doc: &Value, schema: &Value, value: &Value, path: &str, out: &mut Vec<String>) {
    let schema = resolve(doc, schema);
    for key in ["oneOf", "anyOf"] {
        if let Some(branches) = schema[key].as_array() {
            let fits = branches.iter().any(|branch| {
                let mut inner = Vec::new();
                mismatches(doc, branch, value, path, &mut inner);
                inner.is_empty()
            });
            if !fits {
                out.push(format!("{path}: matches none of {key} ({value})"));
            }
            return;
        }
    }
    if let Some(all) = schema["allOf"].as_array() {
        for branch in all {
            mismatches(doc, branch, value, path, out);
        }
        return;
    }
    if let Some(values) = schema["enum"].as_array() {
        if !values.contains(value) {
            out.push(format!("{path}: {value} not in {values:?}"));
        }
        return;
    }
    let kinds = types(schema);
    let fits = |kind: &str| match kind {
        "null" => value.is_null(),
        "boolean" => value.is_boolean(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "string" => value.is_string(),
        "array" => value.is_array(),
        "object" => value.is_object(),
        _ => true,
    };
    if !kinds.is_empty() && !kinds.iter().any(|k| fits(k)) {
        out.push(format!("{path}: {value} is not {kinds:?}"));
        return;
    }
    if let Some(items) = value.as_array() {
        for (i, item) in items.iter().enumerate() {
            mismatches(doc, &schema["items"], item, &format!("{path}[{i}]"), out);
        }
    }
    if let Some(object) = value.as_object() {
        for name in schema["required"].as_array().into_iter().flatten() {
            let name = name.as_str().unwrap();
            if !object.contains_key(name) {
                out.push(format!("{path}.{name}: missing"));
            }
        }
        if let Some(properties) = schema["properties"].as_object() {
            for (name, field) in object {
                match properties.get(name) {
                    Some(field_schema) => {
                        mismatches(doc, field_schema, field, &format!("{path}.{name}"), out)
                    }
                    None if schema["additionalProperties"] == false => {
                        out.push(format!("{path}.{name}: not documented"))
                    }
                    None => {}
                }
            }
        }
    }
}

/// One generated call of an operation.
struct Call {
    method: Method,
    template: String,
    path: String,
    query: Vec<(String, String)>,
    body: Option<Value>,
    token: Option<String>,
}

/// Sends `call` and checks its answer against the operation's document;
/// returns the status and, for a problem, its type.
async fn check(stack: &Stack, base: &str, doc: &Value, call: &Call) -> String {
    let op = &doc["paths"][&call.template][call.method.as_str().to_lowercase()];
    let mut request = stack
        .http
        .request(call.method.clone(), format!("{base}{}", call.path))
        .query(&call.query);
    if let Some(token) = &call.token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = &call.body {
        request = request.json(body);
    }
    let what = format!(
        "{} {} {:?} {}",
        call.method,
        call.path,
        call.query,
        call.body.as_ref().map(Value::to_string).unwrap_or_default()
    );
    let response = request
        .send()
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let status = response.status();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let text = response.text().await.unwrap();
    assert!(!status.is_server_error(), "{what} → {status} {text}");
    let documented = &op["responses"][status.as_str()];
    assert!(
        documented.is_object(),
        "{what} → {status}, which the operation does not document: {text}"
    );
    let Some(schema) = documented["content"][&content_type]["schema"].as_object() else {
        panic!("{what} → {status} as {content_type:?}, not a documented content type: {text}");
    };
    let body: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{what}: {e}: {text}"));
    let mut wrong = Vec::new();
    mismatches(doc, &Value::Object(schema.clone()), &body, "", &mut wrong);
    assert!(wrong.is_empty(), "{what} → {status}: {wrong:?} in {text}");
    if content_type == "application/problem+json" {
        let slug = body["type"].as_str().unwrap().rsplit('/').next().unwrap();
        let listed = documented["description"].as_str().unwrap_or("");
        assert!(
            listed.contains(&format!("`{slug}`")),
            "{what} → {status} `{slug}`, not among the types documented for it ({listed}): {text}"
        );
        // A request the document allows, refused for its shape or a field's
        // value: the rule must be one the document states.
        assert_ne!(slug, "invalid-body", "{what} → {text}");
        let sent = call.body.clone().unwrap_or_default();
        if slug == "invalid-fan-id" {
            // Stated: a declared event (all of this test's) requires one.
            assert!(
                sent.get("fan_id").is_none_or(Value::is_null),
                "{what} → {text}"
            );
        }
        if slug == "invalid-quantity" {
            // Stated: at most the event's per_fan_limit (4 here).
            assert!(sent["quantity"].as_i64().unwrap() > 4, "{what} → {text}");
            assert!(stated(doc).contains("per_fan_limit"));
        }
        if slug == "invalid-field" {
            let detail = body["detail"].as_str().unwrap();
            let rule = detail.split_once(": ").map_or(detail, |(_, rule)| rule);
            assert!(
                stated(doc).contains(&words(rule)),
                "{what} → refused for a rule the document does not state: {detail}"
            );
        }
        return match slug {
            "invalid-field" => format!("{} {}", status.as_u16(), body["detail"].as_str().unwrap()),
            _ => format!("{} {slug}", status.as_u16()),
        };
    }
    status.as_u16().to_string()
}

/// What the generated requests got, per operation, for the log.
#[derive(Default)]
struct Tally(std::collections::BTreeMap<String, std::collections::BTreeMap<String, usize>>);

impl Tally {
    fn add(&mut self, call: &Call, answer: String) {
        let op = format!("{} {}", call.method, call.template);
        *self.0.entry(op).or_default().entry(answer).or_default() += 1;
    }
}

/// `text` with every run of whitespace one space.
fn words(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Every string the document holds (descriptions, names, enums), as [`words`].
fn stated(doc: &Value) -> String {
    fn strings(value: &Value, out: &mut String) {
        match value {
            Value::String(s) => {
                out.push_str(&words(s));
                out.push('\n');
            }
            Value::Array(items) => items.iter().for_each(|v| strings(v, out)),
            Value::Object(map) => map.values().for_each(|v| strings(v, out)),
            _ => {}
        }
    }
    let mut out = String::new();
    strings(doc, &mut out);
    out
}

/// Generated query parameters of an operation (path parameters are the test's).
fn query(gen: &mut Generator, doc: &Value, op: &Value) -> Vec<(String, String)> {
    let mut query = Vec::new();
    for parameter in op["parameters"].as_array().into_iter().flatten() {
        let parameter = resolve(doc, parameter);
        if parameter["in"] != "query" {
            continue;
        }
        if parameter["required"] != true && !gen.chance(60) {
            continue;
        }
        let value = gen.value(doc, &parameter["schema"]);
        let text = match value {
            Value::String(s) => s,
            Value::Null => continue,
            other => other.to_string(),
        };
        query.push((parameter["name"].as_str().unwrap().to_owned(), text));
    }
    query
}

fn body(gen: &mut Generator, doc: &Value, op: &Value) -> Option<Value> {
    let schema = &op["requestBody"]["content"]["application/json"]["schema"];
    (!schema.is_null()).then(|| gen.value(doc, schema))
}

#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn requests_valid_under_the_served_documents_are_never_refused_for_unstated_rules(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let stack = Stack::start_with(pool_options, connect, false).await;
    stack.create_event("ev", 10_000, 1_000.0, 4).await;
    let gateway_doc = stack
        .get_json(format!("{}/openapi.json", stack.gateway))
        .await;
    let admin_doc = stack
        .get_json(format!("{}/openapi.json", stack.admission))
        .await;
    let mut gen = Generator {
        runner: TestRunner::deterministic(),
    };
    let mut tally = Tally::default();

    // The admin API: events created and replaced, tuned, and the planner.
    for i in 0..CASES {
        let event = format!("gen-{}", i % 7);
        for (method, template) in [
            (Method::PUT, "/admin/v1/events/{event_id}"),
            (Method::PATCH, "/admin/v1/events/{event_id}"),
            (Method::GET, "/admin/v1/events/{event_id}"),
            (Method::GET, "/admin/v1/capacity"),
        ] {
            let op = &admin_doc["paths"][template][method.as_str().to_lowercase()];
            let call = Call {
                path: template.replace("{event_id}", &event),
                template: template.into(),
                query: query(&mut gen, &admin_doc, op),
                body: body(&mut gen, &admin_doc, op),
                token: Some(ADMIN_TOKEN.into()),
                method,
            };
            tally.add(
                &call,
                check(&stack, &stack.admission, &admin_doc, &call).await,
            );
        }
    }

    // The fan's API: joins, then purchases with a real access token.
    for _ in 0..CASES {
        let op = &gateway_doc["paths"]["/v1/events/{event_id}/queue"]["post"];
        let call = Call {
            method: Method::POST,
            template: "/v1/events/{event_id}/queue".into(),
            path: "/v1/events/ev/queue".into(),
            query: vec![],
            body: body(&mut gen, &gateway_doc, op),
            token: None,
        };
        tally.add(
            &call,
            check(&stack, &stack.gateway, &gateway_doc, &call).await,
        );
    }
    for i in 0..CASES / 4 {
        let (status, joined) = stack.join("ev", &format!("buyer-{i}")).await;
        assert!(status.is_success(), "{joined}");
        let access = stack
            .wait_admitted("ev", joined["queue_ticket"].as_str().unwrap())
            .await;
        let op = &gateway_doc["paths"]["/v1/events/{event_id}/orders"]["post"];
        for _ in 0..2 {
            let call = Call {
                method: Method::POST,
                template: "/v1/events/{event_id}/orders".into(),
                path: "/v1/events/ev/orders".into(),
                query: vec![],
                body: body(&mut gen, &gateway_doc, op),
                token: Some(access.clone()),
            };
            tally.add(
                &call,
                check(&stack, &stack.gateway, &gateway_doc, &call).await,
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for (op, answers) in &tally.0 {
        eprintln!("{op}: {answers:?}");
    }
    stack.stop().await;
}
