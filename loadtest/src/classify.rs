//! Every answer a fan gets is either expected (the system doing its job,
//! including refusing) or an error. goose's error rate counts errors only.
//!
//! Expected: any 2xx to a well-behaved fan; 410 `sold-out`/`closed` (and
//! `expired` on a status poll); 429 and 503 that carry `Retry-After` (the fan
//! honours it); 409 `not-open` with `Retry-After` and 428 on a join; 409
//! `seats-held` with `Retry-After` on a purchase; the 4xx
//! a misbehaving fan has earned. Errors: any other 5xx, a 429/503 without
//! `Retry-After`, a 4xx a well-behaved fan should never get, a 2xx to an
//! attack, a timeout or a broken connection.

use serde::Serialize;

/// The request a fan makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    Challenge,
    Join,
    Status,
    Buy,
    Order,
    Tickets,
    /// A misbehaving fan's request (replayed, expired or greedy purchase).
    Attack,
}

impl Step {
    pub const ALL: [Step; 7] = [
        Step::Challenge,
        Step::Join,
        Step::Status,
        Step::Buy,
        Step::Order,
        Step::Tickets,
        Step::Attack,
    ];

    /// The request's name in goose's reports and `--threshold … for NAME`
    /// rules (goose puts the method in front: `POST join`).
    pub fn name(self) -> &'static str {
        match self {
            Step::Challenge => "challenge",
            Step::Join => "join",
            Step::Status => "status",
            Step::Buy => "buy",
            Step::Order => "order",
            Step::Tickets => "tickets",
            Step::Attack => "attack",
        }
    }
}

/// What a misbehaving fan tries, and what it must get.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Attack {
    /// Buys again with an access token that already bought: 409.
    Replay,
    /// Buys with an access token past its expiry: 401.
    Expired,
    /// Asks for more seats than the per-fan limit: 422.
    TooMany,
}

impl Attack {
    pub fn name(self) -> &'static str {
        match self {
            Attack::Replay => "replayed token",
            Attack::Expired => "expired token",
            Attack::TooMany => "too many seats",
        }
    }
}

/// One answer as seen by the fan.
#[derive(Debug, Clone, Copy)]
pub struct Answer<'a> {
    /// `None`: no answer (timeout, refused or broken connection).
    pub status: Option<u16>,
    /// The problem document's slug (the end of its `type`), if any.
    pub slug: Option<&'a str>,
    pub retry_after: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Class {
    Expected,
    /// An error, with a short reason for the report.
    Error(String),
}

impl Class {
    pub fn is_error(&self) -> bool {
        matches!(self, Class::Error(_))
    }
}

/// Classifies `answer` to `step`; `attack` is set for a misbehaving fan's
/// request.
pub fn classify(step: Step, attack: Option<Attack>, answer: Answer<'_>) -> Class {
    let Some(status) = answer.status else {
        return Class::Error("no answer (timeout or connection)".into());
    };
    let slug = answer.slug.unwrap_or("");
    let error = |why: &str| Class::Error(format!("{status} {slug}: {why}").replace(" :", ":"));
    if status == 429 || status == 503 {
        return if answer.retry_after {
            Class::Expected
        } else {
            error("no Retry-After")
        };
    }
    if status >= 500 {
        return error("server error");
    }
    if let Some(attack) = attack {
        // The token is checked before the stock, so a 410 would mean the
        // check was skipped and only the sell-out stopped the attack.
        let earned = match attack {
            Attack::Replay => status == 409,
            Attack::Expired => status == 401,
            Attack::TooMany => status == 422,
        };
        return if earned {
            Class::Expected
        } else if (200..300).contains(&status) {
            error(&format!("the {} was accepted", attack.name()))
        } else {
            error(&format!("unexpected answer to a {}", attack.name()))
        };
    }
    if (200..300).contains(&status) {
        return Class::Expected;
    }
    let expected = match step {
        Step::Join => {
            matches!(status, 410 | 428)
                || (status == 409 && slug == "not-open" && answer.retry_after)
        }
        Step::Status => status == 410,
        Step::Buy => {
            (status == 410 && matches!(slug, "sold-out" | "closed"))
                || (status == 409 && slug == "seats-held" && answer.retry_after)
        }
        Step::Challenge | Step::Order | Step::Tickets | Step::Attack => false,
    };
    if expected {
        Class::Expected
    } else {
        error("a well-behaved fan should never get this")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, slug: &str, retry_after: bool) -> Answer<'_> {
        Answer {
            status: Some(status),
            slug: (!slug.is_empty()).then_some(slug),
            retry_after,
        }
    }

    #[test]
    fn refusals_that_say_when_to_come_back_are_expected() {
        for step in Step::ALL {
            assert_eq!(
                classify(step, None, answer(429, "rate-limited", true)),
                Class::Expected
            );
            assert_eq!(
                classify(step, None, answer(503, "overloaded", true)),
                Class::Expected
            );
            assert!(classify(step, None, answer(429, "rate-limited", false)).is_error());
            assert!(classify(step, None, answer(503, "overloaded", false)).is_error());
            assert!(classify(step, None, answer(500, "internal", true)).is_error());
            assert!(classify(step, None, answer(502, "", false)).is_error());
        }
    }

    #[test]
    fn sold_out_and_lifecycle_answers_are_the_edge_doing_its_job() {
        assert_eq!(
            classify(Step::Join, None, answer(410, "sold-out", false)),
            Class::Expected
        );
        assert_eq!(
            classify(Step::Join, None, answer(409, "not-open", true)),
            Class::Expected
        );
        assert!(classify(Step::Join, None, answer(409, "not-open", false)).is_error());
        assert_eq!(
            classify(
                Step::Join,
                None,
                answer(428, "proof-of-work-required", false)
            ),
            Class::Expected
        );
        assert_eq!(
            classify(Step::Status, None, answer(410, "expired", false)),
            Class::Expected
        );
        assert_eq!(
            classify(Step::Buy, None, answer(410, "sold-out", false)),
            Class::Expected
        );
        assert_eq!(
            classify(Step::Buy, None, answer(202, "", false)),
            Class::Expected
        );
    }

    #[test]
    fn a_well_behaved_fan_never_gets_these() {
        assert!(classify(Step::Status, None, answer(401, "invalid-ticket", false)).is_error());
        assert!(classify(Step::Buy, None, answer(409, "token-used", false)).is_error());
        assert_eq!(
            classify(Step::Buy, None, answer(409, "seats-held", true)),
            Class::Expected,
            "every seat held by fans paying: come back"
        );
        assert!(classify(Step::Buy, None, answer(409, "seats-held", false)).is_error());
        assert!(classify(Step::Buy, None, answer(422, "invalid-quantity", false)).is_error());
        assert!(classify(
            Step::Tickets,
            None,
            answer(404, "tickets-not-issued", false)
        )
        .is_error());
        assert!(classify(Step::Join, None, answer(422, "invalid-body", false)).is_error());
        assert!(classify(
            Step::Order,
            None,
            Answer {
                status: None,
                slug: None,
                retry_after: false
            }
        )
        .is_error());
    }

    #[test]
    fn attacks_must_be_refused_and_an_accepted_attack_is_an_error() {
        let attack = |a, status, slug| classify(Step::Attack, Some(a), answer(status, slug, false));
        assert_eq!(attack(Attack::Replay, 409, "token-used"), Class::Expected);
        assert_eq!(
            attack(Attack::Expired, 401, "invalid-token"),
            Class::Expected
        );
        assert_eq!(
            attack(Attack::TooMany, 422, "invalid-quantity"),
            Class::Expected
        );
        assert!(attack(Attack::Replay, 202, "").is_error());
        assert!(attack(Attack::Expired, 202, "").is_error());
        assert!(attack(Attack::TooMany, 202, "").is_error());
        assert!(attack(Attack::TooMany, 409, "token-used").is_error());
        // Stopped only by the sell-out: the token check did not do its job.
        assert!(attack(Attack::Expired, 410, "sold-out").is_error());
        assert!(attack(Attack::Replay, 410, "sold-out").is_error());
    }
}
