//! The waiting room on the real Redis, with no Postgres and no broker at all:
//! the edge answers join, status and sold-out from Redis alone. The admission
//! loop is driven tick by tick so timing is exact.

use std::time::Duration;

use admission::admitter::{Admitter, Tick};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use boxoffice_contract::event::{now_ms, prequeue_score, seed_commitment, EventConfig, Identity};
use boxoffice_contract::keys::{events_key, EventKeys};
use boxoffice_contract::redis_link::RedisLink;
use boxoffice_contract::token::{generate_ed25519_pem, KeySet};
use redis::AsyncCommands;
use serde_json::{json, Value};
use tower::ServiceExt;

#[path = "common/own_redis.rs"]
mod own_redis;
use own_redis::OwnRedis;

const SECRET: &[u8] = b"test-queue-secret-of-32-bytes-at-least";

struct Room {
    redis: RedisLink,
    prefix: String,
    keys: EventKeys,
    state: gateway::AppState,
    app: axum::Router,
}

fn config(rate: f64) -> EventConfig {
    let now = now_ms();
    {
        let mut c = EventConfig::open("Room", 1000, rate);
        c.prequeue_at_ms = now - 60_000;
        c.opens_at_ms = now - 1_000;
        c.access_ttl_s = 600;
        c.max_queue = 100_000;
        c.identity = Identity::Declared;
        c
    }
}

impl Room {
    async fn new(config: EventConfig) -> Self {
        let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
        let mut redis = boxoffice_contract::redis_link::connect(&url).await.unwrap();
        let prefix = format!("t{}", uuid::Uuid::new_v4().simple());
        let keys = EventKeys::new(&prefix, "ev");
        let _: () = redis
            .hset_multiple(keys.config(), &config.to_fields())
            .await
            .unwrap();
        let _: () = redis
            .hset_multiple(keys.stock(), &[("remaining", 1000), ("version", 1)])
            .await
            .unwrap();
        let _: () = redis.sadd(events_key(&prefix), "ev").await.unwrap();
        let gateway_config = {
            let mut c = gateway::Config::defaults();
            c.redis_url = url;
            c.redis_prefix = prefix.clone();
            c.order_service_url = "http://127.0.0.1:9".into();
            c.queue_ticket_ttl_s = 3600;
            c.order_token_ttl_s = 3600;
            c.upstream_timeout_ms = 1000;
            c.event_cache_ms = 0;
            c.per_ip_rate = 1_000_000;
            c.per_ip_burst = 1_000_000;
            c.per_client_in_flight = 1_000_000;
            c.per_fan_rate = 1_000_000;
            c.per_fan_burst = 1_000_000;
            c
        };
        let keyset = KeySet::from_pems("boxoffice", &generate_ed25519_pem(), &[], SECRET).unwrap();
        let state = gateway::AppState::new(redis.clone(), keyset, gateway_config).unwrap();
        let app = gateway::router(state.clone());
        Self {
            redis,
            prefix,
            keys,
            state,
            app,
        }
    }

    fn admitter(&self, replica: &str) -> Admitter {
        Admitter::new(
            self.redis.clone(),
            &self.prefix,
            replica,
            Duration::from_millis(1000),
            Duration::from_millis(100),
        )
    }

    async fn set(&self, field: &str, value: impl ToString) {
        let _: () = self
            .redis
            .clone()
            .hset(self.keys.config(), field, value.to_string())
            .await
            .unwrap();
    }

    async fn call(&self, request: Request<Body>) -> (StatusCode, Option<String>, Value) {
        let response = self.app.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let retry = response
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_owned());
        let content_type = response.headers().get("content-type").cloned();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
        if status.is_success() && body.is_object() {
            assert_eq!(
                content_type.as_ref().map(|v| v.to_str().unwrap()),
                Some("application/json"),
                "{body}"
            );
        }
        (status, retry, body)
    }

    async fn join(&self, fan: &str) -> (StatusCode, Option<String>, Value) {
        self.call(
            Request::post("/v1/events/ev/queue")
                .header("content-type", "application/json")
                .body(Body::from(json!({ "fan_id": fan }).to_string()))
                .unwrap(),
        )
        .await
    }

    async fn join_owned(&self, fan: String) -> (StatusCode, Option<String>, Value) {
        self.join(&fan).await
    }

    async fn status(&self, ticket: &str) -> (StatusCode, Option<String>, Value) {
        self.call(
            Request::get("/v1/events/ev/queue/status")
                .header("authorization", format!("Bearer {ticket}"))
                .body(Body::empty())
                .unwrap(),
        )
        .await
    }

    async fn info(&self) -> Value {
        self.call(Request::get("/v1/events/ev").body(Body::empty()).unwrap())
            .await
            .2
    }

    /// Admitted fans in admission order (the active set's score is the expiry,
    /// which grows with each tick).
    async fn admitted(&self) -> Vec<String> {
        self.redis
            .clone()
            .zrange(self.keys.active(), 0, -1)
            .await
            .unwrap()
    }

    async fn cleanup(mut self) {
        let keys: Vec<String> = self.redis.keys(format!("{}:*", self.prefix)).await.unwrap();
        let _: () = self.redis.del(keys).await.unwrap();
    }
}

fn slug(body: &Value) -> &str {
    body["type"]
        .as_str()
        .unwrap_or_default()
        .rsplit('/')
        .next()
        .unwrap()
}

#[tokio::test]
async fn prequeue_fans_go_first_in_the_published_seed_order_then_fifo() {
    let mut config = config(10.0);
    config.opens_at_ms = now_ms() + 3_600_000;
    let room = Room::new(config).await;
    let before = room.info().await;
    assert_eq!(before["state"], "prequeue");
    assert!(
        before["shuffle_seed"].is_null(),
        "the seed stays secret until opening"
    );
    let commitment = before["shuffle_commitment"].as_str().unwrap().to_owned();

    let early: Vec<String> = (0..200).map(|i| format!("early-{i}")).collect();
    for fan in &early {
        assert_eq!(room.join(fan).await.0, StatusCode::CREATED);
    }
    // Ops open the doors.
    room.set("opens_at_ms", now_ms() - 1).await;
    let late: Vec<String> = (0..200).map(|i| format!("late-{i}")).collect();
    for (i, fan) in late.iter().enumerate() {
        let (status, _, body) = room.join(fan).await;
        assert_eq!(status, StatusCode::CREATED);
        assert_eq!(
            body["position"],
            201 + i,
            "a late fan queues behind every earlier one"
        );
    }

    let after = room.info().await;
    assert_eq!(after["shuffle_commitment"], commitment.as_str());
    let seed = after["shuffle_seed"].as_str().unwrap();
    assert_eq!(
        seed_commitment(seed),
        commitment,
        "the published seed matches its commitment"
    );
    let mut expected = early.clone();
    expected.sort_by_key(|fan| (prequeue_score(seed, fan), fan.clone()));
    assert_ne!(expected, early, "the prequeue is shuffled, not FIFO");
    expected.extend(late.iter().cloned());

    // One fan per 100 ms tick, so the admission order is observable.
    let admitter = room.admitter("a");
    let start = now_ms();
    for tick in 0..=400 {
        admitter.tick_event("ev", start + tick * 100).await.unwrap();
    }
    assert_eq!(room.admitted().await, expected);
    room.cleanup().await;
}

#[tokio::test]
async fn repeat_join_keeps_the_place_and_status_reports_it() {
    let room = Room::new(config(4.0)).await;
    for fan in ["a", "b", "c"] {
        room.join(fan).await;
    }
    let (status, retry, body) = room.join("b").await;
    assert_eq!(
        (status, body["position"].as_i64()),
        (StatusCode::OK, Some(2))
    );
    let samples: Vec<String> = room
        .redis
        .clone()
        .zrange(room.keys.joins(), 0, -1)
        .await
        .unwrap();
    assert_eq!(
        samples.len(),
        1,
        "one (sequence, time) sample a second: {samples:?}"
    );
    assert!(samples[0].starts_with("1:"));
    assert!(retry.is_some());
    let (status, retry, waiting) = room.status(body["queue_ticket"].as_str().unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (waiting["state"].as_str(), waiting["position"].as_i64()),
        (Some("waiting"), Some(2))
    );
    assert_eq!(waiting["eta_seconds"], 1, "2 fans at 4 fans/s");
    let retry: u64 = retry.unwrap().parse().unwrap();
    assert!((1..=30).contains(&retry));
    room.cleanup().await;
}

#[tokio::test]
async fn a_full_room_answers_429_with_retry_after() {
    let mut config = config(1.0);
    config.max_queue = 3;
    let room = Room::new(config).await;
    for fan in ["a", "b", "c"] {
        assert_eq!(room.join(fan).await.0, StatusCode::CREATED);
    }
    let (status, retry, body) = room.join("d").await;
    assert_eq!(
        (status, slug(&body)),
        (StatusCode::TOO_MANY_REQUESTS, "room-full")
    );
    assert!(retry.is_some());
    assert_eq!(
        room.join("a").await.0,
        StatusCode::OK,
        "those inside can still check in"
    );
    room.cleanup().await;
}

/// Joins that come together share calls of the join script (`joins.rs`),
/// and each is answered as if it had come alone: a place of its own for
/// every new fan, the same place for a fan who joined twice at once.
#[tokio::test]
async fn joins_that_come_together_share_script_calls_and_each_keeps_its_own_place() {
    let room = Room::new(config(1.0)).await;
    let fans: Vec<String> = (0..150).map(|i| format!("fan-{i}")).collect();
    // Every third fan joins twice, at the same time.
    let joins = fans.iter().chain(fans.iter().step_by(3));
    let answers = futures_util::future::join_all(joins.map(|fan| room.join(fan))).await;
    assert!(
        room.state.joins.calls() < answers.len() as u64 / 2,
        "{} joins in {} calls",
        answers.len(),
        room.state.joins.calls()
    );
    let mut places = std::collections::HashMap::new();
    let mut created = 0;
    for (fan, (status, _, body)) in fans.iter().chain(fans.iter().step_by(3)).zip(&answers) {
        assert!(status.is_success(), "{status} {body}");
        created += usize::from(*status == StatusCode::CREATED);
        let place = body["position"].as_u64().unwrap();
        assert_eq!(*places.entry(fan.clone()).or_insert(place), place, "{fan}");
    }
    assert_eq!(created, fans.len(), "one 201 per fan, a 200 for the other");
    let mut sorted: Vec<u64> = places.values().copied().collect();
    sorted.sort_unstable();
    assert_eq!(sorted, (1..=150).collect::<Vec<u64>>());
    let mut redis = room.redis.clone();
    let queued: u64 = redis.zcard(room.keys.queue()).await.unwrap();
    let seq: u64 = redis.get(room.keys.seq()).await.unwrap();
    assert_eq!((queued, seq), (150, 150));
    // The line's order is the places given.
    let line: Vec<String> = redis.zrange(room.keys.queue(), 0, -1).await.unwrap();
    for (rank, fan) in line.iter().enumerate() {
        assert_eq!(places[fan], rank as u64 + 1, "{fan}");
    }
    room.cleanup().await;
}

#[tokio::test]
async fn joins_that_come_together_never_overfill_the_room() {
    let mut config = config(1.0);
    config.max_queue = 40;
    let room = Room::new(config).await;
    let answers =
        futures_util::future::join_all((0..120).map(|i| room.join_owned(format!("fan-{i}")))).await;
    let created = answers
        .iter()
        .filter(|(status, _, _)| *status == StatusCode::CREATED)
        .count();
    let full = answers
        .iter()
        .filter(|(status, _, body)| {
            *status == StatusCode::TOO_MANY_REQUESTS && slug(body) == "room-full"
        })
        .count();
    assert_eq!((created, full), (40, 80));
    let queued: u64 = room.redis.clone().zcard(room.keys.queue()).await.unwrap();
    assert_eq!(queued, 40);
    room.cleanup().await;
}

/// One call of the join script with many fans: each answered as it would
/// be alone, in order (the call `joins.rs` makes for joins that came
/// together), whatever their mix.
#[tokio::test]
async fn one_call_of_the_join_script_answers_each_fan_as_if_alone() {
    let room = Room::new(config(1.0)).await;
    let mut redis = room.redis.clone();
    let caller = room.redis.clone();
    let keys = &room.keys;
    let now = now_ms();
    let script = redis::Script::new(include_str!("../src/join.lua"));
    let call = |max_queue: u64, fans: &[(&str, &str)]| {
        let mut invocation = script.key(keys.queue());
        invocation
            .key(keys.seq())
            .key(keys.active())
            .key(keys.joins())
            .arg(now)
            .arg(max_queue)
            .arg("1")
            .arg("1");
        for (fan, _) in fans {
            invocation.arg(*fan);
        }
        for (_, prequeue) in fans {
            invocation.arg(*prequeue);
        }
        let mut redis = caller.clone();
        let count = fans.len();
        async move {
            let reply: String = invocation.invoke_async(&mut redis).await.unwrap();
            // Each fan's outcome as the gateway reads it, written as the
            // script once wrote it (`waiting 3 0`).
            gateway::joins::outcomes(&reply, count)
                .unwrap_or_else(|| panic!("an unreadable reply: {reply:?}"))
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        call(10, &[("a", ""), ("b", "")]).await,
        ["waiting 1 0", "waiting 2 0"]
    );
    let _: () = redis
        .zadd(keys.active(), "admitted", now + 60_000)
        .await
        .unwrap();
    let _: () = redis.zadd(keys.active(), "lapsed", now - 1).await.unwrap();
    let answers = call(
        6,
        &[
            ("c", ""),
            ("a", ""),
            ("admitted", ""),
            ("c", ""),
            ("early", "5"),
            ("c", ""),
            ("lapsed", ""),
            ("d", ""),
            ("e", ""),
            ("b", ""),
        ],
    )
    .await;
    let admitted = format!("admitted {} 1", now + 60_000);
    assert_eq!(
        answers,
        [
            "waiting 3 0",     // c: new, last in line
            "waiting 1 1",     // a: already in line
            admitted.as_str(), // admitted: not queued again
            "waiting 3 1",     // c again, in the same call
            "waiting 1 0",     // a prequeue place goes ahead of all
            "waiting 4 1",     // c, one more ahead of it now
            "waiting 5 0",     // an admission that lapsed: queued anew
            "waiting 6 0",     // d: the sixth and last place
            "room-full 0 0",   // e: the room holds six
            "waiting 3 1",     // b: in line, full room or not
        ]
    );
    let line: Vec<(String, f64)> = redis.zrange_withscores(keys.queue(), 0, -1).await.unwrap();
    let line: Vec<(&str, f64)> = line.iter().map(|(fan, s)| (fan.as_str(), *s)).collect();
    let fifo = 281_474_976_710_656.0;
    assert_eq!(
        line,
        [
            ("early", 5.0),
            ("a", fifo + 1.0),
            ("b", fifo + 2.0),
            ("c", fifo + 3.0),
            ("lapsed", fifo + 4.0),
            ("d", fifo + 5.0),
        ]
    );
    let seq: u64 = redis.get(keys.seq()).await.unwrap();
    assert_eq!(seq, 5, "one sequence number per new FIFO fan");
    let samples: Vec<String> = redis.zrange(keys.joins(), 0, -1).await.unwrap();
    assert_eq!(samples, [format!("2:{now}"), format!("5:{now}")]);
    room.cleanup().await;
}

/// Holds every write and script on the Redis of `redis` (`CLIENT PAUSE …
/// WRITE`, for 20 s at most), or lets them go on.
async fn pause_writes(redis: &mut RedisLink, pause: bool) {
    let mut command = redis::cmd("CLIENT");
    if pause {
        command.arg("PAUSE").arg(20_000).arg("WRITE");
    } else {
        command.arg("UNPAUSE");
    }
    let _: () = command.query_async(redis).await.unwrap();
}

/// While Redis stalls, joins wait in the gateway for a call of the script,
/// but no more than `MAX_WAITING` of them: the rest are refused at once. A
/// join given up while it waited is not sent when Redis answers again.
/// Against a Redis of this test's own, paused with `CLIENT PAUSE … WRITE`
/// (which holds every script).
#[tokio::test]
async fn while_redis_stalls_the_waiting_joins_are_bounded_and_given_up_ones_are_not_sent() {
    use gateway::joins::{Join, Joins, IN_FLIGHT, MAX_WAITING};
    let server = OwnRedis::start().await;
    let url = server.url.clone();
    let mut redis = boxoffice_contract::redis_link::connect(&url).await.unwrap();
    // A connection of their own: the paused one would hold the UNPAUSE
    // behind the scripts it is pipelining.
    let joined = boxoffice_contract::redis_link::connect(&url).await.unwrap();
    let joins = std::sync::Arc::new(Joins::new(joined));
    let keys = EventKeys::new("stall", "ev");
    pause_writes(&mut redis, true).await;
    let refused = 100;
    let tasks: Vec<_> = (0..IN_FLIGHT + MAX_WAITING + refused)
        .map(|i| {
            let (joins, keys) = (joins.clone(), keys.clone());
            tokio::spawn(async move {
                joins
                    .join(Join {
                        keys,
                        fan_id: format!("fan-{i}"),
                        now_ms: now_ms(),
                        max_queue: 1_000_000,
                        prequeue_score: String::new(),
                        sample: false,
                    })
                    .await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (done, waiting): (Vec<_>, Vec<_>) = tasks.into_iter().partition(|t| t.is_finished());
    assert_eq!(
        done.len(),
        refused,
        "the joins past the bound answered at once"
    );
    for task in done {
        let error = task.await.unwrap().unwrap_err();
        assert_eq!(error.kind(), redis::ErrorKind::ClientError, "{error}");
    }
    // Half the waiting joins are given up (their requests dropped).
    let (mut given_up, asking): (Vec<_>, Vec<_>) = waiting
        .into_iter()
        .enumerate()
        .partition(|(i, _)| *i >= IN_FLIGHT && i % 2 == 0);
    for (_, task) in &given_up {
        task.abort();
    }
    for (_, task) in &mut given_up {
        assert!(task.await.unwrap_err().is_cancelled());
    }
    pause_writes(&mut redis, false).await;
    for (i, task) in asking {
        let answer = task.await.unwrap();
        // The first calls were out through the whole pause: past the
        // connection's response timeout (a slow machine) they answer an
        // error, though Redis still queues their fans once unpaused.
        if i < IN_FLIGHT && answer.is_err() {
            continue;
        }
        let answer = answer.unwrap().to_string();
        assert!(answer.starts_with("waiting "), "{answer}");
    }
    let queued: usize = redis.zcard(keys.queue()).await.unwrap();
    assert_eq!(queued, IN_FLIGHT + MAX_WAITING - given_up.len());
}

/// A join that finds its event's line quiet calls the script in its own
/// task, starting none; the joins that come while both places are out wait,
/// and are still sent when the joins holding the places are given up during
/// their calls (their requests dropped). Against a Redis of this test's own,
/// paused with `CLIENT PAUSE … WRITE` to hold the calls out.
#[tokio::test]
async fn a_lone_join_calls_in_its_own_task_and_hands_on_the_joins_behind_it_if_given_up() {
    use gateway::joins::{Join, Joins, IN_FLIGHT};
    let server = OwnRedis::start().await;
    let mut redis = boxoffice_contract::redis_link::connect(&server.url)
        .await
        .unwrap();
    let joins = std::sync::Arc::new(Joins::new(
        boxoffice_contract::redis_link::connect(&server.url)
            .await
            .unwrap(),
    ));
    let keys = EventKeys::new("lone", "ev");
    let join = |fan: &str| {
        let (joins, keys, fan) = (joins.clone(), keys.clone(), fan.to_owned());
        tokio::spawn(async move {
            joins
                .join(Join {
                    keys,
                    fan_id: fan,
                    now_ms: now_ms(),
                    max_queue: 1_000,
                    prequeue_score: String::new(),
                    sample: false,
                })
                .await
        })
    };
    // One join first, so the connections' own tasks are running.
    assert!(join("first")
        .await
        .unwrap()
        .unwrap()
        .to_string()
        .starts_with("waiting 1 "));
    let tasks = || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    };
    let idle = tasks();
    pause_writes(&mut redis, true).await;
    let alone: Vec<_> = (0..IN_FLIGHT)
        .map(|i| join(&format!("alone-{i}")))
        .collect();
    let behind = join("behind");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(alone.iter().chain([&behind]).all(|t| !t.is_finished()));
    assert_eq!(
        tasks() - idle,
        IN_FLIGHT + 1,
        "the joins' own tasks, and no task of a call"
    );
    for task in &alone {
        task.abort();
    }
    for task in alone {
        assert!(task.await.unwrap_err().is_cancelled());
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        tasks() - idle,
        2,
        "the waiting join, and the call handed on for it"
    );
    pause_writes(&mut redis, false).await;
    let answer = tokio::time::timeout(Duration::from_secs(10), behind)
        .await
        .expect("the join behind the given-up ones is answered")
        .unwrap()
        .unwrap();
    // Redis ran the given-up joins' calls too: they were sent.
    assert_eq!(answer.to_string(), format!("waiting {} 0", IN_FLIGHT + 2));
    let queued: usize = redis.zcard(keys.queue()).await.unwrap();
    assert_eq!(queued, IN_FLIGHT + 2);
}

/// The join script is sent by its hash; a Redis that has lost it
/// (restarted, or its scripts flushed) is sent the script and the same
/// call again, and the join is answered.
#[tokio::test]
async fn a_join_after_redis_lost_the_script_loads_it_and_is_answered() {
    use gateway::joins::{Join, Joins};
    let server = OwnRedis::start().await;
    let mut redis = boxoffice_contract::redis_link::connect(&server.url)
        .await
        .unwrap();
    let joins = std::sync::Arc::new(Joins::new(redis.clone()));
    let keys = EventKeys::new("lost", "ev");
    let join = |fan: &str| Join {
        keys: keys.clone(),
        fan_id: fan.to_owned(),
        now_ms: now_ms(),
        max_queue: 1_000,
        prequeue_score: String::new(),
        sample: false,
    };
    for (i, fan) in ["first", "second"].into_iter().enumerate() {
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut redis)
            .await
            .unwrap();
        let answer = joins.join(join(fan)).await.unwrap().to_string();
        assert!(
            answer.starts_with(&format!("waiting {} ", i + 1)),
            "{answer}"
        );
    }
    let queued: usize = redis.zcard(keys.queue()).await.unwrap();
    assert_eq!(queued, 2);
}

/// Each event has a lane of its own: joins for two events that come
/// together, on a runtime of two threads, each get a place in their own
/// event's line, and share calls only with their own event's joins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joins_for_two_events_at_once_each_get_a_place_in_their_own_line() {
    use gateway::joins::{Join, Joins};
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let mut redis = boxoffice_contract::redis_link::connect(&url).await.unwrap();
    let joins = std::sync::Arc::new(Joins::new(redis.clone()));
    let prefix = format!("t{}", uuid::Uuid::new_v4().simple());
    let events = [EventKeys::new(&prefix, "a"), EventKeys::new(&prefix, "b")];
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let (joins, keys) = (joins.clone(), events[i % 2].clone());
            tokio::spawn(async move {
                let answer = joins
                    .join(Join {
                        keys,
                        fan_id: format!("fan-{i}"),
                        now_ms: now_ms(),
                        max_queue: 1_000,
                        prequeue_score: String::new(),
                        sample: false,
                    })
                    .await;
                (i % 2, answer)
            })
        })
        .collect();
    let mut places = [Vec::new(), Vec::new()];
    for task in tasks {
        let (event, answer) = task.await.unwrap();
        let answer = answer.unwrap().to_string();
        let place: u64 = answer
            .strip_prefix("waiting ")
            .and_then(|rest| rest.strip_suffix(" 0"))
            .unwrap_or_else(|| panic!("{answer}"))
            .parse()
            .unwrap();
        places[event].push(place);
    }
    for (places, keys) in places.iter_mut().zip(&events) {
        places.sort_unstable();
        assert_eq!(*places, (1..=100).collect::<Vec<u64>>());
        let queued: u64 = redis.zcard(keys.queue()).await.unwrap();
        assert_eq!(queued, 100);
    }
    assert!(joins.calls() < 200, "{} calls", joins.calls());
    for keys in &events {
        let _: () = redis.del(&[keys.queue(), keys.seq()]).await.unwrap();
    }
}

#[tokio::test]
async fn joining_before_the_prequeue_is_409_with_the_wait() {
    let mut config = config(1.0);
    config.prequeue_at_ms = now_ms() + 90_000;
    config.opens_at_ms = now_ms() + 120_000;
    let room = Room::new(config).await;
    let (status, retry, body) = room.join("a").await;
    assert_eq!((status, slug(&body)), (StatusCode::CONFLICT, "not-open"));
    let retry: u64 = retry.unwrap().parse().unwrap();
    assert!((85..=90).contains(&retry), "{retry}");
    assert_eq!(room.info().await["state"], "scheduled");
    room.cleanup().await;
}

#[tokio::test]
async fn an_unused_admission_lapses_and_its_slot_returns() {
    let mut config = config(10.0);
    config.access_ttl_s = 1;
    config.max_active = 1;
    let room = Room::new(config).await;
    let (_, _, first) = room.join("first").await;
    let (_, _, second) = room.join("second").await;
    let admitter = room.admitter("a");
    let now = now_ms();
    admitter.tick_event("ev", now).await.unwrap();
    assert_eq!(
        admitter.tick_event("ev", now + 100).await.unwrap(),
        Tick::Led {
            admitted: 1,
            active: 1
        }
    );
    assert_eq!(
        admitter.tick_event("ev", now + 200).await.unwrap(),
        Tick::Led {
            admitted: 0,
            active: 1
        },
        "the cap holds"
    );
    let (status, _, body) = room.status(first["queue_ticket"].as_str().unwrap()).await;
    assert_eq!(
        (status, body["state"].as_str()),
        (StatusCode::OK, Some("admitted"))
    );
    assert!(body["access_token"].is_string());

    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let (status, _, body) = room.status(first["queue_ticket"].as_str().unwrap()).await;
    assert_eq!((status, slug(&body)), (StatusCode::GONE, "expired"));
    assert_eq!(
        admitter.tick_event("ev", now_ms()).await.unwrap(),
        Tick::Led {
            admitted: 1,
            active: 1
        },
        "the slot returned"
    );
    let (_, _, body) = room.status(second["queue_ticket"].as_str().unwrap()).await;
    assert_eq!(body["state"], "admitted");
    room.cleanup().await;
}

#[tokio::test]
async fn sold_out_is_answered_at_the_edge_and_stops_admission() {
    let room = Room::new(config(100.0)).await;
    let (_, _, waiting) = room.join("a").await;
    let _: () = room
        .redis
        .clone()
        .hset(room.keys.stock(), "remaining", 0)
        .await
        .unwrap();
    let (status, _, body) = room.join("b").await;
    assert_eq!((status, slug(&body)), (StatusCode::GONE, "sold-out"));
    let (status, _, body) = room.status(waiting["queue_ticket"].as_str().unwrap()).await;
    assert_eq!((status, slug(&body)), (StatusCode::GONE, "sold-out"));
    let admitter = room.admitter("a");
    let now = now_ms();
    admitter.tick_event("ev", now).await.unwrap();
    // 100 fans/s would admit 10 in this tick; sold out, none.
    assert_eq!(
        admitter.tick_event("ev", now + 100).await.unwrap(),
        Tick::Led {
            admitted: 0,
            active: 0
        }
    );
    assert_eq!(room.info().await["state"], "sold_out");
    room.cleanup().await;
}

#[tokio::test]
async fn each_event_admits_at_its_own_rate() {
    let room = Room::new(config(10.0)).await;
    let other = EventKeys::new(&room.prefix, "other");
    let mut other_config = config(30.0);
    other_config.name = "Other".into();
    let mut redis = room.redis.clone();
    let _: () = redis
        .hset_multiple(other.config(), &other_config.to_fields())
        .await
        .unwrap();
    let _: () = redis.sadd(events_key(&room.prefix), "other").await.unwrap();
    for i in 0..100 {
        let _: () = redis
            .zadd(room.keys.queue(), format!("a{i}"), i)
            .await
            .unwrap();
        let _: () = redis.zadd(other.queue(), format!("b{i}"), i).await.unwrap();
    }
    let admitter = room.admitter("a");
    let start = now_ms();
    for tick in 0..=20 {
        admitter.tick_all(start + tick * 100).await.unwrap();
    }
    let a: u64 = redis.zcard(room.keys.active()).await.unwrap();
    let b: u64 = redis.zcard(other.active()).await.unwrap();
    assert_eq!((a, b), (20, 60), "2 s at 10/s and at 30/s");
    let _: () = redis
        .del(&[
            other.config(),
            other.queue(),
            other.active(),
            other.admit(),
            other.lease(),
        ])
        .await
        .unwrap();
    room.cleanup().await;
}

#[tokio::test]
async fn the_edge_sees_a_settings_change_within_its_cache_ttl() {
    let room = Room::new(config(10.0)).await;
    let cache = gateway::cache::EventCache::new(Duration::from_millis(1_000));
    let first = cache
        .get(&room.redis, &room.keys, "ev")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.rate(), 10.0);
    room.set("rate", 99).await;
    let cached = cache
        .get(&room.redis, &room.keys, "ev")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(cached.rate(), 10.0, "within the ttl the copy is served");
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let fresh = cache
        .get(&room.redis, &room.keys, "ev")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(fresh.rate(), 99.0, "after the ttl the change is seen");
    room.set("paused", 1).await;
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert_eq!(
        cache
            .get(&room.redis, &room.keys, "ev")
            .await
            .unwrap()
            .unwrap()
            .rate(),
        0.0,
        "paused means no progress"
    );
    assert!(cache
        .get(&room.redis, &EventKeys::new(&room.prefix, "nope"), "nope")
        .await
        .unwrap()
        .is_none());
    room.cleanup().await;
}

#[tokio::test]
async fn a_proof_of_work_event_admits_only_solved_joins() {
    let mut config = config(10.0);
    config.pow_bits = 12;
    let room = Room::new(config).await;
    let (status, _, body) = room.join("lazy-bot").await;
    assert_eq!(
        (status, slug(&body)),
        (StatusCode::PRECONDITION_REQUIRED, "proof-of-work-required")
    );

    let (status, _, issued) = room
        .call(
            Request::get("/v1/events/ev/challenge")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(
        (status, issued["difficulty_bits"].as_u64()),
        (StatusCode::OK, Some(12))
    );
    let challenge = issued["challenge"].as_str().unwrap().to_owned();
    let nonce = gateway::pow::solve(&challenge, "fan-1", 12);
    let join = |fan: &'static str, challenge: String, nonce: String| {
        room.call(
            Request::post("/v1/events/ev/queue")
                .header("content-type", "application/json")
                .body(Body::from(
                    json!({ "fan_id": fan, "pow": { "challenge": challenge, "nonce": nonce } })
                        .to_string(),
                ))
                .unwrap(),
        )
    };
    let (status, _, _) = join("fan-1", challenge.clone(), nonce.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "a solved challenge joins");
    let (status, _, body) = join("fan-2", challenge.clone(), "0".into()).await;
    assert_eq!(
        (status, slug(&body)),
        (StatusCode::UNPROCESSABLE_ENTITY, "invalid-proof-of-work")
    );
    let (status, _, body) = join("fan-3", "ev.9999999999.x.forged".into(), nonce).await;
    assert_eq!(
        (status, slug(&body)),
        (StatusCode::UNPROCESSABLE_ENTITY, "invalid-proof-of-work")
    );
    room.cleanup().await;
}

#[tokio::test]
async fn the_fan_page_is_served_at_the_root() {
    let room = Room::new(config(1.0)).await;
    let response = room
        .app
        .clone()
        .oneshot(Request::get("/").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()["content-type"],
        "text/html; charset=utf-8"
    );
    let page = String::from_utf8(
        axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap()
            .to_vec(),
    )
    .unwrap();
    for needle in [
        "<title>BoxOffice waiting room</title>",
        "/queue/status",
        "Idempotency-Key",
        "Retry-After",
        "/challenge",
    ] {
        assert!(page.contains(needle), "the page lacks {needle}");
    }
    room.cleanup().await;
}
