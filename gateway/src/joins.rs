//! The join's Redis work, batched. Each join is one fan in a call of the
//! join script (`join.lua`). Each event has a lane of its own: a join that
//! finds fewer than [`IN_FLIGHT`] of its event's calls with Redis goes at
//! once, alone, from its own task; one that finds them all out waits, and
//! every join waiting when a call comes back goes in the next one (up to
//! [`MAX_BATCH`] fans), in the order they came, from a task of their own. A
//! quiet line waits for nothing; a busy one pays Lua's cost once a call
//! rather than once a fan. An event whose Redis stalls (a Cluster shard
//! failing over) holds up no other event's joins.
//!
//! A lone join calls from the request's own task: a task of its own cost
//! about 3,300 instructions a join more (`scripts/edge_cost.sh`), and a
//! wake-up from one task to the other each way.
//!
//! Why: Redis is one thread for the whole of an event's line, so the join
//! script's cost there is the ceiling of joins a second of one event, however
//! many gateways there are. Most of that cost is Lua's own (the call and each
//! `redis.call` in it), not the sorted set's: Redis 7.0.15 spends about
//! 78,000 instructions on a call of one new fan, 25,500 a fan in calls of 6
//! and 17,400 in calls of 16, against 10,400-10,900 for a whole bare `ZADD`
//! (`scripts/join_script_cost.sh`, callgrind, network handling included).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use boxoffice_contract::keys::EventKeys;
use boxoffice_contract::redis_link::RedisLink;
use metrics::Counter;
use redis::{ErrorKind, RedisError, Script};
use tokio::sync::oneshot;

/// Calls of the join script with Redis at once, per event and gateway. Two, so a
/// join that comes while one call is out still goes at once: with one, a
/// lone join behind another waits for its round trip.
pub const IN_FLIGHT: usize = 2;

/// The most fans in one call: each is four arguments and a line of answer,
/// and a call holds up every other command of Redis while it runs.
pub const MAX_BATCH: usize = 64;

/// The most joins waiting for a call, per event and gateway: past it a
/// join is refused at once (503 `overloaded`, `Retry-After: 1`) rather
/// than held in memory. At 16,000 joins a second to one gateway (the steep
/// opening of docs/scale.md spread over 11 of them) it fills in about a
/// second of stalled Redis; joins given up meanwhile still count until a
/// call comes back (they are dropped then, unsent).
pub const MAX_WAITING: usize = 256 * MAX_BATCH;

/// One fan's join, as the script takes it.
pub struct Join {
    pub keys: EventKeys,
    pub fan_id: String,
    /// The call takes the latest of its fans' (an admission that lapsed
    /// while a fan waited for the call is lapsed), and the first fan's
    /// `max_queue`: they differ by at most a round trip.
    pub now_ms: i64,
    pub max_queue: u64,
    /// The fan's place in the prequeue's shuffle; empty once the line is open.
    pub prequeue_score: String,
    /// Record a (join sequence, time) sample of the line with this join.
    pub sample: bool,
}

/// What the script did with one fan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// In line at `position` (from 1); `repeat` if it was already.
    Waiting { position: i64, repeat: bool },
    /// Admitted, until `expiry_ms`: not queued again.
    Admitted { expiry_ms: i64 },
    /// The room is full: not queued.
    RoomFull,
}

/// As the script wrote it before a new fan's place was left to the caller:
/// `waiting 3 0`, `admitted 1764676800000 1`, `room-full 0 0`.
impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Waiting { position, repeat } => {
                write!(f, "waiting {position} {}", u8::from(*repeat))
            }
            Outcome::Admitted { expiry_ms } => write!(f, "admitted {expiry_ms} 1"),
            Outcome::RoomFull => f.write_str("room-full 0 0"),
        }
    }
}

/// The script's reply for `fans` fans read into their outcomes, in their
/// order (see `join.lua`): the line's length before the call, then a line a
/// fan. A new fan put last in line has an empty line: its place is that
/// length counted on by each fan placed, up to and including it. `None` if
/// the reply is not of that form or not for that many fans.
pub fn outcomes(reply: &str, fans: usize) -> Option<Vec<Outcome>> {
    let mut lines = reply.split('\n');
    let mut placed: i64 = lines.next()?.parse().ok()?;
    let mut read = Vec::with_capacity(fans);
    for line in lines {
        let outcome = if line.is_empty() {
            placed += 1;
            Outcome::Waiting {
                position: placed,
                repeat: false,
            }
        } else {
            let mut parts = line.split(' ');
            let (outcome, a, b) = (parts.next()?, parts.next()?, parts.next()?);
            if parts.next().is_some() {
                return None;
            }
            let a: i64 = a.parse().ok()?;
            match (outcome, b) {
                ("waiting", "0") => {
                    placed += 1;
                    Outcome::Waiting {
                        position: a,
                        repeat: false,
                    }
                }
                ("waiting", "1") => Outcome::Waiting {
                    position: a,
                    repeat: true,
                },
                ("admitted", "1") => Outcome::Admitted { expiry_ms: a },
                ("room-full", "0") if a == 0 => Outcome::RoomFull,
                _ => return None,
            }
        };
        read.push(outcome);
    }
    (read.len() == fans).then_some(read)
}

type Answer = Result<Outcome, RedisError>;

struct Waiting {
    join: Join,
    answer: oneshot::Sender<Answer>,
}

#[derive(Default)]
struct Lane {
    waiting: VecDeque<Waiting>,
    in_flight: usize,
}

impl Lane {
    fn next_batch(&mut self) -> Vec<Waiting> {
        // A join given up while it waited (its client gone, its deadline
        // past) is not sent: under a stalled Redis they would pile up, and
        // go before the fans still asking once it answers.
        self.waiting.retain(|waiting| !waiting.answer.is_closed());
        let fans = self.waiting.len().min(MAX_BATCH);
        self.waiting.drain(..fans).collect()
    }
}

/// The lanes by event, hashed by `foldhash` (the keys are the gateway's
/// own, made from an event id checked to exist; SipHash cost about 600
/// instructions more a lone join, in callgrind).
type Lanes = HashMap<EventKeys, Lane, foldhash::fast::RandomState>;

/// The gateway's joins on their way to Redis.
pub struct Joins {
    redis: RedisLink,
    script: Script,
    /// One lane an event, kept once made (an event is checked to exist
    /// before its first join gets here).
    lanes: Mutex<Lanes>,
    calls: AtomicU64,
    /// `boxoffice_join_calls_total` and `boxoffice_join_fans_total`, looked
    /// up at the first call (after the recorder is installed), not at each.
    counters: OnceLock<(Counter, Counter)>,
}

impl Joins {
    pub fn new(redis: RedisLink) -> Self {
        Self {
            redis,
            script: Script::new(include_str!("join.lua")),
            lanes: Mutex::default(),
            calls: AtomicU64::new(0),
            counters: OnceLock::new(),
        }
    }

    /// Joins one fan: what the script did with it.
    pub async fn join(self: &Arc<Self>, join: Join) -> Answer {
        let turn = {
            let mut lanes = self.lanes();
            if !lanes.contains_key(&join.keys) {
                lanes.insert(join.keys.clone(), Lane::default());
            }
            let Some(lane) = lanes.get_mut(&join.keys) else {
                unreachable!("the lane was just made")
            };
            let free = lane.in_flight < IN_FLIGHT;
            if lane.waiting.len() >= MAX_WAITING {
                return Err(RedisError::from((
                    ErrorKind::ClientError,
                    "too many joins waiting for Redis",
                )));
            }
            let place = free.then(|| {
                // Held from here: given back even if the call never ends.
                lane.in_flight += 1;
                Place {
                    joins: Arc::clone(self),
                    keys: join.keys.clone(),
                    held: true,
                    passes_on: false,
                }
            });
            match place {
                // A free place and nobody waiting (the usual case, unless
                // the line is busier than two calls at once can take): the
                // join calls in its own task, with no other to wake.
                Some(place) if lane.waiting.is_empty() => Turn::Alone(place, join),
                place => {
                    let (answer, answered) = oneshot::channel();
                    lane.waiting.push_back(Waiting { join, answer });
                    Turn::Waits(place.map(|place| (place, lane.next_batch())), answered)
                }
            }
        };
        match turn {
            Turn::Alone(place, join) => place.alone(join).await,
            Turn::Waits(sends, answered) => {
                // A task of its own, so a request given up (its client
                // gone, its deadline past) does not take the other fans'
                // call with it.
                if let Some((place, batch)) = sends {
                    tokio::spawn(place.send(batch));
                }
                answered.await.unwrap_or_else(|_| {
                    Err(RedisError::from((
                        ErrorKind::IoError,
                        "the join's call to Redis was lost",
                    )))
                })
            }
        }
    }

    /// Calls of the script made so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    fn lanes(&self) -> MutexGuard<'_, Lanes> {
        // Nothing panics with the lock held; if something did, the lanes
        // are still whole (a push, a take, a count).
        self.lanes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One call of the script for `fans`, all of one event, and each
    /// fan's answer sent back.
    async fn call(&self, fans: Vec<Waiting>) {
        let reply = self.call_script(fans.iter().map(|fan| &fan.join)).await;
        match reply {
            Ok(reply) => match outcomes(&reply, fans.len()) {
                Some(outcomes) => {
                    for (fan, outcome) in fans.into_iter().zip(outcomes) {
                        // The request may have been given up: nobody to tell.
                        let _ = fan.answer.send(Ok(outcome));
                    }
                }
                None => {
                    let error = unreadable(fans.len(), &reply);
                    for fan in fans {
                        let _ = fan.answer.send(Err(error()));
                    }
                }
            },
            Err(error) => {
                for fan in fans {
                    let _ = fan.answer.send(Err(RedisError::from((
                        error.kind(),
                        "the join's call to Redis failed",
                        error.to_string(),
                    ))));
                }
            }
        }
    }

    /// One call of the script for one join: its outcome.
    async fn call_one(&self, join: &Join) -> Answer {
        let reply = self.call_script(std::iter::once(join)).await?;
        match outcomes(&reply, 1).as_deref() {
            Some(&[outcome]) => Ok(outcome),
            _ => Err(unreadable(1, &reply)()),
        }
    }

    /// One call of the script for `joins`, all of one event: its reply
    /// (see [`outcomes`]).
    async fn call_script<'a>(
        &self,
        joins: impl Iterator<Item = &'a Join> + Clone,
    ) -> Result<String, RedisError> {
        let Some(call) = script_call(self.script.get_hash(), joins.clone()) else {
            return Ok(String::new());
        };
        self.calls.fetch_add(1, Ordering::Relaxed);
        // Their ratio is the fans a call: how much of Lua's cost batching
        // saves Redis (near 1: the joins come slower than Redis answers).
        let (calls, fans_sent) = self.counters.get_or_init(|| {
            (
                metrics::counter!("boxoffice_join_calls_total"),
                metrics::counter!("boxoffice_join_fans_total"),
            )
        });
        calls.increment(1);
        let fans = joins.clone().count();
        fans_sent.increment(fans as u64);
        let mut redis = self.redis.clone();
        match call.query_async(&mut redis).await {
            // Redis restarted or its scripts were flushed: load it and
            // send the same call again, as `Script` does.
            Err(error) if error.kind() == ErrorKind::NoScriptError => {
                self.script.load_async(&mut redis).await?;
                call.query_async(&mut redis).await
            }
            answer => answer,
        }
    }
}

/// The call of the script (`EVALSHA` of `hash`) for `joins`, all of one
/// event, the first of them at least: its keys, then `now` (the latest of
/// theirs), the first's `max_queue`, the sample flag (set if any asks), the
/// prequeue flag and the ids, then the prequeue scores if one of them has
/// one (see `join.lua`); `None` for no joins.
fn script_call<'a>(
    hash: &str,
    joins: impl Iterator<Item = &'a Join> + Clone,
) -> Option<redis::Cmd> {
    let mut all = joins.clone();
    let first = all.next()?;
    let fans = 1 + all.count();
    let now_ms = joins.clone().map(|join| join.now_ms).max();
    // EVALSHA written straight into one command, as `Script`'s invocation
    // would send it, without its copy of every key and argument in a `Vec`
    // of their own first; and sized once, not grown a piece at a time
    // (about 1,700 instructions of a lone join's 73,000, in callgrind, built
    // with cargo's default release profile).
    let bytes = joins
        .clone()
        .map(|join| join.fan_id.len() + join.prequeue_score.len())
        .sum::<usize>();
    // Each fan's prequeue score, after the ids, only while the line is not
    // open for one of them: from opening, a fan is its id alone.
    let prequeue = joins.clone().any(|join| !join.prequeue_score.is_empty());
    let mut call = redis::Cmd::with_capacity(11 + 2 * fans, 512 + bytes);
    call.arg("EVALSHA")
        .arg(hash)
        .arg(4)
        .arg(first.keys.queue_arg())
        .arg(first.keys.seq_arg())
        .arg(first.keys.active_arg())
        .arg(first.keys.joins_arg())
        .arg(now_ms.unwrap_or(first.now_ms))
        .arg(first.max_queue)
        .arg(if joins.clone().any(|join| join.sample) {
            "1"
        } else {
            "0"
        })
        .arg(if prequeue { "1" } else { "0" });
    for join in joins.clone() {
        call.arg(&join.fan_id);
    }
    if prequeue {
        for join in joins {
            call.arg(&join.prequeue_score);
        }
    }
    Some(call)
}

/// The script's reply could not be read for its fans (another number of
/// lines, an outcome it does not give: a bug): logged once a call, and the
/// error each fan gets.
fn unreadable(fans: usize, reply: &str) -> impl Fn() -> RedisError {
    tracing::error!(fans, %reply, "the join script answered something unexpected");
    || {
        RedisError::from((
            ErrorKind::ResponseError,
            "the join script answered something unexpected",
        ))
    }
}

/// What a join does once its event's lane is looked at.
enum Turn {
    /// A place was free and nobody waited: it calls alone, in its own task.
    Alone(Place, Join),
    /// It waits for a call's answer: the call of the task it starts (with
    /// the place it took and the batch it heads), or of a call already out.
    Waits(Option<(Place, Vec<Waiting>)>, oneshot::Receiver<Answer>),
}

/// One of an event's [`IN_FLIGHT`] places, given back (or handed on, if
/// a lone join's) if its task ends another way than by finding nothing
/// waiting (a request given up, a panic, or the runtime shutting down,
/// before or after the task first ran).
struct Place {
    joins: Arc<Joins>,
    keys: EventKeys,
    held: bool,
    /// Held by a join calling alone: if the join is given up during its
    /// call, the joins that came meanwhile are handed on as at its end.
    passes_on: bool,
}

impl Place {
    /// Calls the script for `batch`, then for whatever of its event waited
    /// meanwhile, until nothing waits.
    async fn send(mut self, mut batch: Vec<Waiting>) {
        loop {
            self.joins.call(batch).await;
            let mut lanes = self.joins.lanes();
            let Some(lane) = lanes.get_mut(&self.keys) else {
                return;
            };
            batch = lane.next_batch();
            if batch.is_empty() {
                // Given back under the same lock a join checks it with, so
                // none is left waiting with no call to take it.
                lane.in_flight -= 1;
                self.held = false;
                return;
            }
        }
    }

    /// Calls the script for one join in the join's own task, then gives
    /// the place back or hands it on.
    async fn alone(mut self, join: Join) -> Answer {
        self.passes_on = true;
        let answer = self.joins.call_one(&join).await;
        self.pass_on();
        answer
    }

    /// Gives the place back if nothing of its event waits, or hands it,
    /// with the joins that wait, to a task of their own (as [`Self::send`]
    /// goes on, but without holding up the answer of the join that called).
    fn pass_on(&mut self) {
        if !self.held {
            return;
        }
        self.held = false;
        let batch = {
            let mut lanes = self.joins.lanes();
            let Some(lane) = lanes.get_mut(&self.keys) else {
                return;
            };
            let batch = lane.next_batch();
            // Given back under the same lock a join checks it with, so
            // none is left waiting with no call to take it.
            if batch.is_empty() || tokio::runtime::Handle::try_current().is_err() {
                lane.in_flight -= 1;
                return;
            }
            batch
        };
        let next = Place {
            joins: Arc::clone(&self.joins),
            keys: self.keys.clone(),
            held: true,
            passes_on: false,
        };
        tokio::spawn(next.send(batch));
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if self.passes_on {
            self.pass_on();
        } else if self.held {
            if let Some(lane) = self.joins.lanes().get_mut(&self.keys) {
                lane.in_flight -= 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting(fan: &str) -> (Waiting, oneshot::Receiver<Answer>) {
        let (answer, answered) = oneshot::channel();
        let join = Join {
            keys: EventKeys::new("p", "e"),
            fan_id: fan.to_owned(),
            now_ms: 0,
            max_queue: 10,
            prequeue_score: String::new(),
            sample: false,
        };
        (Waiting { join, answer }, answered)
    }

    /// The joins given up are dropped from the lane, and a lane of nothing
    /// but given-up joins gives an empty batch (which gives the call's
    /// place back) rather than a call of no fans.
    #[test]
    fn a_batch_leaves_out_the_joins_given_up() {
        let mut lane = Lane::default();
        let (a, a_answer) = waiting("a");
        let (b, b_answer) = waiting("b");
        let (c, c_answer) = waiting("c");
        lane.waiting.extend([a, b, c]);
        drop(b_answer);
        let batch = lane.next_batch();
        let fans: Vec<&str> = batch.iter().map(|w| w.join.fan_id.as_str()).collect();
        assert_eq!(fans, ["a", "c"]);
        assert!(lane.waiting.is_empty());
        drop((a_answer, c_answer));
        lane.waiting.extend(batch);
        assert!(lane.next_batch().is_empty());
        assert!(lane.waiting.is_empty());
    }

    /// A new FIFO fan's place is the line's length before the call counted
    /// on by every fan placed up to it, prequeue places included; a repeat,
    /// an admitted fan and a full room count for nothing.
    #[test]
    fn a_new_fans_place_is_counted_from_the_lines_length() {
        let waiting = |position, repeat| Outcome::Waiting { position, repeat };
        assert_eq!(outcomes("7\n", 1), Some(vec![waiting(8, false)]));
        assert_eq!(
            outcomes(
                "2\n\nwaiting 1 1\nadmitted 1764676800000 1\nwaiting 1 0\n\nroom-full 0 0\n",
                7
            ),
            Some(vec![
                waiting(3, false),
                waiting(1, true),
                Outcome::Admitted {
                    expiry_ms: 1_764_676_800_000
                },
                waiting(1, false),
                waiting(5, false),
                Outcome::RoomFull,
                waiting(6, false),
            ])
        );
        for outcome in outcomes(
            "0\nwaiting 4 1\nadmitted 9 1\nroom-full 0 0\nwaiting 2 0",
            4,
        )
        .unwrap()
        {
            assert_eq!(outcomes(&format!("0\n{outcome}"), 1), Some(vec![outcome]));
        }
    }

    #[test]
    fn the_scripts_reply_is_read_whole_or_not_at_all() {
        for (reply, fans) in [
            ("0\n", 2),
            ("0\n\n", 1),
            ("", 0),
            ("", 1),
            ("x\n", 1),
            ("0\nwaiting 5", 1),
            ("0\nwaiting 5 0 1", 1),
            ("0\nwaiting five 0", 1),
            ("0\nwaiting  5 0", 1),
            ("0\nwaiting 5 2", 1),
            ("0\nadmitted 5 0", 1),
            ("0\nroom-full 1 0", 1),
            ("0\nqueued 5 0", 1),
        ] {
            assert_eq!(outcomes(reply, fans), None, "{reply:?} for {fans}");
        }
    }

    /// The call's arguments after its keys, as text.
    fn arguments(call: &redis::Cmd) -> Vec<String> {
        call.args_iter()
            .skip(7)
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                redis::Arg::Cursor => unreachable!("no cursor"),
            })
            .collect()
    }

    /// The ids go together, then the prequeue scores, all of them, if one
    /// fan of the call has one, whichever; none once the line is open.
    #[test]
    fn a_call_sends_the_prequeue_scores_if_one_fan_has_one() {
        let join = |fan: &str, now_ms, prequeue: &str, sample| Join {
            keys: EventKeys::new("p", "e"),
            fan_id: fan.to_owned(),
            now_ms,
            max_queue: 10,
            prequeue_score: prequeue.to_owned(),
            sample,
        };
        let mixed = [
            join("a", 5, "", false),
            join("b", 7, "42", true),
            join("c", 6, "", false),
        ];
        let call = script_call("sha", mixed.iter()).unwrap();
        assert_eq!(
            arguments(&call),
            ["7", "10", "1", "1", "a", "b", "c", "", "42", ""]
        );
        let open = [join("a", 5, "", false), join("b", 4, "", false)];
        let call = script_call("sha", open.iter()).unwrap();
        assert_eq!(arguments(&call), ["5", "10", "0", "0", "a", "b"]);
        assert!(script_call("sha", [].iter()).is_none());
    }

    #[test]
    fn a_batch_takes_at_most_max_batch_in_the_order_they_came() {
        let mut lane = Lane::default();
        let mut answers = Vec::new();
        for i in 0..MAX_BATCH + 3 {
            let (fan, answer) = waiting(&i.to_string());
            lane.waiting.push_back(fan);
            answers.push(answer);
        }
        let first = lane.next_batch();
        assert_eq!(first.len(), MAX_BATCH);
        assert_eq!(first[0].join.fan_id, "0");
        let rest: Vec<String> = lane
            .next_batch()
            .into_iter()
            .map(|w| w.join.fan_id)
            .collect();
        let expected: Vec<String> = (MAX_BATCH..MAX_BATCH + 3).map(|i| i.to_string()).collect();
        assert_eq!(rest, expected);
    }
}
