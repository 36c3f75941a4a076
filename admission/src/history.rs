//! The dashboard's memory: the last minutes of every event's figures, one
//! [`Sample`] per event and sampling (taken by the sampler). Each replica
//! keeps its own window (`--history-samples`, ten minutes by default);
//! Prometheus keeps the long history.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;

use boxoffice_contract::event::EventState;
use serde::{Deserialize, Serialize};

/// One second of one event, as the dashboard charts it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct Sample {
    /// Unix milliseconds.
    pub t_ms: i64,
    pub state: EventState,
    pub paused: bool,
    pub queue_length: u64,
    pub active: u64,
    pub max_active: u64,
    pub admitted_total: u64,
    /// The configured admission rate (fans/s).
    pub rate_set: f64,
    /// Fans actually admitted per second since the previous sample.
    pub rate_actual: f64,
    pub oldest_wait_s: f64,
    pub sold: Option<i64>,
    pub remaining: Option<i64>,
    /// This event's orders by status.
    pub orders: BTreeMap<String, i64>,
    pub outbox_backlog: Option<i64>,
    pub outbox_oldest_age_s: Option<f64>,
    pub consumer_lag: Option<i64>,
    pub dlq_messages: Option<i64>,
    pub order_latency_p95_ms: Option<f64>,
}

/// The last `capacity` samples of every event.
#[derive(Debug)]
pub struct History {
    capacity: usize,
    events: Mutex<HashMap<String, VecDeque<Sample>>>,
}

impl History {
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            events: Mutex::default(),
        }
    }

    /// Appends a sample, dropping the oldest past the window.
    pub fn push(&self, event_id: &str, sample: Sample) {
        let mut events = self.events.lock().expect("history lock");
        let samples = events.entry(event_id.to_owned()).or_default();
        samples.push_back(sample);
        while samples.len() > self.capacity {
            samples.pop_front();
        }
    }

    /// Samples of the event taken after `since_ms`, oldest first.
    pub fn since(&self, event_id: &str, since_ms: i64) -> Vec<Sample> {
        let events = self.events.lock().expect("history lock");
        events.get(event_id).map_or_else(Vec::new, |samples| {
            samples
                .iter()
                .filter(|s| s.t_ms > since_ms)
                .cloned()
                .collect()
        })
    }

    pub(crate) fn last(&self, event_id: &str) -> Option<Sample> {
        let events = self.events.lock().expect("history lock");
        events.get(event_id).and_then(|s| s.back().cloned())
    }

    /// Forgets events that no longer exist.
    pub(crate) fn retain(&self, live: &[String]) {
        let mut events = self.events.lock().expect("history lock");
        events.retain(|id, _| live.contains(id));
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn sample(t_ms: i64, admitted_total: u64) -> Sample {
        Sample {
            t_ms,
            state: EventState::Open,
            paused: false,
            queue_length: 0,
            active: 0,
            max_active: 0,
            admitted_total,
            rate_set: 0.0,
            rate_actual: 0.0,
            oldest_wait_s: 0.0,
            sold: None,
            remaining: None,
            orders: BTreeMap::new(),
            outbox_backlog: None,
            outbox_oldest_age_s: None,
            consumer_lag: None,
            dlq_messages: None,
            order_latency_p95_ms: None,
        }
    }

    #[test]
    fn the_window_keeps_the_newest_samples() {
        let history = History::new(3);
        for t in 1..=5 {
            history.push("e", sample(t, 0));
        }
        let kept: Vec<i64> = history.since("e", 0).iter().map(|s| s.t_ms).collect();
        assert_eq!(kept, [3, 4, 5]);
        let after: Vec<i64> = history.since("e", 4).iter().map(|s| s.t_ms).collect();
        assert_eq!(after, [5]);
        assert!(history.since("other", 0).is_empty());
    }

    #[test]
    fn forgotten_events_drop_out() {
        let history = History::new(3);
        history.push("a", sample(1, 0));
        history.push("b", sample(1, 0));
        history.retain(&["b".to_owned()]);
        assert!(history.since("a", 0).is_empty());
        assert_eq!(history.since("b", 0).len(), 1);
    }
}
