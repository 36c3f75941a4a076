//! `admission event create|update|show` and `admission capacity`: the admin
//! API from a terminal. Each prints the API's JSON answer, or its problem
//! detail and exits non-zero.

use anyhow::{bail, Context};
use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use serde_json::{json, Map, Value};

#[derive(Debug, Clone, Args)]
pub struct Admin {
    /// Base URL of the admission service.
    #[arg(
        long,
        env = "BOXOFFICE_ADMIN_URL",
        default_value = "http://127.0.0.1:8081",
        global = true
    )]
    pub admin_url: String,
    #[arg(
        long,
        env = "BOXOFFICE_ADMIN_TOKEN",
        hide_env_values = true,
        global = true,
        default_value = ""
    )]
    pub admin_token: String,
}

#[derive(Debug, Subcommand)]
pub enum EventCommand {
    /// Create or replace an event.
    Create {
        id: String,
        #[arg(long)]
        name: String,
        #[arg(long)]
        capacity: i64,
        /// RFC 3339, e.g. 2026-12-01T10:00:00Z.
        #[arg(long)]
        opens_at: DateTime<Utc>,
        #[arg(long)]
        prequeue_at: Option<DateTime<Utc>>,
        /// Fans admitted per second.
        #[arg(long)]
        rate: f64,
        #[arg(long)]
        max_active: Option<u64>,
        #[arg(long)]
        access_ttl_s: Option<u64>,
        #[arg(long)]
        per_fan_limit: Option<u32>,
        #[arg(long)]
        max_queue: Option<u64>,
        #[arg(long)]
        price_cents: Option<i64>,
    },
    /// Tune a live event.
    Update {
        id: String,
        #[arg(long)]
        rate: Option<f64>,
        #[arg(long)]
        max_active: Option<u64>,
        /// `open`, `paused` or `closed`.
        #[arg(long)]
        state: Option<String>,
    },
    /// Settings and live stats.
    Show { id: String },
}

#[derive(Debug, Args)]
pub struct CapacityArgs {
    /// λ, orders per second.
    #[arg(long)]
    pub arrival_rate: f64,
    /// S, milliseconds a worker spends per order.
    #[arg(long)]
    pub service_time_ms: f64,
    #[arg(long, default_value_t = 0.7)]
    pub utilization: f64,
    #[arg(long)]
    pub per_partition_rate: Option<f64>,
    #[arg(long)]
    pub per_consumer_rate: Option<f64>,
    #[arg(long, requires = "spike_s")]
    pub spike_rate: Option<f64>,
    #[arg(long, requires = "spike_rate")]
    pub spike_s: Option<f64>,
}

fn insert_some<T: Into<Value>>(body: &mut Map<String, Value>, key: &str, value: Option<T>) {
    if let Some(value) = value {
        body.insert(key.to_owned(), value.into());
    }
}

pub async fn event(admin: &Admin, command: EventCommand) -> anyhow::Result<Value> {
    let client = reqwest::Client::new();
    let url = |id: &str| {
        format!(
            "{}/admin/v1/events/{id}",
            admin.admin_url.trim_end_matches('/')
        )
    };
    let request = match command {
        EventCommand::Create {
            id,
            name,
            capacity,
            opens_at,
            prequeue_at,
            rate,
            max_active,
            access_ttl_s,
            per_fan_limit,
            max_queue,
            price_cents,
        } => {
            let mut body = Map::new();
            body.insert("name".into(), json!(name));
            body.insert("capacity".into(), json!(capacity));
            body.insert("opens_at".into(), json!(opens_at));
            body.insert("admission_rate_per_s".into(), json!(rate));
            insert_some(&mut body, "prequeue_at", prequeue_at.map(|t| json!(t)));
            insert_some(&mut body, "max_active", max_active);
            insert_some(&mut body, "access_ttl_s", access_ttl_s);
            insert_some(&mut body, "per_fan_limit", per_fan_limit);
            insert_some(&mut body, "max_queue", max_queue);
            insert_some(&mut body, "price_cents", price_cents);
            client.put(url(&id)).json(&body)
        }
        EventCommand::Update {
            id,
            rate,
            max_active,
            state,
        } => {
            let mut body = Map::new();
            insert_some(&mut body, "admission_rate_per_s", rate);
            insert_some(&mut body, "max_active", max_active);
            insert_some(&mut body, "state", state);
            client.patch(url(&id)).json(&body)
        }
        EventCommand::Show { id } => client.get(url(&id)),
    };
    send(request.bearer_auth(&admin.admin_token)).await
}

pub async fn capacity(admin: &Admin, args: CapacityArgs) -> anyhow::Result<Value> {
    let mut query = vec![
        ("arrival_rate", args.arrival_rate),
        ("service_time_ms", args.service_time_ms),
        ("utilization", args.utilization),
    ];
    for (key, value) in [
        ("per_partition_rate", args.per_partition_rate),
        ("per_consumer_rate", args.per_consumer_rate),
        ("spike_rate", args.spike_rate),
        ("spike_s", args.spike_s),
    ] {
        if let Some(value) = value {
            query.push((key, value));
        }
    }
    let url = format!(
        "{}/admin/v1/capacity",
        admin.admin_url.trim_end_matches('/')
    );
    send(
        reqwest::Client::new()
            .get(url)
            .query(&query)
            .bearer_auth(&admin.admin_token),
    )
    .await
}

async fn send(request: reqwest::RequestBuilder) -> anyhow::Result<Value> {
    let response = request.send().await.context("calling the admin API")?;
    let status = response.status();
    let text = response
        .text()
        .await
        .context("reading the admin API's answer")?;
    let body: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    if !status.is_success() {
        bail!(
            "{status}: {}",
            body["detail"].as_str().unwrap_or("no detail")
        );
    }
    Ok(body)
}
