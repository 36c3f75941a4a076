//! The sale's verdict: the design's invariants for one event, read from
//! PostgreSQL, the payment provider and the run's own record of its fans.
//!
//! Loading ([`load`]) and judging ([`judge`]) are apart, so the judge can be
//! fed a broken state in a test. Nothing here trusts the constraints that
//! already forbid a state: seats are counted from the tickets, charges from
//! the provider.

use std::collections::{BTreeMap, HashMap, HashSet};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use uuid::Uuid;

#[derive(Debug, Clone, Serialize)]
pub struct OrderRow {
    pub order_id: Uuid,
    pub fan_id: String,
    /// The access token's `jti` the order was bought with, where recorded.
    pub admission_id: Option<String>,
    pub quantity: i64,
    pub status: String,
    pub first_seat: Option<i64>,
    /// `payments.status` (`captured`, `refunding`, `refunded`), if any.
    pub payment: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct TicketRow {
    pub order_id: Uuid,
    pub seat_no: i64,
}

/// One key at the payment provider (`GET /v1/charges`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChargeRow {
    pub idempotency_key: String,
    pub status: String,
    /// How many times money was taken under this key.
    pub captures: u32,
}

/// What the run saw of one fan: when its join was sent and answered
/// (seconds from the run's start), and when the server admitted it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct FanRecord {
    pub fan_id: String,
    pub join_sent_s: f64,
    pub join_answered_s: f64,
    /// Joined before `opens_at`: placed by the seeded shuffle, not FIFO.
    pub prequeue: bool,
    /// The admission's instant (ms), read from `expires_at − access_ttl`.
    pub admitted_ms: Option<i64>,
    /// The last status answer that said "waiting" (wall clock, ms): the fan
    /// was not admitted before then. What a fan told "sold out" left behind
    /// (the status answers sold out before it looks for an admission).
    pub waiting_until_ms: Option<i64>,
    /// The fan learnt its fate: admitted, or told sold out / closed while
    /// waiting. Fans cut off by the run's end tell nothing about order.
    pub concluded: bool,
    /// Admissions this fan had (each run fan has at most one).
    pub admissions: u32,
}

/// Everything the verdict looks at.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Snapshot {
    pub event_id: String,
    pub capacity: i64,
    pub reserved: i64,
    pub sold: i64,
    pub orders: Vec<OrderRow>,
    pub tickets: Vec<TicketRow>,
    /// `OrderConfirmed` outbox rows per order.
    pub confirmed_events: HashMap<Uuid, i64>,
    /// Orders whose events took effect out of their outbox order.
    pub out_of_order: i64,
    /// `None`: the provider could not be read (the verdict then fails).
    pub charges: Option<Vec<ChargeRow>>,
    pub fans: Vec<FanRecord>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub holds: bool,
    pub detail: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    pub event_id: String,
    pub pass: bool,
    pub checks: Vec<Check>,
    pub capacity: i64,
    pub sold: i64,
    pub confirmed_orders: usize,
    pub tickets: usize,
    pub unsettled_orders: usize,
    pub fairness_pairs_checked: usize,
}

impl Verdict {
    /// The verdict as a Markdown table.
    pub fn table(&self) -> String {
        let mut out = String::from("| invariant | verdict | detail |\n| --- | --- | --- |\n");
        for c in &self.checks {
            let mark = if c.holds { "PASS" } else { "FAIL" };
            out.push_str(&format!("| {} | {mark} | {} |\n", c.name, c.detail));
        }
        out
    }
}

/// Reads the event's state. `provider_url`: the payment provider whose
/// `GET /v1/charges` lists every key with its captures.
pub async fn load(
    pool: &PgPool,
    http: &reqwest::Client,
    provider_url: &str,
    event_id: &str,
    fans: Vec<FanRecord>,
) -> anyhow::Result<Snapshot> {
    let (capacity, reserved, sold): (i32, i32, i32) =
        sqlx::query_as("SELECT capacity, reserved, sold FROM inventory WHERE event_id = $1")
            .bind(event_id)
            .fetch_optional(pool)
            .await?
            .with_context(|| format!("event {event_id} has no inventory row in PostgreSQL"))?;
    type Row = (
        Uuid,
        String,
        Option<String>,
        i32,
        String,
        Option<i32>,
        Option<String>,
    );
    let orders = sqlx::query_as::<_, Row>(
        "SELECT o.order_id, o.fan_id, o.admission_id, o.quantity, o.status, o.first_seat, p.status
         FROM orders o LEFT JOIN payments p USING (order_id) WHERE o.event_id = $1",
    )
    .bind(event_id)
    .fetch_all(pool)
    .await?
    .into_iter()
    .map(
        |(order_id, fan_id, admission_id, quantity, status, first_seat, payment)| OrderRow {
            order_id,
            fan_id,
            admission_id,
            quantity: quantity.into(),
            status,
            first_seat: first_seat.map(Into::into),
            payment,
        },
    )
    .collect();
    let tickets = sqlx::query_as::<_, (Uuid, i32)>(
        "SELECT order_id, seat_no FROM tickets WHERE event_id = $1",
    )
    .bind(event_id)
    .fetch_all(pool)
    .await?
    .into_iter()
    .map(|(order_id, seat_no)| TicketRow {
        order_id,
        seat_no: seat_no.into(),
    })
    .collect();
    let confirmed_events = sqlx::query_as::<_, (Uuid, i64)>(
        "SELECT o.order_id, count(*) FROM orders o JOIN outbox x ON x.aggregate_id = o.order_id::text
         WHERE o.event_id = $1 AND x.event_type = 'boxoffice.order.confirmed.v1' GROUP BY o.order_id",
    )
    .bind(event_id)
    .fetch_all(pool)
    .await?
    .into_iter()
    .collect();
    // Each consumer must apply one order's events in their outbox order.
    let out_of_order: i64 = sqlx::query_scalar(
        "SELECT count(DISTINCT aggregate_id) FROM (
           SELECT x.aggregate_id, p.seq,
                  lag(p.seq) OVER (PARTITION BY p.consumer, x.aggregate_id ORDER BY x.id) AS before
           FROM orders o
           JOIN outbox x ON x.aggregate_id = o.order_id::text
           JOIN processed_events p ON p.event_id::text = x.payload->>'id'
           WHERE o.event_id = $1) s
         WHERE before > seq",
    )
    .bind(event_id)
    .fetch_one(pool)
    .await?;
    let charges = match http
        .get(format!("{}/v1/charges", provider_url.trim_end_matches('/')))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
    {
        Ok(response) => response.json::<Vec<ChargeRow>>().await.ok(),
        Err(_) => None,
    };
    Ok(Snapshot {
        event_id: event_id.to_owned(),
        capacity: capacity.into(),
        reserved: reserved.into(),
        sold: sold.into(),
        orders,
        tickets,
        confirmed_events,
        out_of_order,
        charges,
        fans,
    })
}

/// Orders not yet in a final state (the saga still owes them a step).
pub fn unsettled(snapshot: &Snapshot) -> usize {
    snapshot
        .orders
        .iter()
        .filter(|o| {
            matches!(o.status.as_str(), "pending" | "reserved" | "charged")
                || o.payment.as_deref() == Some("refunding")
        })
        .count()
}

/// Confirmed orders whose tickets are not all there yet.
pub fn tickets_due(snapshot: &Snapshot) -> usize {
    let mut per_order: HashMap<Uuid, i64> = HashMap::new();
    for t in &snapshot.tickets {
        *per_order.entry(t.order_id).or_default() += 1;
    }
    snapshot
        .orders
        .iter()
        .filter(|o| {
            o.status == "confirmed" && per_order.get(&o.order_id).copied().unwrap_or(0) < o.quantity
        })
        .count()
}

fn check(name: &'static str, problems: Vec<String>, fine: String) -> Check {
    Check {
        name,
        holds: problems.is_empty(),
        detail: if problems.is_empty() {
            fine
        } else {
            problems.join("; ")
        },
    }
}

/// Judges a snapshot taken once the sale has settled.
pub fn judge(s: &Snapshot) -> Verdict {
    let mut checks = Vec::new();
    let confirmed: Vec<&OrderRow> = s
        .orders
        .iter()
        .filter(|o| o.status == "confirmed")
        .collect();
    let confirmed_seats: i64 = confirmed.iter().map(|o| o.quantity).sum();
    let by_id: HashMap<Uuid, &OrderRow> = s.orders.iter().map(|o| (o.order_id, o)).collect();

    // 1. Never oversold, counted from the tickets themselves.
    let mut problems = Vec::new();
    let mut seats = HashSet::new();
    let mut twice = 0;
    for t in &s.tickets {
        if !seats.insert(t.seat_no) {
            twice += 1;
        }
    }
    if twice > 0 {
        problems.push(format!("{twice} seats ticketed more than once"));
    }
    let outside = s
        .tickets
        .iter()
        .filter(|t| t.seat_no < 1 || t.seat_no > s.capacity)
        .count();
    if outside > 0 {
        problems.push(format!(
            "{outside} tickets for seats outside 1..={}",
            s.capacity
        ));
    }
    if s.tickets.len() as i64 > s.capacity {
        problems.push(format!(
            "{} tickets for {} seats",
            s.tickets.len(),
            s.capacity
        ));
    }
    if confirmed_seats > s.capacity {
        problems.push(format!(
            "{confirmed_seats} seats in confirmed orders for {} seats",
            s.capacity
        ));
    }
    if s.reserved + s.sold > s.capacity {
        problems.push(format!(
            "reserved {} + sold {} > capacity {}",
            s.reserved, s.sold, s.capacity
        ));
    }
    if s.sold != confirmed_seats {
        problems.push(format!(
            "inventory says {} sold, confirmed orders hold {confirmed_seats}",
            s.sold
        ));
    }
    checks.push(check(
        "never oversold",
        problems,
        format!(
            "{} tickets, {} distinct seats, capacity {}",
            s.tickets.len(),
            seats.len(),
            s.capacity
        ),
    ));

    // 2. One admission buys once: no access token's jti on two orders, and
    // no run fan (each admitted at most once) with more orders than admissions.
    let mut per_admission: HashMap<&str, u32> = HashMap::new();
    for id in s.orders.iter().filter_map(|o| o.admission_id.as_deref()) {
        *per_admission.entry(id).or_default() += 1;
    }
    let admissions: HashMap<&str, u32> = s
        .fans
        .iter()
        .map(|f| (f.fan_id.as_str(), f.admissions.max(1)))
        .collect();
    let mut orders_per_fan: BTreeMap<&str, u32> = BTreeMap::new();
    for o in &s.orders {
        *orders_per_fan.entry(o.fan_id.as_str()).or_default() += 1;
    }
    let mut twice: Vec<String> = per_admission
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(id, n)| format!("admission {id} has {n} orders"))
        .collect();
    twice.extend(
        orders_per_fan
            .iter()
            .filter(|(fan, n)| **n > admissions.get(*fan).copied().unwrap_or(1))
            .map(|(fan, n)| format!("{fan} has {n} orders")),
    );
    twice.sort();
    checks.push(check(
        "one admission buys once",
        if twice.is_empty() {
            vec![]
        } else {
            vec![format!(
                "{} admissions bought more than once ({})",
                twice.len(),
                twice.iter().take(3).cloned().collect::<Vec<_>>().join(", ")
            )]
        },
        format!(
            "{} orders from {} fans",
            s.orders.len(),
            orders_per_fan.len()
        ),
    ));

    // 3. One OrderConfirmed per confirmed order, none for the others.
    let mut problems = Vec::new();
    let wrong = confirmed
        .iter()
        .filter(|o| s.confirmed_events.get(&o.order_id).copied().unwrap_or(0) != 1)
        .count();
    if wrong > 0 {
        problems.push(format!(
            "{wrong} confirmed orders without exactly one OrderConfirmed row"
        ));
    }
    let stray = s
        .confirmed_events
        .keys()
        .filter(|id| by_id.get(id).is_none_or(|o| o.status != "confirmed"))
        .count();
    if stray > 0 {
        problems.push(format!(
            "{stray} OrderConfirmed rows for orders that are not confirmed"
        ));
    }
    checks.push(check(
        "one OrderConfirmed per confirmed order",
        problems,
        format!("{} confirmed orders, one event each", confirmed.len()),
    ));

    // 4. Exactly one ticket set per confirmed order: its seats, once each.
    let mut per_order: HashMap<Uuid, Vec<i64>> = HashMap::new();
    for t in &s.tickets {
        per_order.entry(t.order_id).or_default().push(t.seat_no);
    }
    let mut problems = Vec::new();
    let (mut missing, mut doubled) = (0, 0);
    for o in &confirmed {
        let mut got = per_order.get(&o.order_id).cloned().unwrap_or_default();
        got.sort_unstable();
        let want: Vec<i64> = match o.first_seat {
            Some(first) => (first..first + o.quantity).collect(),
            None => vec![],
        };
        if got.len() < want.len() || o.first_seat.is_none() {
            missing += 1;
        } else if got != want {
            doubled += 1;
        }
    }
    if missing > 0 {
        problems.push(format!(
            "{missing} confirmed orders without their whole ticket set"
        ));
    }
    if doubled > 0 {
        problems.push(format!(
            "{doubled} confirmed orders with extra or wrong tickets"
        ));
    }
    let orphans = per_order
        .keys()
        .filter(|id| by_id.get(id).is_none_or(|o| o.status != "confirmed"))
        .count();
    if orphans > 0 {
        problems.push(format!(
            "{orphans} orders that are not confirmed hold tickets"
        ));
    }
    checks.push(check(
        "one ticket set per confirmed order",
        problems,
        format!(
            "{} tickets for {} confirmed orders",
            s.tickets.len(),
            confirmed.len()
        ),
    ));

    // 5. No money kept without a confirmed order or a refund.
    let mut problems = Vec::new();
    let mut charged_keys = 0;
    match &s.charges {
        None => problems.push("the payment provider's charges could not be read".into()),
        Some(charges) => {
            let ours: Vec<&ChargeRow> = charges
                .iter()
                .filter(|c| {
                    c.idempotency_key
                        .parse::<Uuid>()
                        .is_ok_and(|id| by_id.contains_key(&id))
                })
                .collect();
            charged_keys = ours.len();
            let double = ours.iter().filter(|c| c.captures > 1).count();
            if double > 0 {
                problems.push(format!("{double} orders charged more than once"));
            }
            let kept = ours
                .iter()
                .filter(|c| c.status == "captured")
                .filter(|c| {
                    let order = by_id[&c.idempotency_key.parse::<Uuid>().expect("filtered above")];
                    order.status != "confirmed"
                })
                .count();
            if kept > 0 {
                problems.push(format!(
                    "{kept} captures kept for orders that are not confirmed"
                ));
            }
            let captured: HashSet<&str> = ours
                .iter()
                .filter(|c| c.status == "captured")
                .map(|c| c.idempotency_key.as_str())
                .collect();
            let unpaid = confirmed
                .iter()
                .filter(|o| !captured.contains(o.order_id.to_string().as_str()))
                .count();
            if unpaid > 0 {
                problems.push(format!("{unpaid} confirmed orders without a capture"));
            }
        }
    }
    checks.push(check(
        "no money kept without a confirmed order or a refund",
        problems,
        format!("{charged_keys} keys at the provider, each captured at most once"),
    ));

    // 6. Each order's events take effect in their order.
    checks.push(check(
        "per-order event order",
        if s.out_of_order > 0 {
            vec![format!(
                "{} orders had events applied out of order",
                s.out_of_order
            )]
        } else {
            vec![]
        },
        "every order's events applied in outbox order".into(),
    ));

    // 7. Every order reached a final state, and no seat is held by nobody.
    let open = unsettled(s);
    let mut problems = Vec::new();
    if open > 0 {
        problems.push(format!(
            "{open} orders still in progress (pending, reserved, charged or refunding)"
        ));
    }
    let held: i64 = s
        .orders
        .iter()
        .filter(|o| matches!(o.status.as_str(), "reserved" | "charged"))
        .map(|o| o.quantity)
        .sum();
    if s.reserved != held {
        problems.push(format!(
            "inventory holds {} seats, orders in progress {held}",
            s.reserved
        ));
    }
    checks.push(check(
        "every order settled",
        problems,
        format!("{} orders, all final, no seat left held", s.orders.len()),
    ));

    // 8. Fairness: after opening, admission order follows join order.
    let (pairs, overtook) = overtakers(&s.fans);
    checks.push(check(
        "fairness (admission follows join order)",
        if overtook.is_empty() {
            vec![]
        } else {
            vec![format!(
                "{} fans admitted ahead of a fan who had joined before them (e.g. {})",
                overtook.len(),
                overtook
                    .iter()
                    .take(3)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            )]
        },
        format!("0 inversions among {pairs} fans who joined after opening"),
    ));

    Verdict {
        event_id: s.event_id.clone(),
        pass: checks.iter().all(|c| c.holds),
        checks,
        capacity: s.capacity,
        sold: s.sold,
        confirmed_orders: confirmed.len(),
        tickets: s.tickets.len(),
        unsettled_orders: open,
        fairness_pairs_checked: pairs,
    }
}

/// How far the client's clock may be from the server's when a "waiting"
/// answer is compared with an admission instant.
const CLOCK_MARGIN_MS: i64 = 1_000;

/// Counts fans who overtook someone: a fan B (joined after opening) is an
/// overtaker when some fan A whose join was answered before B's join was
/// sent was admitted in a later tick than B, or was still told "waiting"
/// (more than a clock margin) after B's admission. Fans admitted in the same
/// tick tie. Returns (fans checked, the overtakers' ids).
pub fn overtakers(fans: &[FanRecord]) -> (usize, Vec<String>) {
    let concluded: Vec<&FanRecord> = fans.iter().filter(|f| f.concluded).collect();
    // Not admitted before this instant.
    let admit = |f: &FanRecord| match (f.admitted_ms, f.waiting_until_ms) {
        (Some(at), _) => at,
        (None, Some(waiting)) => waiting - CLOCK_MARGIN_MS,
        (None, None) => i64::MIN,
    };
    let mut earlier: Vec<&FanRecord> = concluded.clone();
    earlier.sort_by(|a, b| a.join_answered_s.total_cmp(&b.join_answered_s));
    let mut later: Vec<&FanRecord> = concluded.iter().copied().filter(|f| !f.prequeue).collect();
    later.sort_by(|a, b| a.join_sent_s.total_cmp(&b.join_sent_s));
    let (mut i, mut latest_before, mut overtakers) = (0, i64::MIN, Vec::new());
    for b in &later {
        while i < earlier.len() && earlier[i].join_answered_s < b.join_sent_s {
            latest_before = latest_before.max(admit(earlier[i]));
            i += 1;
        }
        if b.admitted_ms.is_some() && latest_before > admit(b) {
            overtakers.push(b.fan_id.clone());
        }
    }
    (later.len(), overtakers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inversions(fans: &[FanRecord]) -> (usize, usize) {
        let (checked, overtook) = overtakers(fans);
        (checked, overtook.len())
    }

    /// A clean sale: capacity 4; two confirmed orders of 2, paid, ticketed.
    fn clean() -> Snapshot {
        let (a, b, c) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        let order = |id, fan: &str, q, status: &str, first, payment: Option<&str>| OrderRow {
            order_id: id,
            fan_id: fan.into(),
            admission_id: Some(format!("jti-{fan}")),
            quantity: q,
            status: status.into(),
            first_seat: first,
            payment: payment.map(Into::into),
        };
        let charge = |id: Uuid, status: &str, captures| ChargeRow {
            idempotency_key: id.to_string(),
            status: status.into(),
            captures,
        };
        Snapshot {
            event_id: "e".into(),
            capacity: 4,
            reserved: 0,
            sold: 4,
            orders: vec![
                order(a, "fan-a", 2, "confirmed", Some(1), Some("captured")),
                order(b, "fan-b", 2, "confirmed", Some(3), Some("captured")),
                order(c, "fan-c", 1, "failed", None, Some("refunded")),
            ],
            tickets: [(a, 1), (a, 2), (b, 3), (b, 4)]
                .into_iter()
                .map(|(order_id, seat_no)| TicketRow { order_id, seat_no })
                .collect(),
            confirmed_events: [(a, 1), (b, 1)].into_iter().collect(),
            out_of_order: 0,
            charges: Some(vec![
                charge(a, "captured", 1),
                charge(b, "captured", 1),
                charge(c, "refunded", 1),
                charge(Uuid::new_v4(), "captured", 3), // another event's key
            ]),
            fans: vec![],
        }
    }

    fn failing(v: &Verdict) -> Vec<&'static str> {
        v.checks
            .iter()
            .filter(|c| !c.holds)
            .map(|c| c.name)
            .collect()
    }

    #[test]
    fn a_clean_sale_passes() {
        let v = judge(&clean());
        assert!(v.pass, "{}", v.table());
        assert_eq!(v.checks.len(), 8);
    }

    #[test]
    fn an_oversold_seat_fails() {
        let mut s = clean();
        // A third confirmed order ticketed on seat 5 of 4, inventory none the wiser.
        let d = Uuid::new_v4();
        s.orders.push(OrderRow {
            order_id: d,
            fan_id: "fan-d".into(),
            admission_id: None,
            quantity: 1,
            status: "confirmed".into(),
            first_seat: Some(5),
            payment: Some("captured".into()),
        });
        s.tickets.push(TicketRow {
            order_id: d,
            seat_no: 5,
        });
        s.confirmed_events.insert(d, 1);
        s.charges.as_mut().unwrap().push(ChargeRow {
            idempotency_key: d.to_string(),
            status: "captured".into(),
            captures: 1,
        });
        let v = judge(&s);
        assert!(!v.pass);
        assert_eq!(failing(&v), ["never oversold"], "{}", v.table());
    }

    #[test]
    fn a_double_charge_fails() {
        let mut s = clean();
        s.charges.as_mut().unwrap()[0].captures = 2;
        let v = judge(&s);
        assert_eq!(
            failing(&v),
            ["no money kept without a confirmed order or a refund"]
        );
        // Money kept for a failed order, not refunded.
        let mut s = clean();
        s.charges.as_mut().unwrap()[2].status = "captured".into();
        assert_eq!(
            failing(&judge(&s)),
            ["no money kept without a confirmed order or a refund"]
        );
        // A provider that cannot be read is not a pass.
        let mut s = clean();
        s.charges = None;
        assert!(!judge(&s).pass);
    }

    #[test]
    fn a_duplicate_ticket_set_fails() {
        let mut s = clean();
        let a = s.orders[0].order_id;
        s.tickets.push(TicketRow {
            order_id: a,
            seat_no: 1,
        });
        s.tickets.push(TicketRow {
            order_id: a,
            seat_no: 2,
        });
        let v = judge(&s);
        assert!(!v.pass);
        assert!(
            failing(&v).contains(&"one ticket set per confirmed order"),
            "{}",
            v.table()
        );
        assert!(
            failing(&v).contains(&"never oversold"),
            "seats ticketed twice: {}",
            v.table()
        );
    }

    #[test]
    fn an_admission_that_bought_twice_fails() {
        let mut s = clean();
        s.orders[2].fan_id = "fan-a".into();
        assert_eq!(failing(&judge(&s)), ["one admission buys once"]);
        // The same access token on two orders, whoever the fans.
        let mut s = clean();
        s.orders[2].admission_id = s.orders[0].admission_id.clone();
        assert_eq!(failing(&judge(&s)), ["one admission buys once"]);
    }

    #[test]
    fn a_fan_told_sold_out_may_have_been_admitted_unseen() {
        // A, admitted in the last tick but told "sold out" at its next poll,
        // was last told "waiting" at 900: B's admission at 1,000 is fair.
        let mut a = fan("a", 0.0, 0.1, None);
        a.waiting_until_ms = Some(900);
        let b = fan("b", 0.2, 0.3, Some(1_000));
        assert_eq!(inversions(&[a.clone(), b.clone()]), (2, 0));
        // Told "waiting" at 2,500, well after B's admission: B overtook A.
        a.waiting_until_ms = Some(2_500);
        assert_eq!(inversions(&[a, b]), (2, 1));
    }

    #[test]
    fn a_seat_held_by_no_order_in_progress_fails() {
        let mut s = clean();
        s.reserved = 1;
        assert_eq!(
            failing(&judge(&s)),
            ["never oversold", "every order settled"]
        );
    }

    #[test]
    fn missing_events_unsettled_orders_and_order_of_effects_fail() {
        let mut s = clean();
        s.confirmed_events.clear();
        assert_eq!(
            failing(&judge(&s)),
            ["one OrderConfirmed per confirmed order"]
        );
        let mut s = clean();
        s.orders[2].status = "reserved".into();
        assert!(failing(&judge(&s)).contains(&"every order settled"));
        let mut s = clean();
        s.out_of_order = 1;
        assert_eq!(failing(&judge(&s)), ["per-order event order"]);
    }

    fn fan(id: &str, sent: f64, answered: f64, admitted: Option<i64>) -> FanRecord {
        FanRecord {
            fan_id: id.into(),
            join_sent_s: sent,
            join_answered_s: answered,
            prequeue: false,
            admitted_ms: admitted,
            // Told "waiting" at its join's answer at least.
            waiting_until_ms: admitted.is_none().then_some(5_000),
            concluded: true,
            admissions: u32::from(admitted.is_some()),
        }
    }

    #[test]
    fn fairness_counts_fans_who_overtook_an_earlier_joiner() {
        let fair = [
            fan("a", 0.0, 0.1, Some(1_000)),
            fan("b", 0.2, 0.3, Some(1_050)),
            fan("c", 0.25, 0.4, Some(1_000)), // a's tick (a tie); overlaps b's join, so no order with b
            fan("d", 0.5, 0.6, Some(1_100)),
            fan("e", 0.7, 0.8, None), // waited, never admitted (sold out)
        ];
        assert_eq!(inversions(&fair), (5, 0));
        let mut s = clean();
        s.fans = fair.to_vec();
        assert!(judge(&s).pass);

        let mut unfair = fair.to_vec();
        unfair.push(fan("f", 0.9, 1.0, Some(1_200))); // admitted while e still waited
        unfair.push(fan("g", 1.1, 1.2, Some(950))); // ahead of a, b and d
        assert_eq!(inversions(&unfair), (7, 2));
        s.fans = unfair;
        assert_eq!(
            failing(&judge(&s)),
            ["fairness (admission follows join order)"]
        );

        // Prequeue fans are shuffled among themselves, and cut-off fans say nothing.
        let mut pre = vec![
            fan("p", 0.0, 0.1, Some(2_000)),
            fan("q", 0.2, 0.3, Some(1_000)),
        ];
        pre.iter_mut().for_each(|f| f.prequeue = true);
        pre.push(FanRecord {
            concluded: false,
            ..fan("r", 0.4, 0.5, None)
        });
        assert_eq!(inversions(&pre), (0, 0));
    }
}
