//! What the real binary does with its secrets at start: refuses missing or
//! well-known ones, and never prints one (in `--help` or in an error).

use std::process::{Command, Output};

const GOOD: &str = "3f9a1c0e7b5d2468ace013579bdf2468ace013579bdf2468";

fn order_service(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_order-service"));
    command.args(args).env_clear().env("RUST_LOG", "warn");
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn the_worker_wants_a_ticket_secret_that_is_not_a_well_known_one() {
    let listen = ["worker", "--listen", "127.0.0.1:0"];
    let missing = order_service(&listen, &[]);
    assert!(!missing.status.success());
    assert!(
        stderr(&missing).contains("--ticket-secret"),
        "{}",
        stderr(&missing)
    );

    // The value the worker used to fall back to, which let anyone mint tickets.
    let old_default = [("BOXOFFICE_TICKET_SECRET", "dev-ticket-secret-change-me")];
    let out = order_service(&listen, &old_default);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("BOXOFFICE_TICKET_SECRET"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn the_order_service_wants_a_service_token_and_a_payment_key() {
    let serve = ["serve", "--listen", "127.0.0.1:0"];
    let out = order_service(&serve, &[("PAYMENT_API_KEY", GOOD)]);
    assert!(stderr(&out).contains("--service-token"), "{}", stderr(&out));
    let out = order_service(
        &serve,
        &[
            ("PAYMENT_API_KEY", "change-me-change-me-change-me-change-me"),
            ("BOXOFFICE_SERVICE_TOKEN", GOOD),
        ],
    );
    assert!(
        stderr(&out).contains("PAYMENT_API_KEY is a well-known"),
        "{}",
        stderr(&out)
    );
    let out = order_service(&["payment-provider"], &[("PAYMENT_API_KEY", "short")]);
    assert!(
        stderr(&out).contains("PAYMENT_API_KEY must be at least 32 bytes"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_database_password_never_reaches_the_log() {
    let out = order_service(
        &["serve", "--listen", "127.0.0.1:0"],
        &[
            ("BOXOFFICE_SERVICE_TOKEN", GOOD),
            ("PAYMENT_API_KEY", GOOD),
            // Nothing listens on port 1: the start fails and says where it tried.
            (
                "DATABASE_URL",
                "postgres://bo:db-password-do-not-print@127.0.0.1:1/boxoffice",
            ),
        ],
    );
    let text = stderr(&out);
    assert!(!out.status.success());
    assert!(
        text.contains("postgres://bo:***@127.0.0.1:1/boxoffice"),
        "{text}"
    );
    assert!(!text.contains("do-not-print"), "{text}");
}

#[test]
fn help_never_prints_a_secret() {
    let env = [
        ("BOXOFFICE_SERVICE_TOKEN", "service-token-do-not-print"),
        ("BOXOFFICE_SERVICE_TOKENS_ACCEPTED", "accepted-do-not-print"),
        ("PAYMENT_API_KEY", "payment-key-do-not-print"),
        ("BOXOFFICE_TICKET_SECRET", "ticket-secret-do-not-print"),
        (
            "DATABASE_URL",
            "postgres://bo:db-password-do-not-print@db/boxoffice",
        ),
        (
            "REDIS_URL",
            "rediss://default:redis-password-do-not-print@cache:6380",
        ),
    ];
    for command in ["serve", "worker", "payment-provider"] {
        let out = order_service(&[command, "--help"], &env);
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(help.contains("[env: "), "{command}: {help}");
        assert!(!help.contains("do-not-print"), "{command}: {help}");
    }
}
