//! The `admission` binary's admin commands against a real admin API on port 0.

mod common;

use std::process::Output;

use boxoffice_contract::event::EventConfig;
use boxoffice_contract::keys::EventKeys;
use redis::AsyncCommands;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

async fn cli(url: &str, args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_admission"))
        .args(args)
        .env("BOXOFFICE_ADMIN_URL", url)
        .env("BOXOFFICE_ADMIN_TOKEN", "admin")
        .env("RUST_BACKTRACE", "0")
        .output()
        .await
        .unwrap()
}

fn json(output: &Output) -> Value {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn ops_tune_and_read_an_event_and_plan_capacity_from_the_terminal(pool: sqlx::PgPool) {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let mut redis = redis::aio::ConnectionManager::new(redis::Client::open(url).unwrap())
        .await
        .unwrap();
    let prefix = format!("t{}", uuid::Uuid::new_v4().simple());
    let keys = EventKeys::new(&prefix, "ev");
    let config = {
        let mut c = EventConfig::open("Cli", 10, 5.0);
        c.max_active = 10;
        c.access_ttl_s = 60;
        c.per_fan_limit = 2;
        c.max_queue = 10;
        c.shuffle_seed = "seed".into();
        c
    };
    let _: () = redis
        .hset_multiple(keys.config(), &config.to_fields())
        .await
        .unwrap();

    let (order_service_url, order_service) =
        common::order_service(pool, &prefix, redis.clone(), "ev").await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let admin = {
        let mut c = admission::Config::defaults("admin");
        c.redis_prefix = prefix.clone();
        c.service = common::service();
        c.order_service_url = order_service_url;
        c
    };
    let cancel = CancellationToken::new();
    let stop = cancel.clone();
    let server = tokio::spawn(admission::serve(
        listener,
        admission::AppState::new(redis.clone(), admin).unwrap(),
        async move { stop.cancelled().await },
    ));

    let updated = json(
        &cli(
            &base,
            &[
                "event", "update", "ev", "--rate", "12.5", "--state", "paused",
            ],
        )
        .await,
    );
    assert_eq!(
        (
            updated["admission_rate_per_s"].as_f64(),
            updated["state"].as_str()
        ),
        (Some(12.5), Some("paused"))
    );
    let shown = json(&cli(&base, &["event", "show", "ev"]).await);
    assert_eq!(shown["admission_rate_per_s"], 12.5);
    let plan = json(
        &cli(
            &base,
            &[
                "capacity",
                "--arrival-rate",
                "200",
                "--service-time-ms",
                "50",
            ],
        )
        .await,
    );
    assert_eq!(plan["workers"], 15);

    let refused = cli(&base, &["event", "update", "ev", "--max-active", "0"]).await;
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("max_active"),
        "the field is named"
    );
    let unknown = cli(&base, &["event", "show", "nope"]).await;
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("404"));

    cancel.cancel();
    server.await.unwrap().unwrap();
    order_service.cancel();
    let all: Vec<String> = redis.keys(format!("{prefix}:*")).await.unwrap();
    let _: () = redis.del(all).await.unwrap();
}

/// `admission serve` refuses an admin token or service token it must not
/// run with, and `--help` shows neither.
#[tokio::test]
async fn serve_refuses_short_or_well_known_secrets_and_help_hides_them() {
    let good = "3f9a1c0e7b5d2468ace013579bdf2468ace013579bdf2468";
    let serve = |admin: &'static str, service: &'static str| {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_admission"))
            .args(["serve", "--listen", "127.0.0.1:0"])
            .env_clear()
            .env("BOXOFFICE_ADMIN_TOKEN", admin)
            .env("BOXOFFICE_SERVICE_TOKEN", service)
            .env("REDIS_URL", "redis://127.0.0.1:1")
            .output()
    };
    for (admin, service, why) in [
        (
            "admin",
            good,
            "BOXOFFICE_ADMIN_TOKEN must be at least 32 bytes",
        ),
        (
            "dev-admin-token-0123456789abcdef0123",
            good,
            "BOXOFFICE_ADMIN_TOKEN is a well-known",
        ),
        (good, "", "BOXOFFICE_SERVICE_TOKEN is required"),
    ] {
        let out = serve(admin, service).await.unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{admin} {service}");
        assert!(stderr.contains(why), "{admin} {service}: {stderr}");
    }
    let help = tokio::process::Command::new(env!("CARGO_BIN_EXE_admission"))
        .args(["serve", "--help"])
        .env("BOXOFFICE_ADMIN_TOKEN", "admin-token-do-not-print")
        .env("BOXOFFICE_SERVICE_TOKEN", "service-token-do-not-print")
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(text.contains("BOXOFFICE_ADMIN_TOKEN"), "{text}");
    assert!(!text.contains("do-not-print"), "{text}");
}
