//! The run's reports: `summary.json` (everything, for machines),
//! `summary.md` (the verdict and the figures, for people) and `report.html`
//! (the same with the sale's timeline drawn as charts), beside goose's own
//! `goose.html`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use goose::metrics::GooseMetrics;
use serde::Serialize;

use crate::arrivals::ArrivalCounts;
use crate::journey::{percentiles, LatencySummary, Percentiles, Run};
use crate::profile::Plan;
use crate::rules::{Figures, RuleResult};
use crate::sale::{EventInfo, Sample};
use crate::verdict::Verdict;

#[derive(Debug, Clone, Serialize)]
pub struct GooseRule {
    pub rule: String,
    pub observed: String,
    pub pass: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub pass: bool,
    pub host: String,
    pub plan: Plan,
    pub event: EventInfo,
    pub duration_s: f64,
    pub arrivals: ArrivalCounts,
    pub throughput_rps: f64,
    pub latencies: Vec<LatencySummary>,
    /// Answers by request and status.
    pub statuses: BTreeMap<String, BTreeMap<String, u64>>,
    /// Answers by the Unix second they came in, and status ("none": no answer).
    pub answers_by_second: BTreeMap<i64, BTreeMap<String, u64>>,
    pub errors: BTreeMap<String, u64>,
    /// How fans' journeys ended.
    pub journeys: BTreeMap<String, u64>,
    pub confirm_s: Option<Percentiles>,
    pub figures: Figures,
    pub rules: Vec<RuleResult>,
    pub goose_thresholds: Vec<GooseRule>,
    pub verdict: Verdict,
    pub timeline: Vec<Sample>,
}

pub struct Inputs<'a> {
    pub plan: &'a Plan,
    pub event: &'a EventInfo,
    pub run: &'a Run,
    pub metrics: &'a GooseMetrics,
    pub samples: Vec<Sample>,
    pub figures: Figures,
    pub rules: Vec<RuleResult>,
    pub verdict: Verdict,
    pub pass: bool,
    pub host: &'a str,
}

pub fn build(i: Inputs<'_>) -> Report {
    let latencies = i
        .run
        .latencies
        .lock()
        .expect("not poisoned")
        .iter()
        .map(|(step, l)| LatencySummary {
            request: step.name().to_owned(),
            count: l.raw.len(),
            raw_ms: percentiles(&l.raw),
            corrected_ms: percentiles(&l.corrected),
        })
        .collect();
    let mut statuses: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    for ((step, status), n) in i.run.statuses.lock().expect("not poisoned").iter() {
        statuses
            .entry(step.name().to_owned())
            .or_default()
            .insert(status.clone(), *n);
    }
    let duration_s = i.metrics.duration as f64;
    let answers = i.run.answers.load(std::sync::atomic::Ordering::Relaxed);
    let confirm = i.run.confirm.lock().expect("not poisoned");
    Report {
        pass: i.pass,
        host: i.host.to_owned(),
        plan: i.plan.clone(),
        event: i.event.clone(),
        duration_s,
        arrivals: i.run.dispatcher.counts(),
        throughput_rps: if duration_s > 0.0 {
            answers as f64 / duration_s
        } else {
            0.0
        },
        latencies,
        statuses,
        answers_by_second: i.run.by_second.lock().expect("not poisoned").clone(),
        errors: i.run.errors.lock().expect("not poisoned").clone(),
        journeys: i
            .run
            .outcomes
            .lock()
            .expect("not poisoned")
            .iter()
            .map(|(k, v)| ((*k).to_owned(), *v))
            .collect(),
        confirm_s: (!confirm.is_empty()).then(|| {
            let p = percentiles(&confirm);
            Percentiles {
                p50: p.p50 / 1000.0,
                p95: p.p95 / 1000.0,
                p99: p.p99 / 1000.0,
                max: p.max / 1000.0,
            }
        }),
        figures: i.figures,
        rules: i.rules,
        goose_thresholds: i
            .metrics
            .thresholds
            .iter()
            .map(|t| GooseRule {
                rule: t.rule.clone(),
                observed: t.observed.clone(),
                pass: t.passed,
            })
            .collect(),
        verdict: i.verdict,
        timeline: i.samples,
    }
}

fn mark(pass: bool) -> &'static str {
    if pass {
        "PASS"
    } else {
        "FAIL"
    }
}

/// The Markdown summary (also what the binary prints at the end).
pub fn markdown(r: &Report) -> String {
    let mut m = String::new();
    let _ = writeln!(
        m,
        "# Load test: {} — {}\n",
        serde_json::to_value(r.plan.profile)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default(),
        mark(r.pass)
    );
    let _ = writeln!(
        m,
        "Event `{}` ({} seats, admits {}/s, per-fan limit {}) at {}; {:?} model, {} goose users, {:.0} s.\n",
        r.event.event_id, r.event.capacity, r.event.admission_rate, r.event.per_fan_limit, r.host, r.plan.model, r.plan.pool, r.duration_s
    );
    let _ =
        writeln!(
        m,
        "Arrivals: {} offered, {} dropped (no free user at the scheduled instant); schedule {}.\n",
        r.arrivals.offered,
        r.arrivals.dropped,
        r.plan.schedule.stages.iter().map(|s| s.describe()).collect::<Vec<_>>().join(", ")
    );
    m.push_str("## Thresholds\n\n| rule | observed | verdict |\n| --- | --- | --- |\n");
    for t in &r.goose_thresholds {
        let _ = writeln!(
            m,
            "| goose `{}` | {} | {} |",
            t.rule,
            t.observed,
            mark(t.pass)
        );
    }
    for t in &r.rules {
        let _ = writeln!(
            m,
            "| sale `{}` | {} | {} |",
            t.rule,
            t.observed,
            mark(t.pass)
        );
    }
    let _ = writeln!(m, "\n## Verdict: {}\n", mark(r.verdict.pass));
    m.push_str(&r.verdict.table());
    m.push_str("\n## Latency (ms): raw from sending, corrected from when the request was due\n\n");
    m.push_str("| request | count | p50 | p95 | p99 | max | corrected p50 | p95 | p99 | max |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for l in &r.latencies {
        let (a, b) = (&l.raw_ms, &l.corrected_ms);
        let _ = writeln!(
            m,
            "| {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
            l.request, l.count, a.p50, a.p95, a.p99, a.max, b.p50, b.p95, b.p99, b.max
        );
    }
    if let Some(c) = &r.confirm_s {
        let _ = writeln!(
            m,
            "\nPurchase to `confirmed` (s): p50 {:.2}, p95 {:.2}, p99 {:.2}, max {:.2}.",
            c.p50, c.p95, c.p99, c.max
        );
    }
    let _ = writeln!(
        m,
        "\nThroughput: {:.1} answers/s.\n\n## Answers by request and status\n",
        r.throughput_rps
    );
    m.push_str("| request | statuses |\n| --- | --- |\n");
    for (step, by) in &r.statuses {
        let s: Vec<String> = by.iter().map(|(k, v)| format!("{k}: {v}")).collect();
        let _ = writeln!(m, "| {step} | {} |", s.join(", "));
    }
    m.push_str("\n## Errors\n\n");
    if r.errors.is_empty() {
        m.push_str("None.\n");
    }
    for (why, n) in &r.errors {
        let _ = writeln!(m, "- {n} × {why}");
    }
    m.push_str("\n## How journeys ended\n\n");
    for (how, n) in &r.journeys {
        let _ = writeln!(m, "- {n} × {how}");
    }
    m
}

/// One line of a chart: its label, its colour and what it plots.
type Series<'a> = (&'a str, &'a str, fn(&Sample) -> f64);

/// An SVG line chart of some series over the timeline.
fn chart(title: &str, samples: &[Sample], series: &[Series]) -> String {
    let (w, h, pad) = (640.0, 200.0, 40.0);
    let t0 = samples.first().map_or(0, |s| s.t_ms);
    let t1 = samples.last().map_or(1, |s| s.t_ms).max(t0 + 1);
    let max = samples
        .iter()
        .flat_map(|s| series.iter().map(move |(_, _, f)| f(s)))
        .fold(1.0_f64, f64::max);
    let x = |t: i64| pad + (t - t0) as f64 / (t1 - t0) as f64 * (w - 2.0 * pad);
    let y = |v: f64| h - pad / 2.0 - v / max * (h - pad);
    let mut svg = format!(
        "<figure><figcaption>{title}</figcaption><svg viewBox=\"0 0 {w} {h}\" width=\"{w}\" height=\"{h}\" role=\"img\" aria-label=\"{title}\">\
         <line x1=\"{pad}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#999\"/><text x=\"2\" y=\"14\" font-size=\"11\">{max:.0}</text>\
         <text x=\"{pad}\" y=\"{h}\" font-size=\"11\">0 s</text><text x=\"{}\" y=\"{h}\" font-size=\"11\">{:.0} s</text>",
        y(0.0),
        w - pad,
        y(0.0),
        w - pad - 30.0,
        (t1 - t0) as f64 / 1000.0
    );
    for (i, (name, colour, f)) in series.iter().enumerate() {
        let points: Vec<String> = samples
            .iter()
            .map(|s| format!("{:.1},{:.1}", x(s.t_ms), y(f(s))))
            .collect();
        let _ = write!(
            svg,
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" points=\"{}\"/><text x=\"{}\" y=\"14\" font-size=\"11\" fill=\"{colour}\">{name}</text>",
            points.join(" "),
            pad + 10.0 + i as f64 * 130.0
        );
    }
    svg.push_str("</svg></figure>");
    svg
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The HTML report: the summary, and the timeline as charts.
pub fn html(r: &Report) -> String {
    let s = &r.timeline;
    let charts = [
        chart(
            "Fans in line",
            s,
            &[
                ("queue length", "#1f77b4", |s| s.queue_length as f64),
                ("active", "#ff7f0e", |s| s.active as f64),
            ],
        ),
        chart(
            "Admitted (total)",
            s,
            &[("admitted", "#2ca02c", |s| s.admitted_total as f64)],
        ),
        chart(
            "Seats and orders",
            s,
            &[
                ("sold", "#d62728", |s| s.sold.unwrap_or(0) as f64),
                ("orders confirmed", "#9467bd", |s| s.confirmed() as f64),
            ],
        ),
    ];
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>BoxOffice load test</title>\
         <style>body{{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem}}\
         figure{{margin:1rem 0}}figcaption{{font-weight:600}}pre{{white-space:pre-wrap}}</style></head><body>\
         <h1>BoxOffice load test: {}</h1><p><a href=\"goose.html\">goose's own report</a> · <a href=\"summary.json\">summary.json</a></p>\
         <h2>The sale's timeline</h2>{}<h2>Summary</h2><pre>{}</pre></body></html>",
        mark(r.pass),
        charts.join(""),
        escape(&markdown(r))
    )
}

pub fn write(r: &Report, dir: &Path) -> anyhow::Result<()> {
    let put = |name: &str, text: String| {
        std::fs::write(dir.join(name), text)
            .with_context(|| format!("writing {}", dir.join(name).display()))
    };
    put("summary.json", serde_json::to_string_pretty(r)?)?;
    put("summary.md", markdown(r))?;
    put("report.html", html(r))?;
    Ok(())
}
