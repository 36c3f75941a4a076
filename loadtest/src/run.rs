//! One load-test run, start to verdict: check the gateway answers, create
//! (or find) the event, start the goose users, feed them arrivals, sample
//! the sale's timeline, wait for the sale to settle, judge, report.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use goose::config::GooseConfiguration;
use goose::prelude::*;
use goose::GooseError;
use sqlx::PgPool;
use tokio::time::Instant;

use crate::arrivals::{parse_duration, Arrival};
use crate::journey::{self, Crowd, Run};
use crate::profile::{drain_allowance, EventPlan, Model, Options, Plan};
use crate::report::{self, Report};
use crate::rules::{self, Figures};
use crate::sale::{self, Admin, Sample};
use crate::verdict;

/// How a run ended.
pub struct Outcome {
    pub pass: bool,
    pub report_dir: PathBuf,
    pub report: Report,
}

/// Where a run's services are, when not taken from the options.
pub struct Targets {
    /// PostgreSQL for the verdict (`None`: connect to `--database-url`).
    pub pool: Option<PgPool>,
}

/// Runs the load test. Errors are setup failures (nothing reachable, a bad
/// option); a run that fails its thresholds returns `pass: false`.
pub async fn run(
    options: Options,
    mut goose: GooseConfiguration,
    targets: Targets,
) -> anyhow::Result<Outcome> {
    let plan = options.plan(goose.users)?;
    let rules = rules::parse_all(&plan.rules)?;
    let host = goose
        .host
        .clone()
        .unwrap_or_else(|| "http://127.0.0.1:8080".into());
    let host = host.trim_end_matches('/').to_owned();
    goose.host = Some(host.clone());
    preflight(&host).await?;

    let token = match &options.admin_token {
        Some(t) => t.clone(),
        None => std::fs::read_to_string(".run/keys/admin.token")
            .map(|t| t.trim().to_owned())
            .context("no admin token: set BOXOFFICE_ADMIN_TOKEN or --admin-token (scripts/up.sh keeps its own in .run/keys/admin.token)")?,
    };
    let admin = Admin::new(&options.admin_url, token);
    let pool = match targets.pool {
        Some(pool) => pool,
        None => sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(5))
            .connect(&options.database_url)
            .await
            .with_context(|| {
                format!(
                    "the verdict needs PostgreSQL at {} (--database-url)",
                    redact(&options.database_url)
                )
            })?,
    };

    // An existing event is read now; the run's own is created once the
    // goose users are up, so its prequeue and opening are the fans'.
    let existing = match &options.event {
        Some(id) => Some(admin.find(id).await?),
        None => None,
    };
    let event_id = match &existing {
        Some(e) => e.event_id.clone(),
        None => format!(
            "lt-{}-{}-{:04x}",
            serde_json::to_value(plan.profile)?
                .as_str()
                .unwrap_or("run"),
            chrono::Utc::now().format("%Y%m%d%H%M%S"),
            rand::random::<u16>()
        ),
    };
    let report_dir = PathBuf::from(options.report_dir.clone().unwrap_or_else(|| {
        format!(
            "target/loadtest/{}-{}",
            serde_json::to_value(plan.profile)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            chrono::Utc::now().format("%Y%m%d-%H%M%S")
        )
    }));
    std::fs::create_dir_all(&report_dir)
        .with_context(|| format!("creating {}", report_dir.display()))?;
    eprintln!(
        "loadtest: {:?} profile, {:?} model, event {event_id} ({} seats, admits {}/s), {} goose users, reports in {}",
        plan.profile,
        plan.model,
        existing.as_ref().map_or(plan.event.capacity, |e| e.capacity),
        existing.as_ref().map_or(plan.event.admission_rate, |e| e.admission_rate),
        plan.pool,
        report_dir.display()
    );

    let crowd = Crowd {
        abandon: options.abandon,
        misbehave: options.misbehave,
        addresses: options.addresses()?,
        open: plan.model == Model::Open,
    };
    let run = Arc::new(Run::new(crowd));
    let to_create = match existing {
        Some(e) => {
            let _ = run.event.set(e);
            None
        }
        None => Some((event_id.clone(), plan.event.clone())),
    };
    journey::set_current(Some(run.clone()));

    // goose runs the users; the end of the run is ours (schedule, sold out).
    let closed_run_time = goose.run_time.take();
    let end_after = match plan.model {
        Model::Open => plan.schedule.duration(),
        Model::Closed => match &closed_run_time {
            Some(t) => parse_duration(t)?,
            None => plan.schedule.duration(),
        },
    };
    if plan.model == Model::Open {
        goose.users = Some(plan.pool);
        goose.increase_rate = Some(plan.pool.max(1).to_string());
        goose.iterations = None;
    } else {
        goose.users.get_or_insert(50);
    }
    // goose's per-user start-up lines drown the progress line unless asked for.
    if goose.verbose == 0 && goose.quiet == 0 {
        goose.quiet = 1;
    }
    if goose.threshold.is_empty() {
        goose.threshold = plan.goose_thresholds.clone();
        goose.no_threshold_abort = true;
    }
    if goose.report_file.is_empty() {
        goose
            .report_file
            .push(report_dir.join("goose.html").display().to_string());
    }

    let timeline: Arc<Mutex<Vec<Sample>>> = Arc::default();
    let admin = Arc::new(admin);
    let sampler = tokio::spawn(sample(
        admin.clone(),
        event_id.clone(),
        run.clone(),
        timeline.clone(),
        options.progress_s,
    ));
    let driver = tokio::spawn(drive(
        run.clone(),
        plan.clone(),
        end_after,
        admin,
        to_create,
    ));

    let attack = GooseAttack::initialize_with_config(goose)?.register_scenario(journey::scenario());
    let (goose_pass, metrics) = match attack.execute().await {
        Ok(metrics) => (true, metrics),
        Err(GooseError::ThresholdsFailed { metrics, .. }) => (false, *metrics.0),
        Err(e) => {
            run.stopping.store(true, Ordering::Release);
            driver.abort();
            sampler.abort();
            journey::set_current(None);
            return Err(e).context("goose could not run");
        }
    };
    run.stopping.store(true, Ordering::Release);
    run.dispatcher.finish();
    driver.abort();
    let Some(event) = run.event.get().cloned() else {
        sampler.abort();
        journey::set_current(None);
        let why = run.failure.lock().expect("not poisoned").clone();
        bail!(why.unwrap_or_else(|| "the run ended before its event was set up".into()));
    };

    // Let the pipeline settle: every order final, every ticket issued.
    eprintln!(
        "loadtest: waiting up to {:?} for the sale to settle",
        options.settle
    );
    // The provider's `/v1/charges` wants its API key.
    let mut headers = reqwest::header::HeaderMap::new();
    let payment_key = match &options.payment_api_key {
        Some(key) => key.clone(),
        None => std::fs::read_to_string(".run/keys/payment.key")
            .map(|k| k.trim().to_owned())
            .unwrap_or_default(),
    };
    let mut key: reqwest::header::HeaderValue = format!("Bearer {payment_key}").parse()?;
    key.set_sensitive(true);
    headers.insert(reqwest::header::AUTHORIZATION, key);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .default_headers(headers)
        .build()?;
    let fans = run.fans.lock().expect("not poisoned").clone();
    let settle_by = Instant::now() + options.settle;
    let snapshot = loop {
        let snapshot = verdict::load(
            &pool,
            &http,
            &options.payment_url,
            &event.event_id,
            fans.clone(),
        )
        .await?;
        if (verdict::unsettled(&snapshot) == 0 && verdict::tickets_due(&snapshot) == 0)
            || Instant::now() > settle_by
        {
            break snapshot;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let verdict = verdict::judge(&snapshot);
    // One more sample, so the timeline ends with the settled sale.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    sampler.abort();
    journey::set_current(None);

    let samples = timeline.lock().expect("not poisoned").clone();
    let counts = run.dispatcher.counts();
    let figures = Figures {
        admission_accuracy_pct: sale::admission_accuracy(&samples, Duration::from_secs(5))
            .map(|a| a.0),
        arrivals: counts.offered,
        dropped: counts.dropped,
        sold_out_after_s: sale::sold_out_after(&samples, event.opens_at),
        confirm_p95_s: {
            let h = run.confirm.lock().expect("not poisoned");
            (!h.is_empty()).then(|| h.value_at_quantile(0.95) as f64 / 1e6)
        },
        answers: run.answers.load(Ordering::Relaxed),
        errors: run.error_count.load(Ordering::Relaxed),
        verdict_pass: Some(verdict.pass),
    };
    let rule_results: Vec<_> = rules.iter().map(|r| r.judge(&figures)).collect();
    let pass = goose_pass && rule_results.iter().all(|r| r.pass);
    let report = report::build(report::Inputs {
        plan: &plan,
        event: &event,
        run: &run,
        metrics: &metrics,
        samples,
        figures,
        rules: rule_results,
        verdict,
        pass,
        host: &host,
    });
    report::write(&report, &report_dir)?;
    // Every fan's join and admission, for auditing the fairness check.
    std::fs::write(report_dir.join("fans.json"), serde_json::to_string(&fans)?)?;
    Ok(Outcome {
        pass,
        report_dir,
        report,
    })
}

/// Fails fast, with a clear message, when nothing answers at `host`.
async fn preflight(host: &str) -> anyhow::Result<()> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()?;
    match http.get(format!("{host}/healthz")).send().await {
        Ok(r) if r.status().is_success() => Ok(()),
        Ok(r) => bail!("the gateway at {host} is not healthy: GET /healthz answered {}", r.status()),
        Err(e) => bail!(
            "the gateway at {host} does not answer ({}); start the stack with scripts/up.sh or point --host at it",
            root_cause(&e)
        ),
    }
}

fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

/// A database URL without its password, for messages.
pub fn redact(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        _ => url.to_owned(),
    }
}

/// Feeds arrivals on the schedule (open model), then ends the run: when
/// the schedule is done (or the sale sold out, for `sale`), wait for the
/// fans in flight, then stop goose.
async fn drive(
    run: Arc<Run>,
    plan: Plan,
    end_after: Duration,
    admin: Arc<Admin>,
    to_create: Option<(String, EventPlan)>,
) {
    // Start the clock once the pool is up (every client bound to its address).
    let ready_by = Instant::now() + Duration::from_secs(60);
    let users = if plan.model == Model::Open {
        plan.pool
    } else {
        1
    };
    while run.ready.load(Ordering::Acquire) < users && Instant::now() < ready_by {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if let Some((event_id, event)) = to_create {
        match admin.create(&event_id, &event).await {
            Ok(info) => {
                let _ = run.event.set(info);
            }
            Err(e) => {
                *run.failure.lock().expect("not poisoned") = Some(format!("{e:#}"));
                run.stopping.store(true, Ordering::Release);
                run.dispatcher.finish();
                goose::trigger_killswitch("the event could not be created");
                return;
            }
        }
    }
    let t0 = Instant::now();
    let sold_out = || plan.until_sold_out && run.sold_out_seen.load(Ordering::Acquire);
    if plan.model == Model::Open {
        let offsets = plan.schedule.offsets(&mut rand::thread_rng());
        for (seq, offset) in offsets.into_iter().enumerate() {
            let scheduled = t0 + offset;
            tokio::time::sleep_until(scheduled).await;
            if sold_out() || run.stopping.load(Ordering::Acquire) {
                break;
            }
            run.dispatcher.offer(Arrival {
                seq: seq as u64,
                scheduled,
            });
        }
    } else {
        while t0.elapsed() < end_after && !sold_out() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // No new fans; those already in the line or buying finish their journeys
    // (an arrival handed over but not yet taken up counts as one of them).
    run.dispatcher.finish();
    let drain_by = Instant::now() + drain_allowance(&plan);
    while (run.in_flight.load(Ordering::Acquire) > 0 || run.dispatcher.pending() > 0)
        && Instant::now() < drain_by
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    run.stopping.store(true, Ordering::Release);
    goose::trigger_killswitch("the run is complete");
}

/// Reads the sale's timeline once a second, and prints a progress line.
async fn sample(
    admin: Arc<Admin>,
    event_id: String,
    run: Arc<Run>,
    timeline: Arc<Mutex<Vec<Sample>>>,
    progress_s: u64,
) {
    let mut since = chrono::Utc::now().timestamp_millis() - 1_000;
    let mut last_print = Instant::now();
    let mut last_offered = 0;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        if let Ok(samples) = admin.history(&event_id, since).await {
            if let Some(last) = samples.last() {
                since = last.t_ms;
            }
            timeline.lock().expect("not poisoned").extend(samples);
        }
        if progress_s > 0 && last_print.elapsed() >= Duration::from_secs(progress_s) {
            let counts = run.dispatcher.counts();
            let rate = (counts.offered - last_offered) as f64 / last_print.elapsed().as_secs_f64();
            last_offered = counts.offered;
            last_print = Instant::now();
            let last = timeline
                .lock()
                .expect("not poisoned")
                .last()
                .cloned()
                .unwrap_or_default();
            eprintln!(
                "[{:>5.0}s] arrivals {rate:.1}/s (dropped {}) · in line {} · admitted {} · sold {} · confirmed {} · errors {}",
                run.started.elapsed().as_secs_f64(),
                counts.dropped,
                last.queue_length,
                last.admitted_total,
                last.sold.unwrap_or(0),
                last.confirmed(),
                run.error_count.load(Ordering::Relaxed),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_passwords_stay_out_of_messages() {
        assert_eq!(
            redact("postgres://bo:hunter2@db:5432/boxoffice"),
            "postgres://bo:***@db:5432/boxoffice"
        );
        assert_eq!(
            redact("postgres://postgres@127.0.0.1/x"),
            "postgres://postgres@127.0.0.1/x"
        );
    }
}
