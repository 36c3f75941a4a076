//! The sale's own thresholds, beside goose's `--threshold` rules (which
//! judge latencies, error rate and requests/s per request).
//!
//! A rule is `NAME OP VALUE` or `verdict`:
//! - `admission-accuracy` — |admitted/s − set rate| / set rate, in %, over
//!   the longest stretch in which fans waited and nothing else held admission
//!   back (paused, `max_active`, sold out);
//! - `dropped` — arrivals that found no free goose user (a count, or `%` of
//!   arrivals);
//! - `sold-out-after` — seconds from `opens_at` to sold out;
//! - `confirm-p95` — 95th percentile, from purchase to `confirmed`;
//! - `errors` — answers classified as errors (a count, or `%` of answers);
//! - `verdict` — the invariants hold.
//!
//! A rule whose figure could not be measured fails and says so.

use anyhow::{bail, Context};
use serde::Serialize;

use crate::arrivals::parse_duration;

/// The run's figures the rules judge.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Figures {
    pub admission_accuracy_pct: Option<f64>,
    pub arrivals: u64,
    pub dropped: u64,
    pub sold_out_after_s: Option<f64>,
    pub confirm_p95_s: Option<f64>,
    pub answers: u64,
    pub errors: u64,
    pub verdict_pass: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Op {
    Lt,
    Le,
    Gt,
    Ge,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    text: String,
    name: String,
    op: Op,
    limit: f64,
    percent: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct RuleResult {
    pub rule: String,
    pub observed: String,
    pub pass: bool,
}

const NAMES: [&str; 6] = [
    "admission-accuracy",
    "dropped",
    "sold-out-after",
    "confirm-p95",
    "errors",
    "verdict",
];

impl std::str::FromStr for Rule {
    type Err = anyhow::Error;

    fn from_str(text: &str) -> anyhow::Result<Self> {
        let text = text.trim();
        if text == "verdict" {
            return Ok(Rule {
                text: text.into(),
                name: "verdict".into(),
                op: Op::Ge,
                limit: 1.0,
                percent: false,
            });
        }
        let at = text
            .find(['<', '>'])
            .with_context(|| format!("rule `{text}`: expected NAME<VALUE, NAME<=VALUE, NAME>VALUE, NAME>=VALUE or `verdict`"))?;
        let name = text[..at].trim();
        let rest = &text[at..];
        let (op, value) = if let Some(v) = rest.strip_prefix("<=") {
            (Op::Le, v)
        } else if let Some(v) = rest.strip_prefix(">=") {
            (Op::Ge, v)
        } else if let Some(v) = rest.strip_prefix('<') {
            (Op::Lt, v)
        } else {
            (Op::Gt, &rest[1..])
        };
        if !NAMES.contains(&name) || name == "verdict" {
            bail!(
                "rule `{text}`: unknown figure `{name}` (known: {})",
                NAMES.join(", ")
            );
        }
        let value = value.trim();
        let (limit, percent) = match name {
            "sold-out-after" | "confirm-p95" => (parse_duration(value)?.as_secs_f64(), false),
            _ => match value.strip_suffix('%') {
                Some(v) => (
                    v.trim()
                        .parse::<f64>()
                        .with_context(|| format!("rule `{text}`: not a number"))?,
                    true,
                ),
                None => (
                    value
                        .parse::<f64>()
                        .with_context(|| format!("rule `{text}`: not a number"))?,
                    false,
                ),
            },
        };
        if name == "admission-accuracy" && !percent {
            bail!("rule `{text}`: admission accuracy is a percentage, e.g. admission-accuracy<=2%");
        }
        Ok(Rule {
            text: text.into(),
            name: name.into(),
            op,
            limit,
            percent,
        })
    }
}

impl Rule {
    pub fn judge(&self, f: &Figures) -> RuleResult {
        let share = |n: u64, of: u64| {
            if of == 0 {
                0.0
            } else {
                n as f64 * 100.0 / of as f64
            }
        };
        let observed: Option<(f64, String)> = match self.name.as_str() {
            "verdict" => f.verdict_pass.map(|p| {
                (
                    f64::from(u8::from(p)),
                    if p { "PASS" } else { "FAIL" }.to_owned(),
                )
            }),
            "admission-accuracy" => f.admission_accuracy_pct.map(|v| (v, format!("{v:.2}%"))),
            "sold-out-after" => f.sold_out_after_s.map(|v| (v, format!("{v:.1}s"))),
            "confirm-p95" => f.confirm_p95_s.map(|v| (v, format!("{v:.2}s"))),
            "dropped" if self.percent => Some((
                share(f.dropped, f.arrivals),
                format!(
                    "{:.2}% ({} of {})",
                    share(f.dropped, f.arrivals),
                    f.dropped,
                    f.arrivals
                ),
            )),
            "dropped" => Some((f.dropped as f64, format!("{} of {}", f.dropped, f.arrivals))),
            "errors" if self.percent => Some((
                share(f.errors, f.answers),
                format!(
                    "{:.2}% ({} of {})",
                    share(f.errors, f.answers),
                    f.errors,
                    f.answers
                ),
            )),
            "errors" => Some((
                f.errors as f64,
                format!("{} of {} answers", f.errors, f.answers),
            )),
            _ => None,
        };
        let Some((value, shown)) = observed else {
            return RuleResult {
                rule: self.text.clone(),
                observed: "not measured".into(),
                pass: false,
            };
        };
        let pass = match self.op {
            Op::Lt => value < self.limit,
            Op::Le => value <= self.limit,
            Op::Gt => value > self.limit,
            Op::Ge => value >= self.limit,
        };
        RuleResult {
            rule: self.text.clone(),
            observed: shown,
            pass,
        }
    }
}

/// Parses every rule first, so a typo fails before the run, not after.
pub fn parse_all(rules: &[String]) -> anyhow::Result<Vec<Rule>> {
    rules.iter().map(|r| r.parse()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures() -> Figures {
        Figures {
            admission_accuracy_pct: Some(1.2),
            arrivals: 1_000,
            dropped: 3,
            sold_out_after_s: Some(42.0),
            confirm_p95_s: Some(1.5),
            answers: 10_000,
            errors: 0,
            verdict_pass: Some(true),
        }
    }

    fn pass(rule: &str, f: &Figures) -> bool {
        rule.parse::<Rule>().unwrap().judge(f).pass
    }

    #[test]
    fn rules_judge_the_run() {
        let f = figures();
        assert!(pass("admission-accuracy<=2%", &f));
        assert!(!pass("admission-accuracy<1%", &f));
        assert!(!pass("dropped<=0", &f));
        assert!(pass("dropped<=0.5%", &f));
        assert!(pass("sold-out-after<=1m", &f));
        assert!(!pass("sold-out-after<30s", &f));
        assert!(pass("confirm-p95<=2s", &f));
        assert!(!pass(
            "confirm-p95<=1500ms",
            &Figures {
                confirm_p95_s: Some(1.6),
                ..f.clone()
            }
        ));
        assert!(pass("errors<=0", &f));
        assert!(pass("verdict", &f));
        assert!(!pass(
            "verdict",
            &Figures {
                verdict_pass: Some(false),
                ..f.clone()
            }
        ));
    }

    #[test]
    fn a_figure_not_measured_fails_the_rule() {
        let f = Figures::default();
        let r: Rule = "sold-out-after<=90s".parse().unwrap();
        let result = r.judge(&f);
        assert!(!result.pass);
        assert_eq!(result.observed, "not measured");
        assert!(!pass("verdict", &f));
        assert!(!pass("admission-accuracy<=2%", &f));
    }

    #[test]
    fn bad_rules_are_refused_before_the_run() {
        for bad in [
            "p95<1s",
            "dropped",
            "dropped<=lots",
            "admission-accuracy<=2",
            "errors=0",
            "confirm-p95<=soon",
        ] {
            assert!(bad.parse::<Rule>().is_err(), "{bad}");
        }
    }
}
