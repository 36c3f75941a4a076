//! The load test's own options (goose's stay goose's) and the four profiles'
//! defaults, scaled to a 2-core machine that also runs the whole stack.
//!
//! | profile | arrivals | event | ends |
//! | --- | --- | --- | --- |
//! | `steady` | 20 fans/s for 60 s | 100,000 seats, admits 50/s | after the schedule |
//! | `spike` | 10/s for 30 s, ×5 for 60 s, 10/s for 60 s | 100,000 seats, admits 30/s | after the schedule |
//! | `soak` | 15/s for 30 min | 1,000,000 seats, admits 30/s | after the schedule |
//! | `sale` | 10/s in a 10 s prequeue, 60/s for 10 s at opening, then 10/s | 400 seats, admits 20/s | sold out (at most 3 min) |

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use serde::Serialize;

use crate::arrivals::{parse_duration, Schedule};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Profile {
    /// A constant arrival rate under the admission rate.
    Steady,
    /// A base rate, then ×N for a while, then back.
    Spike,
    /// A long constant rate (30 minutes).
    Soak,
    /// A whole sale: prequeue joins, the opening rush, buying until sold out.
    Sale,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Model {
    /// Fans arrive on the schedule whatever the answers (k6's arrival-rate executors).
    Open,
    /// goose's own model: each user runs fan after fan (`--users`, `--run-time` …).
    Closed,
}

/// BoxOffice's options. Every goose option works too (`--host`,
/// `--threshold`, `--report-file`, …; `--users` is the open model's pool).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "BoxOffice sale")]
pub struct Options {
    /// The shape of the run; every figure below overrides the profile's.
    #[arg(long, value_enum, default_value = "steady")]
    pub profile: Profile,
    /// Open: arrivals on a schedule. Closed: goose's looping users.
    #[arg(long, value_enum, default_value = "open")]
    pub model: Model,
    /// A constant arrival rate (fans/s) instead of the profile's stages.
    #[arg(long)]
    pub rate: Option<f64>,
    /// k6-style stages `DURATION:RATE,…` (a ramp to RATE over DURATION;
    /// `DURATION:=RATE` jumps there first), e.g. `30s:10,1m:=100,30s:=10`.
    #[arg(long)]
    pub stages: Option<String>,
    /// How long a constant `--rate` lasts (steady/soak default 60 s/30 min).
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Spike: the base rate is multiplied by this for the spike.
    #[arg(long, default_value_t = 5.0)]
    pub spike_factor: f64,
    /// Spike: how long the spike lasts.
    #[arg(long, value_parser = parse_duration, default_value = "60s")]
    pub spike_duration: Duration,
    /// Arrivals as a Poisson process at the scheduled rate (default: evenly spaced).
    #[arg(long)]
    pub poisson: bool,

    /// Run against this existing event instead of creating one.
    #[arg(long, env = "BOXOFFICE_EVENT")]
    pub event: Option<String>,
    /// Seats of the event the run creates.
    #[arg(long)]
    pub capacity: Option<i64>,
    /// Fans admitted per second (the event the run creates).
    #[arg(long)]
    pub admission_rate: Option<f64>,
    #[arg(long)]
    pub max_active: Option<u64>,
    /// Seats one fan may buy; each buyer buys 1..=this.
    #[arg(long)]
    pub per_fan_limit: Option<u32>,
    /// Seconds an admitted fan has to buy.
    #[arg(long)]
    pub access_ttl_s: Option<u64>,
    /// Sale: how long the line is open before the sale opens.
    #[arg(long, value_parser = parse_duration)]
    pub prequeue: Option<Duration>,
    /// Proof-of-work bits the created event asks of each join (0: none).
    #[arg(long, default_value_t = 0)]
    pub pow_bits: u8,
    /// Sale: give up after this long even if not sold out.
    #[arg(long, value_parser = parse_duration, default_value = "3m")]
    pub max_duration: Duration,

    /// Share of admitted fans who never buy (their admission lapses).
    #[arg(long, default_value_t = 0.1)]
    pub abandon: f64,
    /// Share of admitted fans who misbehave: replay a spent token, buy with
    /// an expired one or ask for too many seats, and must get their 4xx.
    #[arg(long, default_value_t = 0.05)]
    pub misbehave: f64,
    /// Client addresses to spread goose users over (a range `A-B` in
    /// 127.0.0.0/8, or `none`); the default gives 1,016 fans' hosts.
    #[arg(long, default_value = "127.0.1.1-127.0.4.254")]
    pub source_addrs: String,

    /// The admin API (creates the event, reads the sale's timeline).
    #[arg(
        long,
        env = "BOXOFFICE_ADMIN_URL",
        default_value = "http://127.0.0.1:8081"
    )]
    pub admin_url: String,
    /// The admin token; default: `.run/keys/admin.token` as `scripts/up.sh` made it.
    #[arg(long, env = "BOXOFFICE_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// PostgreSQL of the order service, for the verdict.
    #[arg(
        long,
        env = "DATABASE_URL",
        hide_env_values = true,
        default_value = "postgres://postgres@127.0.0.1:5432/boxoffice"
    )]
    pub database_url: String,
    /// The payment provider, whose charges the verdict reads.
    #[arg(long, env = "PAYMENT_URL", default_value = "http://127.0.0.1:8084")]
    pub payment_url: String,
    /// The payment provider's API key (its `/v1/charges` wants it); default:
    /// `.run/keys/payment.key` as `scripts/up.sh` made it.
    #[arg(long, env = "PAYMENT_API_KEY", hide_env_values = true)]
    pub payment_api_key: Option<String>,

    /// A sale threshold (repeatable): `admission-accuracy<=2%`, `dropped<=0`,
    /// `sold-out-after<=60s`, `confirm-p95<=10s`, `errors<=0`, `verdict`.
    /// Replaces the profile's default set (goose's `--threshold` rules stay
    /// goose's).
    #[arg(long = "rule")]
    pub rules: Vec<String>,
    /// Where the reports go (default `target/loadtest/PROFILE-TIMESTAMP`).
    #[arg(long)]
    pub report_dir: Option<String>,
    /// How long to wait after the run for every order to settle and every
    /// ticket to be issued before judging.
    #[arg(long, value_parser = parse_duration, default_value = "60s")]
    pub settle: Duration,
    /// Seconds between progress lines (0: none).
    #[arg(long, default_value_t = 5)]
    pub progress_s: u64,
}

/// The event the run creates (or found, with `--event`).
#[derive(Debug, Clone, Serialize)]
pub struct EventPlan {
    pub capacity: i64,
    pub admission_rate: f64,
    pub max_active: u64,
    pub per_fan_limit: u32,
    pub access_ttl_s: u64,
    #[serde(serialize_with = "secs")]
    pub prequeue: Duration,
    pub pow_bits: u8,
}

fn secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// Everything the options and the profile decide.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub profile: Profile,
    pub model: Model,
    pub schedule: Schedule,
    pub event: EventPlan,
    /// Open model: goose users started before the first arrival.
    pub pool: usize,
    /// Stop arrivals once the sale is sold out.
    pub until_sold_out: bool,
    pub rules: Vec<String>,
    pub goose_thresholds: Vec<String>,
}

impl Options {
    /// Resolves the profile's defaults under the given overrides. `users`:
    /// goose's `--users`, the open model's pool.
    pub fn plan(&self, users: Option<usize>) -> anyhow::Result<Plan> {
        let (schedule, event, pool, until_sold_out) = match self.profile {
            Profile::Steady => (
                Schedule::constant(20.0, Duration::from_secs(60)),
                event(100_000, 50.0, 300),
                400,
                false,
            ),
            Profile::Spike => {
                let base = 10.0;
                let top = base * self.spike_factor;
                // Back at the base rate long enough for the spike's line to drain.
                let s = format!(
                    "30s:{base},{}s:={top},60s:={base}",
                    self.spike_duration.as_secs_f64()
                );
                (
                    Schedule::parse_stages(base, &s)?,
                    event(100_000, 30.0, 300),
                    2_000,
                    false,
                )
            }
            Profile::Soak => (
                Schedule::constant(15.0, Duration::from_secs(30 * 60)),
                event(1_000_000, 30.0, 300),
                200,
                false,
            ),
            Profile::Sale => {
                let prequeue = self.prequeue.unwrap_or(Duration::from_secs(10));
                let tail = self
                    .max_duration
                    .saturating_sub(prequeue + Duration::from_secs(10));
                let s = format!(
                    "{}s:10,10s:=60,{}s:=10",
                    prequeue.as_secs_f64(),
                    tail.as_secs_f64()
                );
                let mut e = event(400, 20.0, 30);
                e.prequeue = prequeue;
                (Schedule::parse_stages(10.0, &s)?, e, 1_000, true)
            }
        };
        let mut schedule = match (&self.stages, self.rate) {
            (Some(_), Some(_)) => bail!("--rate and --stages both given: pick one"),
            (Some(stages), None) => Schedule::parse_stages(0.0, stages)?,
            (None, Some(rate)) => {
                Schedule::constant(rate, self.duration.unwrap_or_else(|| schedule.duration()))
            }
            (None, None) => schedule,
        };
        schedule.poisson = self.poisson;
        let mut event = event;
        if let Some(v) = self.capacity {
            event.capacity = v;
        }
        if let Some(v) = self.admission_rate {
            event.admission_rate = v;
        }
        if let Some(v) = self.max_active {
            event.max_active = v;
        }
        if let Some(v) = self.per_fan_limit {
            event.per_fan_limit = v;
        }
        if let Some(v) = self.access_ttl_s {
            event.access_ttl_s = v;
        }
        if let Some(v) = self.prequeue {
            event.prequeue = v;
        }
        event.pow_bits = self.pow_bits;
        for (name, share) in [("--abandon", self.abandon), ("--misbehave", self.misbehave)] {
            if !(0.0..=1.0).contains(&share) {
                bail!("{name} is a share between 0 and 1, not {share}");
            }
        }
        let rules = if self.rules.is_empty() {
            default_rules(self.profile, self.model)
        } else {
            self.rules.clone()
        };
        Ok(Plan {
            profile: self.profile,
            model: self.model,
            schedule,
            event,
            pool: users.unwrap_or(pool),
            until_sold_out,
            rules,
            goose_thresholds: vec![
                "error-rate<1%".into(),
                "p95<1s for GET status".into(),
                "p95<2s for POST join".into(),
            ],
        })
    }

    /// The client addresses goose users are spread over.
    pub fn addresses(&self) -> anyhow::Result<Vec<IpAddr>> {
        parse_addresses(&self.source_addrs)
    }
}

fn event(capacity: i64, admission_rate: f64, access_ttl_s: u64) -> EventPlan {
    EventPlan {
        capacity,
        admission_rate,
        max_active: 2_000,
        per_fan_limit: 4,
        access_ttl_s,
        prequeue: Duration::ZERO,
        pow_bits: 0,
    }
}

/// The sale thresholds that apply unless `--rule` is given.
pub fn default_rules(profile: Profile, model: Model) -> Vec<String> {
    let mut rules = vec![
        "errors<=0".to_owned(),
        "confirm-p95<=10s".into(),
        "verdict".into(),
    ];
    if model == Model::Open {
        rules.push("dropped<=0".into());
    }
    match profile {
        Profile::Spike => rules.push("admission-accuracy<=2%".into()),
        Profile::Sale => {
            rules.push("admission-accuracy<=2%".into());
            rules.push("sold-out-after<=90s".into());
        }
        Profile::Steady | Profile::Soak => {}
    }
    rules
}

/// `none`, one address, or a range `A-B` of IPv4 addresses (at most 65,536).
pub fn parse_addresses(text: &str) -> anyhow::Result<Vec<IpAddr>> {
    let text = text.trim();
    if text.is_empty() || text == "none" {
        return Ok(vec![]);
    }
    let (from, to) = text.split_once('-').unwrap_or((text, text));
    let parse = |s: &str| -> anyhow::Result<u32> {
        Ok(u32::from(s.trim().parse::<Ipv4Addr>().with_context(
            || format!("`{s}` is not an IPv4 address"),
        )?))
    };
    let (from, to) = (parse(from)?, parse(to)?);
    if to < from || to - from >= 65_536 {
        bail!("`{text}`: give a range A-B of at most 65,536 addresses, A first");
    }
    Ok((from..=to)
        .map(Ipv4Addr::from)
        // Skip .0 and .255 of every /24 (network and broadcast look-alikes).
        .filter(|a| !matches!(a.octets()[3], 0 | 255))
        .map(IpAddr::V4)
        .collect())
}

/// How long the whole run may take before its end is forced: the schedule,
/// plus time for the last fans' journeys.
pub fn drain_allowance(plan: &Plan) -> Duration {
    Duration::from_secs(plan.event.access_ttl_s + 60)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        options: Options,
    }

    fn plan(args: &[&str]) -> anyhow::Result<Plan> {
        let cli = Cli::try_parse_from(std::iter::once("loadtest").chain(args.iter().copied()))?;
        cli.options.plan(None)
    }

    #[test]
    fn every_profile_has_a_plan_and_flags_override_it() {
        let sale = plan(&["--profile", "sale"]).unwrap();
        assert!(sale.until_sold_out);
        assert_eq!(sale.event.prequeue, Duration::from_secs(10));
        assert_eq!(sale.schedule.rate_at(5.0), 10.0);
        assert_eq!(sale.schedule.rate_at(15.0), 60.0);
        assert_eq!(sale.schedule.rate_at(25.0), 10.0);
        assert!(sale.rules.contains(&"sold-out-after<=90s".to_owned()));

        let spike = plan(&[
            "--profile",
            "spike",
            "--spike-factor",
            "4",
            "--spike-duration",
            "2m",
        ])
        .unwrap();
        assert_eq!(spike.schedule.rate_at(10.0), 10.0);
        assert_eq!(spike.schedule.rate_at(60.0), 40.0);
        assert_eq!(spike.schedule.duration(), Duration::from_secs(210));
        assert_eq!(
            spike.pool, 2_000,
            "the spike's line holds a user per waiting fan"
        );

        let soak = plan(&[
            "--profile",
            "soak",
            "--rate",
            "5",
            "--capacity",
            "7",
            "--poisson",
        ])
        .unwrap();
        assert_eq!(soak.schedule.duration(), Duration::from_secs(1800));
        assert_eq!(soak.schedule.rate_at(100.0), 5.0);
        assert!(soak.schedule.poisson);
        assert_eq!(soak.event.capacity, 7);

        let steady = plan(&["--stages", "10s:50", "--rule", "errors<=3"]).unwrap();
        assert_eq!(steady.schedule.expected_arrivals(), 250.0);
        assert_eq!(steady.rules, ["errors<=3"]);
        assert!(plan(&["--rate", "3", "--stages", "1s:1"]).is_err());
        assert!(plan(&["--abandon", "1.5"]).is_err());
    }

    #[test]
    fn fans_come_from_many_addresses() {
        let all = parse_addresses("127.0.1.1-127.0.4.254").unwrap();
        assert_eq!(all.len(), 1_016);
        assert_eq!(all[0].to_string(), "127.0.1.1");
        assert!(all
            .iter()
            .all(|a| !a.to_string().ends_with(".255") && !a.to_string().ends_with(".0")));
        assert!(parse_addresses("none").unwrap().is_empty());
        assert_eq!(parse_addresses("127.0.0.9").unwrap().len(), 1);
        assert!(parse_addresses("127.0.4.1-127.0.1.1").is_err());
        assert!(parse_addresses("somewhere").is_err());
    }
}
