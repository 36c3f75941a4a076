//! Open-model arrivals on top of goose, as k6's `constant-arrival-rate` and
//! `ramping-arrival-rate` executors do.
//!
//! goose users loop (a closed model): when the system slows down, the offered
//! load drops with it, and an overloaded gateway reports comfortable
//! latencies. Here fans arrive on a [`Schedule`] whatever the answers; a pool
//! of pre-started goose users takes each arrival at its scheduled instant
//! through a [`Dispatcher`]; an arrival that finds no free user is counted as
//! dropped (k6's `dropped_iterations`), never silently skipped.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{bail, Context};
use rand::Rng;
use serde::Serialize;
use tokio::time::Instant;

/// One stage: the rate moves linearly from the previous stage's target (or
/// the schedule's start rate) to `target` fans/s over `duration`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Stage {
    #[serde(serialize_with = "seconds")]
    pub duration: Duration,
    pub target: f64,
}

impl Stage {
    /// `10s→60/s`, for reports.
    pub fn describe(&self) -> String {
        format!("{:.0}s→{}/s", self.duration.as_secs_f64(), self.target)
    }
}

fn seconds<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// When fans arrive: stages of rates, evenly spaced or as a Poisson process.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Schedule {
    pub start_rate: f64,
    pub stages: Vec<Stage>,
    /// Exponential gaps at the instantaneous rate instead of even spacing.
    pub poisson: bool,
}

impl Schedule {
    /// `rate` fans/s for `duration`.
    pub fn constant(rate: f64, duration: Duration) -> Self {
        Self {
            start_rate: rate,
            stages: vec![Stage {
                duration,
                target: rate,
            }],
            poisson: false,
        }
    }

    /// Parses k6-style stages `10s:20,1m:100,30s:0` (duration:target rate),
    /// each ramping linearly from the previous target; the first starts at
    /// `start_rate`. A stage `10s:=50` jumps to 50 and holds it.
    pub fn parse_stages(start_rate: f64, text: &str) -> anyhow::Result<Self> {
        let mut schedule = Self {
            start_rate,
            stages: Vec::new(),
            poisson: false,
        };
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (duration, target) = part
                .split_once(':')
                .with_context(|| format!("stage `{part}` is not duration:rate"))?;
            let duration = parse_duration(duration)?;
            let (jump, target) = match target.strip_prefix('=') {
                Some(t) => (true, t),
                None => (false, target),
            };
            let target: f64 = target
                .trim()
                .parse()
                .with_context(|| format!("stage `{part}`: rate is not a number"))?;
            if !(target.is_finite() && target >= 0.0) {
                bail!("stage `{part}`: the rate must be 0 or more");
            }
            if jump {
                // A jump is a zero-length ramp to the target, then a hold.
                schedule.stages.push(Stage {
                    duration: Duration::ZERO,
                    target,
                });
            }
            schedule.stages.push(Stage { duration, target });
        }
        if schedule.stages.is_empty() {
            bail!("no stages in `{text}`");
        }
        Ok(schedule)
    }

    pub fn duration(&self) -> Duration {
        self.stages.iter().map(|s| s.duration).sum()
    }

    /// The rate (fans/s) at `t` seconds from the start.
    pub fn rate_at(&self, t: f64) -> f64 {
        let mut from = self.start_rate;
        let mut start = 0.0;
        for stage in &self.stages {
            let d = stage.duration.as_secs_f64();
            if t < start + d {
                return from + (stage.target - from) * (t - start) / d;
            }
            start += d;
            from = stage.target;
        }
        0.0
    }

    /// Fans expected over the whole schedule (the integral of the rate).
    pub fn expected_arrivals(&self) -> f64 {
        let mut from = self.start_rate;
        let mut total = 0.0;
        for stage in &self.stages {
            total += (from + stage.target) / 2.0 * stage.duration.as_secs_f64();
            from = stage.target;
        }
        total
    }

    /// The offsets from the start of every arrival. Evenly spaced: arrival
    /// k comes when the expected count reaches k (so one at 0). Poisson:
    /// unit exponential gaps in that same expected-count time, which is a
    /// Poisson process at the instantaneous rate (the time-change theorem).
    pub fn offsets(&self, rng: &mut impl Rng) -> Vec<Duration> {
        let mut out = Vec::new();
        let mut next = if self.poisson { exponential(rng) } else { 0.0 };
        let mut from = self.start_rate;
        let (mut stage_start, mut count_before) = (0.0, 0.0);
        for stage in &self.stages {
            let d = stage.duration.as_secs_f64();
            let (a, b) = (from, stage.target);
            let in_stage = (a + b) / 2.0 * d;
            while next < count_before + in_stage {
                let t = stage_start + inverse_ramp(a, b, d, next - count_before);
                out.push(Duration::from_secs_f64(t.max(0.0)));
                next += if self.poisson { exponential(rng) } else { 1.0 };
            }
            stage_start += d;
            count_before += in_stage;
            from = b;
        }
        out
    }
}

/// The time into a stage ramping from `a` to `b` fans/s over `d` seconds
/// by which `x` fans are expected: solves a·t + (b−a)·t²/(2d) = x.
fn inverse_ramp(a: f64, b: f64, d: f64, x: f64) -> f64 {
    let k = (b - a) / (2.0 * d);
    if k.abs() < 1e-12 {
        return if a > 0.0 { x / a } else { 0.0 };
    }
    let disc = (a * a + 4.0 * k * x).max(0.0);
    ((-a + disc.sqrt()) / (2.0 * k)).clamp(0.0, d)
}

fn exponential(rng: &mut impl Rng) -> f64 {
    let u: f64 = rng.gen_range(f64::EPSILON..1.0);
    -u.ln()
}

/// `90`, `90s`, `1500ms`, `2m`, `1h`, `1m30s`.
pub fn parse_duration(text: &str) -> anyhow::Result<Duration> {
    let text = text.trim();
    if let Ok(s) = text.parse::<f64>() {
        if s >= 0.0 && s.is_finite() {
            return Ok(Duration::from_secs_f64(s));
        }
    }
    let (mut total, mut number) = (0.0, String::new());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() || c == '.' {
            number.push(c);
            continue;
        }
        let unit = if c == 'm' && chars.peek() == Some(&'s') {
            chars.next();
            0.001
        } else {
            match c {
                'h' => 3600.0,
                'm' => 60.0,
                's' => 1.0,
                _ => bail!("`{text}` is not a duration like 90s, 2m or 1m30s"),
            }
        };
        let value: f64 = number
            .parse()
            .with_context(|| format!("`{text}` is not a duration like 90s, 2m or 1m30s"))?;
        total += value * unit;
        number.clear();
    }
    if !number.is_empty() {
        bail!("`{text}`: a unit (ms, s, m, h) must follow {number}");
    }
    Ok(Duration::from_secs_f64(total))
}

/// One fan's arrival: its number and when it was due.
#[derive(Debug, Clone, Copy)]
pub struct Arrival {
    pub seq: u64,
    pub scheduled: Instant,
}

/// Hands arrivals to free goose users. A user announces itself free
/// ([`Dispatcher::next`]); an arrival due while none is free is dropped.
pub struct Dispatcher {
    /// Users waiting for an arrival that no arrival has claimed yet. The
    /// scheduler claims one (decrements) before sending, so an arrival is
    /// only ever sent to a user that is certainly waiting for it.
    free: AtomicI64,
    /// Arrivals handed over but not yet taken up by their user: the run is
    /// not over while any is on its way.
    pending: AtomicI64,
    tx: flume::Sender<Arrival>,
    rx: flume::Receiver<Arrival>,
    offered: AtomicU64,
    dropped: AtomicU64,
    /// Set when no more arrivals will come: waiting users go home.
    finished: AtomicBool,
}

#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct ArrivalCounts {
    pub offered: u64,
    pub dropped: u64,
}

impl Default for Dispatcher {
    fn default() -> Self {
        let (tx, rx) = flume::unbounded();
        Self {
            free: AtomicI64::new(0),
            pending: AtomicI64::new(0),
            tx,
            rx,
            offered: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            finished: AtomicBool::new(false),
        }
    }
}

impl Dispatcher {
    /// Offers one arrival: to a free user if there is one, else dropped.
    /// Returns whether a user took it.
    pub fn offer(&self, arrival: Arrival) -> bool {
        self.offered.fetch_add(1, Ordering::Relaxed);
        let claimed = self
            .free
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n > 0).then_some(n - 1)
            })
            .is_ok();
        if claimed {
            self.pending.fetch_add(1, Ordering::AcqRel);
            if self.tx.send(arrival).is_ok() {
                return true;
            }
            self.pending.fetch_sub(1, Ordering::AcqRel);
        }
        self.dropped.fetch_add(1, Ordering::Relaxed);
        false
    }

    /// Waits, as a free user, for the next arrival. Returns `None` after
    /// `patience` without one (so the goose user can see whether the run
    /// is over) or once the schedule is finished.
    pub async fn next(&self, patience: Duration) -> Option<Arrival> {
        if self.finished.load(Ordering::Acquire) {
            return None;
        }
        self.free.fetch_add(1, Ordering::AcqRel);
        if let Ok(Ok(arrival)) = tokio::time::timeout(patience, self.rx.recv_async()).await {
            return Some(self.taken(arrival));
        }
        // Leave the free list, unless an arrival was claimed for us in the
        // meantime: then it is certainly on its way, so take it.
        let left = self
            .free
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n > 0).then_some(n - 1)
            })
            .is_ok();
        if left {
            None
        } else {
            self.rx.recv_async().await.ok().map(|a| self.taken(a))
        }
    }

    fn taken(&self, arrival: Arrival) -> Arrival {
        self.pending.fetch_sub(1, Ordering::AcqRel);
        arrival
    }

    /// Arrivals handed to a user that has not yet taken them up.
    pub fn pending(&self) -> i64 {
        self.pending.load(Ordering::Acquire)
    }

    /// Closed model: a user starts its next fan (offered, never dropped).
    /// Returns the fan's number, unique in the run.
    pub fn offer_closed(&self) -> u64 {
        self.offered.fetch_add(1, Ordering::Relaxed)
    }

    pub fn finish(&self) {
        self.finished.store(true, Ordering::Release);
    }

    pub fn is_finished(&self) -> bool {
        self.finished.load(Ordering::Acquire)
    }

    pub fn counts(&self) -> ArrivalCounts {
        ArrivalCounts {
            offered: self.offered.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
        }
    }

    /// Free users right now.
    pub fn free(&self) -> i64 {
        self.free.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use std::sync::Arc;

    fn secs(offsets: &[Duration]) -> Vec<f64> {
        offsets.iter().map(Duration::as_secs_f64).collect()
    }

    #[test]
    fn a_constant_rate_spaces_arrivals_evenly() {
        let s = Schedule::constant(4.0, Duration::from_secs(2));
        let t = secs(&s.offsets(&mut rand::thread_rng()));
        assert_eq!(t.len(), 8);
        for (k, t) in t.iter().enumerate() {
            assert!((t - k as f64 * 0.25).abs() < 1e-9, "{k}: {t}");
        }
    }

    #[test]
    fn a_ramp_has_as_many_arrivals_as_its_integral_and_speeds_up() {
        // 0 → 100/s over 10 s: 500 fans, denser at the end.
        let s = Schedule::parse_stages(0.0, "10s:100").unwrap();
        assert_eq!(s.expected_arrivals(), 500.0);
        let t = secs(&s.offsets(&mut rand::thread_rng()));
        assert_eq!(t.len(), 500);
        let first_half = t.iter().filter(|&&t| t < 5.0).count();
        assert_eq!(
            first_half, 125,
            "a quarter of the area lies in the first half"
        );
        assert!(t.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn stages_spike_and_come_back() {
        let s = Schedule::parse_stages(10.0, "5s:10,5s:=50,5s:=10").unwrap();
        assert_eq!(s.duration(), Duration::from_secs(15));
        assert_eq!(s.rate_at(2.0), 10.0);
        assert_eq!(s.rate_at(7.0), 50.0);
        assert_eq!(s.rate_at(12.0), 10.0);
        let t = secs(&s.offsets(&mut rand::thread_rng()));
        assert_eq!(t.len(), 50 + 250 + 50);
        assert_eq!(t.iter().filter(|&&t| (5.0..10.0).contains(&t)).count(), 250);
    }

    #[test]
    fn poisson_arrivals_have_the_rate_and_exponential_gaps() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut s = Schedule::constant(100.0, Duration::from_secs(100));
        s.poisson = true;
        let t = secs(&s.offsets(&mut rng));
        // 10,000 expected; sd 100.
        assert!((9_700..10_300).contains(&t.len()), "{}", t.len());
        let gaps: Vec<f64> = t.windows(2).map(|w| w[1] - w[0]).collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
        assert!((mean - 0.01).abs() < 0.0005, "mean gap {mean}");
        // Exponential: the standard deviation equals the mean (even spacing: 0).
        assert!(
            (var.sqrt() / mean - 1.0).abs() < 0.05,
            "cv {}",
            var.sqrt() / mean
        );
    }

    #[test]
    fn durations_and_bad_stages() {
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(
            parse_duration("1500ms").unwrap(),
            Duration::from_millis(1500)
        );
        assert_eq!(parse_duration("45").unwrap(), Duration::from_secs(45));
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("5").is_ok());
        assert!(Schedule::parse_stages(0.0, "10s").is_err());
        assert!(Schedule::parse_stages(0.0, "10s:-3").is_err());
        assert!(Schedule::parse_stages(0.0, "").is_err());
    }

    #[tokio::test]
    async fn an_arrival_finding_no_free_user_is_dropped_and_counted() {
        let d = Arc::new(Dispatcher::default());
        let now = Instant::now();
        assert!(
            !d.offer(Arrival {
                seq: 0,
                scheduled: now
            }),
            "nobody waits yet"
        );
        let user = tokio::spawn({
            let d = d.clone();
            async move { d.next(Duration::from_secs(5)).await }
        });
        while d.free() == 0 {
            tokio::task::yield_now().await;
        }
        assert!(d.offer(Arrival {
            seq: 1,
            scheduled: now
        }));
        assert!(
            !d.offer(Arrival {
                seq: 2,
                scheduled: now
            }),
            "the one user is busy"
        );
        assert_eq!(d.pending(), 1, "handed over, not yet taken up");
        assert_eq!(user.await.unwrap().unwrap().seq, 1);
        assert_eq!(d.pending(), 0);
        assert_eq!(
            d.counts(),
            ArrivalCounts {
                offered: 3,
                dropped: 2
            }
        );
    }

    #[tokio::test]
    async fn a_user_that_gives_up_waiting_leaves_the_free_list() {
        let d = Dispatcher::default();
        assert!(d.next(Duration::from_millis(10)).await.is_none());
        assert_eq!(d.free(), 0);
        assert!(!d.offer(Arrival {
            seq: 0,
            scheduled: Instant::now()
        }));
        d.finish();
        assert!(
            d.next(Duration::from_secs(5)).await.is_none(),
            "finished: home at once"
        );
    }
}
