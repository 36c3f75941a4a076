//! The sale as ops see it, through the admin API: the event the run creates,
//! and its timeline (the dashboard's samples), from which admission accuracy
//! and the time to sell out are read.

use std::time::Duration;

use anyhow::{bail, Context};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::profile::EventPlan;

/// One sample of `GET /admin/v1/events/{id}/history` (the fields the load
/// test reads).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Sample {
    pub t_ms: i64,
    pub state: String,
    #[serde(default)]
    pub paused: bool,
    pub queue_length: u64,
    pub active: u64,
    pub max_active: u64,
    pub admitted_total: u64,
    pub rate_set: f64,
    pub sold: Option<i64>,
    pub remaining: Option<i64>,
    #[serde(default)]
    pub orders: std::collections::BTreeMap<String, i64>,
}

impl Sample {
    pub fn confirmed(&self) -> i64 {
        self.orders.get("confirmed").copied().unwrap_or(0)
    }
}

/// What the run learnt of its event.
#[derive(Debug, Clone, Serialize)]
pub struct EventInfo {
    pub event_id: String,
    pub created: bool,
    pub opens_at: DateTime<Utc>,
    pub capacity: i64,
    pub admission_rate: f64,
    pub per_fan_limit: u32,
    pub access_ttl_s: u64,
    pub pow_bits: u8,
}

pub struct Admin {
    pub url: String,
    token: String,
    http: reqwest::Client,
}

impl Admin {
    pub fn new(url: &str, token: String) -> Self {
        Self {
            url: url.trim_end_matches('/').to_owned(),
            token,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .expect("a plain HTTP client builds"),
        }
    }

    async fn call(&self, request: reqwest::RequestBuilder, what: &str) -> anyhow::Result<Value> {
        let response = request
            .bearer_auth(&self.token)
            .send()
            .await
            .with_context(|| format!("{what}: the admin API at {} does not answer (start the stack with scripts/up.sh, or pass --admin-url)", self.url))?;
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        if status == reqwest::StatusCode::UNAUTHORIZED {
            bail!("{what}: the admin API refused the token (set BOXOFFICE_ADMIN_TOKEN or --admin-token)");
        }
        if !status.is_success() {
            bail!("{what}: the admin API answered {status}: {body}");
        }
        Ok(body)
    }

    /// Creates the run's own event, open after `plan.prequeue`.
    pub async fn create(&self, event_id: &str, plan: &EventPlan) -> anyhow::Result<EventInfo> {
        let now = Utc::now();
        let opens_at = now + chrono::Duration::from_std(plan.prequeue)?;
        let prequeue_at = now - chrono::Duration::seconds(1);
        let mut body = json!({
            "name": format!("Load test {event_id}"),
            "capacity": plan.capacity,
            "prequeue_at": prequeue_at,
            "opens_at": opens_at,
            "admission_rate_per_s": plan.admission_rate,
            "max_active": plan.max_active,
            "access_ttl_s": plan.access_ttl_s,
            "per_fan_limit": plan.per_fan_limit,
            "max_queue": 1_000_000,
            "price_cents": 4_500,
            // The virtual fans name themselves (`fan_id`), which only a
            // `declared` event reads; a sale's default is `anonymous`.
            "identity": "declared",
        });
        if plan.pow_bits > 0 {
            body["pow_bits"] = json!(plan.pow_bits);
        }
        let request = self
            .http
            .put(format!("{}/admin/v1/events/{event_id}", self.url))
            .json(&body);
        self.call(request, "creating the event").await?;
        Ok(EventInfo {
            event_id: event_id.to_owned(),
            created: true,
            opens_at,
            capacity: plan.capacity,
            admission_rate: plan.admission_rate,
            per_fan_limit: plan.per_fan_limit,
            access_ttl_s: plan.access_ttl_s,
            pow_bits: plan.pow_bits,
        })
    }

    /// Reads an existing event.
    pub async fn find(&self, event_id: &str) -> anyhow::Result<EventInfo> {
        let request = self
            .http
            .get(format!("{}/admin/v1/events/{event_id}", self.url));
        let e = self
            .call(request, &format!("reading event {event_id}"))
            .await?;
        let field = |name: &str| {
            e.get(name)
                .cloned()
                .with_context(|| format!("event {event_id}: no `{name}`"))
        };
        Ok(EventInfo {
            event_id: event_id.to_owned(),
            created: false,
            opens_at: serde_json::from_value(field("opens_at")?)?,
            capacity: serde_json::from_value(field("capacity")?)?,
            admission_rate: serde_json::from_value(field("admission_rate_per_s")?)?,
            per_fan_limit: serde_json::from_value(field("per_fan_limit")?)?,
            access_ttl_s: serde_json::from_value(field("access_ttl_s")?)?,
            pow_bits: e.get("pow_bits").and_then(Value::as_u64).unwrap_or(0) as u8,
        })
    }

    /// The samples taken after `since_ms`.
    pub async fn history(&self, event_id: &str, since_ms: i64) -> anyhow::Result<Vec<Sample>> {
        let request = self.http.get(format!(
            "{}/admin/v1/events/{event_id}/history?since_ms={since_ms}",
            self.url
        ));
        let body = self.call(request, "reading the sale's timeline").await?;
        Ok(serde_json::from_value(body["samples"].clone())?)
    }
}

/// Admission accuracy: |admitted/s − set| / set in %, over the longest
/// stretch of samples in which fans waited and nothing else held admission
/// back. `None` when no such stretch lasts `min_span`. Returns (accuracy %,
/// admitted/s, set rate).
pub fn admission_accuracy(samples: &[Sample], min_span: Duration) -> Option<(f64, f64, f64)> {
    let admitting = |s: &Sample| {
        s.state == "open"
            && !s.paused
            && s.queue_length > 0
            && s.active < s.max_active
            && s.remaining.is_some_and(|r| r > 0)
            && s.rate_set > 0.0
    };
    let mut best: Option<(usize, usize)> = None;
    let mut start = None;
    for (i, s) in samples.iter().enumerate() {
        match (admitting(s), start) {
            (true, None) => start = Some(i),
            (false, Some(from)) => {
                consider(&mut best, samples, from, i - 1);
                start = None;
            }
            _ => {}
        }
    }
    if let Some(from) = start {
        consider(&mut best, samples, from, samples.len() - 1);
    }
    let (from, to) = best?;
    let stretch = &samples[from..=to];
    let span_s = (samples[to].t_ms - samples[from].t_ms) as f64 / 1000.0;
    if span_s < min_span.as_secs_f64() || stretch.len() < 3 {
        return None;
    }
    // The admitted count moves a whole fan at a time: the slope of a least-
    // squares line through every sample reads the rate, where the two ends
    // alone would be off by up to a fan each.
    let n = stretch.len() as f64;
    let t = |s: &Sample| (s.t_ms - samples[from].t_ms) as f64 / 1000.0;
    let mean_t = stretch.iter().map(t).sum::<f64>() / n;
    let mean_a = stretch.iter().map(|s| s.admitted_total as f64).sum::<f64>() / n;
    let cov: f64 = stretch
        .iter()
        .map(|s| (t(s) - mean_t) * (s.admitted_total as f64 - mean_a))
        .sum();
    let var: f64 = stretch.iter().map(|s| (t(s) - mean_t).powi(2)).sum();
    let actual = cov / var;
    // The rate set may have moved (adaptive mode): weigh it by time.
    let set = stretch
        .iter()
        .zip(&stretch[1..])
        .map(|(a, b)| a.rate_set * (b.t_ms - a.t_ms) as f64)
        .sum::<f64>()
        / (span_s * 1000.0);
    Some(((actual - set).abs() / set * 100.0, actual, set))
}

fn consider(best: &mut Option<(usize, usize)>, samples: &[Sample], from: usize, to: usize) {
    let span = |(a, b): (usize, usize)| samples[b].t_ms - samples[a].t_ms;
    if best.is_none_or(|b| span((from, to)) > span(b)) {
        *best = Some((from, to));
    }
}

/// Seconds from `opens_at` to the first sample that says sold out.
pub fn sold_out_after(samples: &[Sample], opens_at: DateTime<Utc>) -> Option<f64> {
    samples
        .iter()
        .find(|s| s.state == "sold_out")
        .map(|s| ((s.t_ms - opens_at.timestamp_millis()) as f64 / 1000.0).max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(t_ms: i64, queue: u64, admitted: u64) -> Sample {
        Sample {
            t_ms,
            state: "open".into(),
            queue_length: queue,
            active: 0,
            max_active: 100,
            admitted_total: admitted,
            rate_set: 10.0,
            remaining: Some(50),
            ..Sample::default()
        }
    }

    #[test]
    fn accuracy_is_read_over_the_longest_stretch_with_a_line() {
        let mut samples: Vec<Sample> = (0..=20)
            .map(|i| sample(i * 1000, 50, i as u64 * 10))
            .collect();
        // Seconds 21-22: the line is empty, admissions stall (not a fault).
        samples.push(sample(21_000, 0, 205));
        samples.push(sample(22_000, 0, 205));
        // A short stretch after, admitted too fast, is shorter and not taken.
        samples.push(sample(23_000, 5, 205));
        samples.push(sample(24_000, 5, 230));
        let (pct, actual, set) = admission_accuracy(&samples, Duration::from_secs(5)).unwrap();
        assert!(
            (actual - 10.0).abs() < 1e-9 && set == 10.0,
            "{actual} {set}"
        );
        assert!(pct < 1e-6);
        // 10.4/s for a set 10/s: 4 % off.
        let fast: Vec<Sample> = (0..=10)
            .map(|i| sample(i * 1000, 50, (i as f64 * 10.4) as u64))
            .collect();
        let (pct, ..) = admission_accuracy(&fast, Duration::from_secs(5)).unwrap();
        assert!((pct - 4.0).abs() < 0.2, "{pct}");
        assert!(
            admission_accuracy(&fast[..3], Duration::from_secs(5)).is_none(),
            "too short to judge"
        );
    }

    #[test]
    fn sold_out_time_is_from_the_opening() {
        let opens = DateTime::from_timestamp_millis(10_000).unwrap();
        let mut samples = vec![sample(11_000, 5, 1), sample(12_000, 5, 2)];
        assert_eq!(sold_out_after(&samples, opens), None);
        samples.push(Sample {
            state: "sold_out".into(),
            ..sample(52_500, 0, 40)
        });
        assert_eq!(sold_out_after(&samples, opens), Some(42.5));
    }
}
