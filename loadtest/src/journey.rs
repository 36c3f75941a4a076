//! One fan's journey, as goose transactions: join (solving proof of work
//! when asked), poll at the pace `Retry-After` sets, buy 1..=`per_fan_limit`
//! seats (or abandon), follow the order to `confirmed`, download the ticket
//! PDF. A share misbehave and must be refused. Every answer is classified
//! ([`crate::classify`]) and timed twice: from when it was sent (goose's
//! figure) and from when it was due (corrected for coordinated omission).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use goose::prelude::*;
use hdrhistogram::Histogram;
use rand::Rng;
use serde::Serialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use crate::arrivals::{Arrival, Dispatcher};
use crate::classify::{classify, Answer, Attack, Class, Step};
use crate::sale::EventInfo;
use crate::verdict::FanRecord;

/// What fans do, decided before the run.
#[derive(Debug, Clone)]
pub struct Crowd {
    pub abandon: f64,
    pub misbehave: f64,
    pub addresses: Vec<IpAddr>,
    /// Open model (fans come from the dispatcher) or closed (each user loops).
    pub open: bool,
}

/// Latencies of one request name, in microseconds.
pub struct Latencies {
    pub raw: Histogram<u64>,
    pub corrected: Histogram<u64>,
}

impl Default for Latencies {
    fn default() -> Self {
        let h = || Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds");
        Self {
            raw: h(),
            corrected: h(),
        }
    }
}

/// Everything the fans of one run share.
pub struct Run {
    pub crowd: Crowd,
    /// The sale's event: set before the first fan arrives (the run creates
    /// it once the users are up, so the prequeue is the fans' own).
    pub event: OnceLock<EventInfo>,
    /// Why the run could not start its sale, if it could not.
    pub failure: Mutex<Option<String>>,
    pub run_id: String,
    pub started: Instant,
    pub dispatcher: Dispatcher,
    /// goose users that finished their start-up (client bound to its address).
    pub ready: AtomicUsize,
    /// Set when the run is ending: journeys stop at their next step.
    pub stopping: AtomicBool,
    /// A fan was told the sale is sold out or closed.
    pub sold_out_seen: AtomicBool,
    /// Journeys in progress.
    pub in_flight: AtomicI64,
    pub latencies: Mutex<BTreeMap<Step, Latencies>>,
    /// Answers by request and status ("none" for no answer).
    pub statuses: Mutex<BTreeMap<(Step, String), u64>>,
    /// Answers by the wall-clock second (Unix) they came in, and status, so
    /// what fans saw can be set against when a fault was injected.
    pub by_second: Mutex<BTreeMap<i64, BTreeMap<String, u64>>>,
    /// Errors by reason.
    pub errors: Mutex<BTreeMap<String, u64>>,
    pub answers: AtomicU64,
    pub error_count: AtomicU64,
    /// From the purchase to `confirmed`, microseconds.
    pub confirm: Mutex<Histogram<u64>>,
    pub fans: Mutex<Vec<FanRecord>>,
    pub outcomes: Mutex<BTreeMap<&'static str, u64>>,
}

impl Run {
    pub fn new(crowd: Crowd) -> Self {
        Self {
            crowd,
            event: OnceLock::new(),
            failure: Mutex::default(),
            run_id: format!("{:08x}", rand::random::<u32>()),
            started: Instant::now(),
            dispatcher: Dispatcher::default(),
            ready: AtomicUsize::new(0),
            stopping: AtomicBool::new(false),
            sold_out_seen: AtomicBool::new(false),
            in_flight: AtomicI64::new(0),
            latencies: Mutex::default(),
            statuses: Mutex::default(),
            by_second: Mutex::default(),
            errors: Mutex::default(),
            answers: AtomicU64::new(0),
            error_count: AtomicU64::new(0),
            confirm: Mutex::new(
                Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds"),
            ),
            fans: Mutex::default(),
            outcomes: Mutex::default(),
        }
    }

    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    fn since_start(&self, at: Instant) -> f64 {
        at.saturating_duration_since(self.started).as_secs_f64()
    }

    fn outcome(&self, what: &'static str) {
        *self
            .outcomes
            .lock()
            .expect("not poisoned")
            .entry(what)
            .or_default() += 1;
    }

    /// A fan's journey broke where a well-behaved fan's never should (a
    /// purchase refused until it gave up, a success without its token, a
    /// ticket that is not a PDF): an error, beside the answers' errors.
    fn journey_error(&self, what: &str) {
        self.error_count.fetch_add(1, Ordering::Relaxed);
        *self
            .errors
            .lock()
            .expect("not poisoned")
            .entry(format!("journey: {what}"))
            .or_default() += 1;
    }

    fn record(
        &self,
        step: Step,
        due: Instant,
        sent: Instant,
        done: Instant,
        status: Option<u16>,
        class: &Class,
    ) {
        let micros = |d: Duration| (d.as_micros() as u64).max(1);
        {
            let mut all = self.latencies.lock().expect("not poisoned");
            let l = all.entry(step).or_default();
            l.raw.saturating_record(micros(done - sent));
            l.corrected
                .saturating_record(micros(done.saturating_duration_since(due.min(sent))));
        }
        let status = status.map_or_else(|| "none".to_owned(), |s| s.to_string());
        *self
            .by_second
            .lock()
            .expect("not poisoned")
            .entry(chrono::Utc::now().timestamp())
            .or_default()
            .entry(status.clone())
            .or_default() += 1;
        *self
            .statuses
            .lock()
            .expect("not poisoned")
            .entry((step, status))
            .or_default() += 1;
        self.answers.fetch_add(1, Ordering::Relaxed);
        if let Class::Error(reason) = class {
            self.error_count.fetch_add(1, Ordering::Relaxed);
            *self
                .errors
                .lock()
                .expect("not poisoned")
                .entry(format!("{}: {reason}", step.name()))
                .or_default() += 1;
        }
    }
}

/// The run the goose transactions serve (they are plain functions).
static CURRENT: RwLock<Option<Arc<Run>>> = RwLock::new(None);

pub fn set_current(run: Option<Arc<Run>>) {
    *CURRENT.write().expect("not poisoned") = run;
}

fn current() -> Result<Arc<Run>, Box<TransactionError>> {
    CURRENT
        .read()
        .expect("not poisoned")
        .clone()
        .ok_or_else(|| {
            Box::new(TransactionError::InvalidMethod {
                method: reqwest::Method::OPTIONS,
            })
        })
}

/// The scenario: each user binds its client to a fan's address, then takes
/// fans (open model: arrivals; closed: one after another).
pub fn scenario() -> Scenario {
    scenario!("Fans")
        .register_transaction(transaction!(start_user).set_on_start().set_name("start"))
        .register_transaction(transaction!(fans).set_name("fan"))
}

async fn start_user(user: &mut GooseUser) -> TransactionResult {
    let run = current()?;
    let mut builder = reqwest::Client::builder()
        .timeout(Duration::from_secs(15))
        .connect_timeout(Duration::from_secs(5))
        // Below the gateway's keep-alive limit (its 65 s header timer), as
        // browsers keep theirs: a fan idle longer (an attacker waiting for
        // its token to expire) opens a new connection instead of racing the
        // server's close of the old one.
        .pool_idle_timeout(Duration::from_secs(30))
        .user_agent("boxoffice-loadtest");
    if !run.crowd.addresses.is_empty() {
        let address = run.crowd.addresses[user.weighted_users_index % run.crowd.addresses.len()];
        builder = builder.local_address(address);
    }
    user.set_client_builder(builder).await?;
    run.ready.fetch_add(1, Ordering::AcqRel);
    Ok(())
}

async fn fans(user: &mut GooseUser) -> TransactionResult {
    let run = current()?;
    if run.crowd.open {
        // Wait a second at most, so goose can end the user between waits
        // (idle users then do not churn goose's transaction figures).
        let Some(arrival) = run.dispatcher.next(Duration::from_secs(1)).await else {
            // No more arrivals: idle until goose ends the user, never spin
            // (goose loops at once, and a loop that never waits starves the
            // runtime it shares with everything else).
            if run.dispatcher.is_finished() || run.stopping() {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            return Ok(());
        };
        journey(user, &run, arrival).await
    } else {
        if run.dispatcher.is_finished() || run.stopping() || run.event.get().is_none() {
            tokio::time::sleep(Duration::from_millis(250)).await;
            return Ok(());
        }
        let arrival = Arrival {
            seq: run.dispatcher.offer_closed(),
            scheduled: Instant::now(),
        };
        journey(user, &run, arrival).await
    }
}

/// An answer, read whole.
struct Reply {
    status: Option<u16>,
    slug: Option<String>,
    retry_after: Option<Duration>,
    body: Value,
    bytes: Vec<u8>,
    content_type: String,
    done: Instant,
}

impl Reply {
    fn is(&self, status: u16) -> bool {
        self.status == Some(status)
    }
}

struct Call<'a> {
    step: Step,
    attack: Option<Attack>,
    method: GooseMethod,
    path: &'a str,
    token: Option<&'a str>,
    body: Option<Value>,
    idempotency_key: Option<&'a str>,
    /// When the request was due: the arrival, or the end of the wait the
    /// server asked for. Corrected latencies count from here.
    due: Instant,
}

impl<'a> Call<'a> {
    fn new(step: Step, method: GooseMethod, path: &'a str, due: Instant) -> Self {
        Self {
            step,
            attack: None,
            method,
            path,
            token: None,
            body: None,
            idempotency_key: None,
            due,
        }
    }
}

async fn send(
    user: &mut GooseUser,
    run: &Run,
    call: Call<'_>,
) -> Result<Reply, Box<TransactionError>> {
    let mut builder = user.get_request_builder(&call.method, call.path)?;
    if let Some(token) = call.token {
        builder = builder.bearer_auth(token);
    }
    if let Some(key) = call.idempotency_key {
        builder = builder.header("idempotency-key", key);
    }
    if let Some(body) = &call.body {
        builder = builder.json(body);
    }
    let request = GooseRequest::builder()
        .method(call.method)
        .path(call.path)
        .name(call.step.name())
        .set_request_builder(builder)
        .build();
    let sent = Instant::now();
    let mut goose = user.request(request).await?;
    let mut reply = Reply {
        status: None,
        slug: None,
        retry_after: None,
        body: Value::Null,
        bytes: Vec::new(),
        content_type: String::new(),
        done: Instant::now(),
    };
    if let Ok(response) = goose.response {
        reply.status = Some(response.status().as_u16());
        reply.retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        reply.content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        match response.bytes().await {
            Ok(bytes) => reply.bytes = bytes.to_vec(),
            Err(_) => reply.status = None,
        }
        reply.body = serde_json::from_slice(&reply.bytes).unwrap_or(Value::Null);
        reply.slug = reply.body["type"]
            .as_str()
            .and_then(|t| t.rsplit('/').next())
            .map(str::to_owned);
    }
    reply.done = Instant::now();
    let class = classify(
        call.step,
        call.attack,
        Answer {
            status: reply.status,
            slug: reply.slug.as_deref(),
            retry_after: reply.retry_after.is_some(),
        },
    );
    run.record(call.step, call.due, sent, reply.done, reply.status, &class);
    match &class {
        Class::Expected => user.set_success(&mut goose.request)?,
        // goose returns the failure as an error; the journey decides what next.
        Class::Error(reason) => drop(user.set_failure(reason, &mut goose.request, None, None)),
    }
    Ok(reply)
}

/// Waits as the server asked (capped, so one answer cannot stall a run).
async fn honour(reply: &Reply) -> Instant {
    let wait = reply
        .retry_after
        .unwrap_or(Duration::from_secs(1))
        .clamp(Duration::from_millis(100), Duration::from_secs(30));
    let due = Instant::now() + wait;
    tokio::time::sleep_until(due).await;
    due
}

/// Counts the journey in flight for as long as it lives.
struct InFlight<'a>(&'a Run);

impl<'a> InFlight<'a> {
    fn new(run: &'a Run) -> Self {
        run.in_flight.fetch_add(1, Ordering::AcqRel);
        Self(run)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One fan, from arrival to tickets (or a clear "no").
async fn journey(user: &mut GooseUser, run: &Run, arrival: Arrival) -> TransactionResult {
    let _in_flight = InFlight::new(run);
    let fan_id = format!("lt-{}-{}", run.run_id, arrival.seq);
    let mut record = FanRecord {
        fan_id: fan_id.clone(),
        ..FanRecord::default()
    };
    let outcome = fan(user, run, arrival, &mut record).await;
    run.outcome(outcome?);
    if record.join_answered_s > 0.0 {
        run.fans.lock().expect("not poisoned").push(record);
    }
    Ok(())
}

/// The fan's journey; returns how it ended, for the report.
async fn fan(
    user: &mut GooseUser,
    run: &Run,
    arrival: Arrival,
    record: &mut FanRecord,
) -> Result<&'static str, Box<TransactionError>> {
    let Some(event) = run.event.get() else {
        return Ok("no event to join");
    };
    let e = &event.event_id;
    let fan_id = record.fan_id.clone();

    // Join, with proof of work if asked, honouring every Retry-After.
    let join_path = format!("/v1/events/{e}/queue");
    let mut due = arrival.scheduled;
    let mut pow: Option<Value> = None;
    let (ticket, first_poll) = loop {
        if run.stopping() {
            return Ok("cut off by the end of the run");
        }
        let mut call = Call::new(Step::Join, GooseMethod::Post, &join_path, due);
        call.body = Some(match &pow {
            Some(pow) => json!({ "fan_id": fan_id, "pow": pow }),
            None => json!({ "fan_id": fan_id }),
        });
        let (sent, sent_wall) = (Instant::now(), Utc::now());
        let reply = send(user, run, call).await?;
        match reply.status {
            Some(200 | 201) => {
                record.join_sent_s = run.since_start(sent);
                record.join_answered_s = run.since_start(reply.done).max(record.join_sent_s + 1e-6);
                // The client cannot see the server's clock: a join sent within a
                // second of the opening may have been placed by the shuffle.
                record.prequeue = sent_wall < event.opens_at + chrono::Duration::seconds(1);
                record.waiting_until_ms = Some(Utc::now().timestamp_millis());
                match reply.body["queue_ticket"].as_str() {
                    Some(t) => break (t.to_owned(), reply.retry_after),
                    None => {
                        run.journey_error("a join answered without a ticket");
                        return Ok("join answered without a ticket");
                    }
                }
            }
            Some(428) => {
                let path = format!("/v1/events/{e}/challenge");
                let reply = send(
                    user,
                    run,
                    Call::new(Step::Challenge, GooseMethod::Get, &path, Instant::now()),
                )
                .await?;
                let (Some(challenge), Some(bits)) = (
                    reply.body["challenge"].as_str(),
                    reply.body["difficulty_bits"].as_u64(),
                ) else {
                    run.journey_error("a challenge without its fields");
                    return Ok("no proof-of-work challenge");
                };
                let (challenge, fan) = (challenge.to_owned(), fan_id.clone());
                let nonce =
                    tokio::task::spawn_blocking(move || solve(&challenge, &fan, bits as u32))
                        .await
                        .map_err(|_| {
                            Box::new(TransactionError::InvalidMethod {
                                method: reqwest::Method::OPTIONS,
                            })
                        })?;
                pow = Some(json!({ "challenge": reply.body["challenge"], "nonce": nonce.1 }));
                due = Instant::now();
            }
            Some(410) => {
                run.sold_out_seen.store(true, Ordering::Release);
                return Ok("told sold out at the door");
            }
            Some(409 | 429 | 503) if reply.retry_after.is_some() => due = honour(&reply).await,
            _ => return Ok("join failed"),
        }
    };

    // Wait in line at the pace the server sets, from the join's answer on.
    let status_path = format!("/v1/events/{e}/queue/status");
    due = match first_poll {
        Some(wait) => {
            let at = Instant::now() + wait.min(Duration::from_secs(30));
            tokio::time::sleep_until(at).await;
            at
        }
        None => Instant::now(),
    };
    let (access, expires_at) = loop {
        if run.stopping() {
            return Ok("cut off by the end of the run");
        }
        let mut call = Call::new(Step::Status, GooseMethod::Get, &status_path, due);
        call.token = Some(&ticket);
        let reply = send(user, run, call).await?;
        match reply.status {
            Some(200) if reply.body["state"] == "admitted" => {
                let expires: Option<DateTime<Utc>> = reply.body["expires_at"]
                    .as_str()
                    .and_then(|t| t.parse().ok());
                match (reply.body["access_token"].as_str(), expires) {
                    (Some(token), Some(expires)) => break (token.to_owned(), expires),
                    _ => {
                        run.journey_error("admitted without an access token");
                        return Ok("admitted without a token");
                    }
                }
            }
            Some(200) => {
                record.waiting_until_ms = Some(Utc::now().timestamp_millis());
                due = honour(&reply).await;
            }
            Some(410) => {
                if matches!(reply.slug.as_deref(), Some("sold-out" | "closed")) {
                    run.sold_out_seen.store(true, Ordering::Release);
                    record.concluded = true;
                    return Ok("waited, then told sold out");
                }
                return Ok("admission lapsed before the fan saw it");
            }
            Some(429 | 503) if reply.retry_after.is_some() => due = honour(&reply).await,
            _ => return Ok("status failed"),
        }
    };
    record.admitted_ms = Some(expires_at.timestamp_millis() - event.access_ttl_s as i64 * 1000);
    record.admissions = 1;
    record.concluded = true;

    // Abandon, misbehave or buy.
    let (abandon, attack, quantity) = {
        let mut rng = rand::thread_rng();
        let roll: f64 = rng.gen();
        // Waiting out a long admission would hold the run open that long.
        let kinds: &[Attack] = if event.access_ttl_s <= 60 {
            &[Attack::Replay, Attack::Expired, Attack::TooMany]
        } else {
            &[Attack::Replay, Attack::TooMany]
        };
        let attack = (roll < run.crowd.misbehave).then(|| kinds[rng.gen_range(0..kinds.len())]);
        let abandon = attack.is_none() && roll < run.crowd.misbehave + run.crowd.abandon;
        (
            abandon,
            attack,
            rng.gen_range(1..=event.per_fan_limit.max(1)),
        )
    };
    if abandon {
        return Ok("admitted, abandoned");
    }
    let buy_path = format!("/v1/events/{e}/orders");
    if let Some(attack @ (Attack::Expired | Attack::TooMany)) = attack {
        if attack == Attack::Expired {
            // Past the token's expiry and the verifier's 5 s leeway.
            let wait =
                (expires_at - Utc::now()).to_std().unwrap_or_default() + Duration::from_secs(6);
            tokio::time::sleep(wait).await;
            if run.stopping() {
                return Ok("cut off by the end of the run");
            }
        }
        let mut call = Call::new(Step::Attack, GooseMethod::Post, &buy_path, Instant::now());
        call.attack = Some(attack);
        call.token = Some(&access);
        call.idempotency_key = Some(&fan_id);
        let too_many = event.per_fan_limit + 1;
        call.body =
            Some(json!({ "quantity": if attack == Attack::TooMany { too_many } else { 1 } }));
        send(user, run, call).await?;
        if attack == Attack::Expired {
            return Ok("misbehaved: bought with an expired token");
        }
    }

    // Buy, retrying a 503 or 429 (and a 409 `seats-held`: every seat held by
    // fans still paying, with the renewed access token it carries) with the
    // same Idempotency-Key.
    let mut access = access;
    let key = format!("{fan_id}-buy");
    due = Instant::now();
    let bought_at = due;
    let mut tries = 0;
    let order = loop {
        if run.stopping() {
            return Ok("cut off by the end of the run");
        }
        tries += 1;
        let mut call = Call::new(Step::Buy, GooseMethod::Post, &buy_path, due);
        call.token = Some(&access);
        call.idempotency_key = Some(&key);
        call.body = Some(json!({ "quantity": quantity }));
        let reply = send(user, run, call).await?;
        match reply.status {
            Some(202) => match (
                reply.body["order_id"].as_str(),
                reply.body["order_token"].as_str(),
            ) {
                (Some(id), Some(token)) => break (id.to_owned(), token.to_owned()),
                _ => {
                    run.journey_error("a purchase accepted without its order");
                    return Ok("bought without an order");
                }
            },
            // The order service's "only n seats left" is a 410 too: only the
            // edge's own answers end the sale's arrivals.
            Some(410) => return Ok("admitted, sold out before buying"),
            Some(409) if reply.slug.as_deref() == Some("seats-held") => {
                if tries >= 10 {
                    return Ok("admitted, every seat stayed held");
                }
                if let Some(renewed) = reply.body["admission"]["access_token"].as_str() {
                    access = renewed.to_owned();
                }
                due = honour(&reply).await;
            }
            Some(429 | 503) if reply.retry_after.is_some() && tries < 10 => {
                due = honour(&reply).await
            }
            Some(429 | 503) => {
                run.journey_error("a purchase refused ten times");
                return Ok("purchase failed");
            }
            _ => return Ok("purchase failed"),
        }
    };
    if attack == Some(Attack::Replay) {
        let mut call = Call::new(Step::Attack, GooseMethod::Post, &buy_path, Instant::now());
        call.attack = Some(Attack::Replay);
        call.token = Some(&access);
        let other = format!("{fan_id}-again");
        call.idempotency_key = Some(&other);
        call.body = Some(json!({ "quantity": 1 }));
        send(user, run, call).await?;
    }

    // Follow the order to a final state, then fetch the tickets.
    let (order_id, order_token) = order;
    let order_path = format!("/v1/orders/{order_id}");
    let deadline = Instant::now() + Duration::from_secs(120);
    due = Instant::now();
    let tickets_url = loop {
        if run.stopping() || Instant::now() > deadline {
            return Ok("bought, gave up following the order");
        }
        let mut call = Call::new(Step::Order, GooseMethod::Get, &order_path, due);
        call.token = Some(&order_token);
        let reply = send(user, run, call).await?;
        if reply.is(200) {
            match reply.body["status"].as_str() {
                Some("confirmed") => {
                    if let Some(url) = reply.body["tickets_url"].as_str() {
                        let confirmed = reply.done.saturating_duration_since(bought_at);
                        run.confirm
                            .lock()
                            .expect("not poisoned")
                            .saturating_record((confirmed.as_micros() as u64).max(1));
                        break url.to_owned();
                    }
                }
                Some("failed" | "cancelled") => return Ok("bought, order failed"),
                _ => {}
            }
        } else if !(reply.is(429) || reply.is(503)) {
            return Ok("following the order failed");
        }
        due = if reply.retry_after.is_some() {
            honour(&reply).await
        } else {
            let next = Instant::now() + Duration::from_millis(500);
            tokio::time::sleep_until(next).await;
            next
        };
    };
    let mut call = Call::new(
        Step::Tickets,
        GooseMethod::Get,
        &tickets_url,
        Instant::now(),
    );
    call.token = Some(&order_token);
    let reply = send(user, run, call).await?;
    if reply.is(200)
        && reply.content_type.starts_with("application/pdf")
        && reply.bytes.starts_with(b"%PDF")
    {
        Ok(if attack == Some(Attack::Replay) {
            "misbehaved: replayed a spent token"
        } else if attack == Some(Attack::TooMany) {
            "misbehaved: asked for too many seats, then bought"
        } else {
            "bought, confirmed, tickets downloaded"
        })
    } else {
        if reply.is(200) {
            run.journey_error("a ticket download that is not a PDF");
        }
        Ok("tickets could not be downloaded")
    }
}

/// Proof of work as the fan page does it: a nonce such that
/// SHA-256(`challenge:fan_id:nonce`) starts with `bits` zero bits.
/// Returns (hashes tried, nonce).
pub fn solve(challenge: &str, fan_id: &str, bits: u32) -> (u64, String) {
    for n in 0u64.. {
        let digest = Sha256::digest(format!("{challenge}:{fan_id}:{n}"));
        let mut zeros = 0;
        for byte in digest {
            zeros += byte.leading_zeros();
            if byte != 0 {
                break;
            }
        }
        if zeros >= bits {
            return (n + 1, n.to_string());
        }
    }
    unreachable!("some nonce meets any difficulty up to 256 bits")
}

/// The latency figures of one request name, for the reports.
#[derive(Debug, Clone, Serialize)]
pub struct LatencySummary {
    pub request: String,
    pub count: u64,
    pub raw_ms: Percentiles,
    pub corrected_ms: Percentiles,
}

#[derive(Debug, Clone, Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

pub fn percentiles(h: &Histogram<u64>) -> Percentiles {
    let ms = |v: u64| v as f64 / 1000.0;
    Percentiles {
        p50: ms(h.value_at_quantile(0.50)),
        p95: ms(h.value_at_quantile(0.95)),
        p99: ms(h.value_at_quantile(0.99)),
        max: ms(h.max()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proof_of_work_meets_the_difficulty() {
        let (tries, nonce) = solve("c", "fan", 8);
        let digest = Sha256::digest(format!("c:fan:{nonce}"));
        assert_eq!(digest[0], 0);
        assert!(tries >= 1);
    }
}
