//! Little's law for sizing a sale: how many workers and partitions it needs,
//! and how long a spike takes to drain. The admin API's capacity planner and
//! the ticket workers' `--workers auto` both use it.

use serde::{Deserialize, Serialize};

/// What the planner is told.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct Demand {
    /// λ: messages (orders) per second at steady state; greater than 0.
    #[param(exclusive_minimum = 0)]
    pub arrival_rate: f64,
    /// S: time one worker spends on one message, in milliseconds; greater than 0.
    #[param(exclusive_minimum = 0)]
    pub service_time_ms: f64,
    /// ρ: how busy each worker may be on average, in (0, 1]; 0.7 leaves room for bursts.
    #[serde(default = "default_utilization")]
    #[param(exclusive_minimum = 0, maximum = 1)]
    pub utilization: f64,
    /// p: what one partition takes on the produce side, messages per second; greater than 0.
    #[serde(default = "default_partition_rate")]
    #[param(exclusive_minimum = 0)]
    pub per_partition_rate: f64,
    /// c: what one consumer drains from one partition, messages per second
    /// (greater than 0); defaults to one sequential worker, 1/S.
    #[param(exclusive_minimum = 0)]
    pub per_consumer_rate: Option<f64>,
    /// A spike: arrival rate during it (greater than 0); give spike_rate and spike_s together.
    #[param(exclusive_minimum = 0)]
    pub spike_rate: Option<f64>,
    /// How long the spike lasts, in seconds (greater than 0); give spike_rate and spike_s together.
    #[param(exclusive_minimum = 0)]
    pub spike_s: Option<f64>,
}

fn default_utilization() -> f64 {
    0.7
}

/// A conservative figure for one partition of a small Kafka cluster.
fn default_partition_rate() -> f64 {
    1_000.0
}

/// What the planner answers.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Plan {
    /// L = λ × S: workers busy on average.
    pub busy_workers: f64,
    /// ⌈λ × S / ρ⌉.
    pub workers: u64,
    /// What those workers process per second (workers / S).
    pub throughput: f64,
    /// ⌈max(T/p, T/c)⌉ with T = λ (and at least the spike rate, if given).
    pub partitions: u64,
    /// Messages left waiting when a spike above `throughput` ends.
    pub spike_backlog: f64,
    /// Seconds to drain that backlog at `throughput − λ`; `None` if it never drains.
    pub drain_s: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {rule}")]
pub struct DemandError {
    pub field: &'static str,
    pub rule: &'static str,
}

fn positive(field: &'static str, value: f64) -> Result<f64, DemandError> {
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        Err(DemandError {
            field,
            rule: "must be a number greater than 0",
        })
    }
}

/// ⌈λ × S / ρ⌉ workers, never fewer than one.
pub fn workers_for(arrival_rate: f64, service_time_s: f64, utilization: f64) -> u64 {
    ((arrival_rate * service_time_s / utilization) - 1e-9)
        .ceil()
        .max(1.0) as u64
}

pub fn plan(demand: &Demand) -> Result<Plan, DemandError> {
    let lambda = positive("arrival_rate", demand.arrival_rate)?;
    let service_s = positive("service_time_ms", demand.service_time_ms)? / 1000.0;
    let rho = positive("utilization", demand.utilization)?;
    if rho > 1.0 {
        return Err(DemandError {
            field: "utilization",
            rule: "must be at most 1",
        });
    }
    let p = positive("per_partition_rate", demand.per_partition_rate)?;
    let c = match demand.per_consumer_rate {
        Some(c) => positive("per_consumer_rate", c)?,
        None => 1.0 / service_s,
    };
    let workers = workers_for(lambda, service_s, rho);
    let throughput = workers as f64 / service_s;
    let (spike_rate, spike_s) = match (demand.spike_rate, demand.spike_s) {
        (Some(r), Some(s)) => (positive("spike_rate", r)?, positive("spike_s", s)?),
        (None, None) => (lambda, 0.0),
        _ => {
            return Err(DemandError {
                field: "spike_rate",
                rule: "give spike_rate and spike_s together",
            })
        }
    };
    let target = lambda.max(spike_rate);
    let partitions = ((target / p).max(target / c) - 1e-9).ceil().max(1.0) as u64;
    let spike_backlog = ((spike_rate - throughput) * spike_s).max(0.0);
    let drain_s = if spike_backlog == 0.0 {
        Some(0.0)
    } else if throughput > lambda {
        Some(spike_backlog / (throughput - lambda))
    } else {
        None
    };
    Ok(Plan {
        busy_workers: lambda * service_s,
        workers,
        throughput,
        partitions,
        spike_backlog,
        drain_s,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn demand() -> Demand {
        Demand {
            arrival_rate: 200.0,
            service_time_ms: 50.0,
            utilization: 0.7,
            per_partition_rate: 1_000.0,
            per_consumer_rate: None,
            spike_rate: None,
            spike_s: None,
        }
    }

    #[test]
    fn littles_law_sizes_the_pool() {
        let plan = plan(&demand()).unwrap();
        assert!((plan.busy_workers - 10.0).abs() < 1e-9, "λS = 200 × 0.05");
        assert_eq!(plan.workers, 15, "⌈10 / 0.7⌉");
        assert!((plan.throughput - 300.0).abs() < 1e-9);
        // T/p = 0.2, T/c = 200 / 20 = 10: consumption decides.
        assert_eq!(plan.partitions, 10);
    }

    #[test]
    fn a_spike_leaves_a_backlog_that_drains_at_the_spare_rate() {
        let plan = plan(&Demand {
            spike_rate: Some(1_000.0),
            spike_s: Some(60.0),
            ..demand()
        })
        .unwrap();
        assert!(
            (plan.spike_backlog - 42_000.0).abs() < 1e-6,
            "(1000 − 300) × 60"
        );
        assert!(
            (plan.drain_s.unwrap() - 420.0).abs() < 1e-6,
            "42000 / (300 − 200)"
        );
        assert_eq!(plan.partitions, 50, "the spike rate sets the partitions");
    }

    #[test]
    fn exact_products_do_not_round_up() {
        assert_eq!(workers_for(100.0, 0.1, 1.0), 10);
        assert_eq!(workers_for(0.001, 0.1, 0.7), 1);
    }

    #[test]
    fn bad_inputs_name_their_field() {
        assert_eq!(
            plan(&Demand {
                utilization: 1.5,
                ..demand()
            })
            .unwrap_err()
            .field,
            "utilization"
        );
        assert_eq!(
            plan(&Demand {
                arrival_rate: f64::NAN,
                ..demand()
            })
            .unwrap_err()
            .field,
            "arrival_rate"
        );
        assert_eq!(
            plan(&Demand {
                spike_rate: Some(5.0),
                ..demand()
            })
            .unwrap_err()
            .field,
            "spike_rate"
        );
    }
}
