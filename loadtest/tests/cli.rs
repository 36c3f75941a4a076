//! The load-test binary as a user meets it: a run pointed at a gateway that
//! is not there fails at once with a clear message and exit code 2, and a
//! bad rule is refused before anything starts.

use std::process::Command;
use std::time::{Duration, Instant};

fn loadtest(args: &[&str]) -> (i32, String, Duration) {
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_loadtest"))
        .args(args)
        .env_remove("BOXOFFICE_ADMIN_TOKEN")
        .output()
        .expect("the loadtest binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code().unwrap_or(-1), stderr, started.elapsed())
}

#[test]
fn a_stopped_gateway_fails_fast_with_a_clear_message() {
    // A port nobody listens on any more.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let host = format!("http://127.0.0.1:{port}");
    let (code, stderr, took) = loadtest(&["--profile", "sale", "--host", &host]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains(&format!("the gateway at {host} does not answer")),
        "{stderr}"
    );
    assert!(
        stderr.contains("scripts/up.sh"),
        "says what to do: {stderr}"
    );
    assert!(took < Duration::from_secs(10), "no hang: {took:?}");
}

#[test]
fn a_bad_rule_or_schedule_is_refused_before_the_run() {
    let (code, stderr, _) = loadtest(&["--rule", "p95<1s", "--host", "http://127.0.0.1:9"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("unknown figure `p95`"), "{stderr}");
    let (code, stderr, _) = loadtest(&["--stages", "10s", "--host", "http://127.0.0.1:9"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("not duration:rate"), "{stderr}");
}

#[test]
fn help_names_the_profiles_and_keeps_secrets_out() {
    let out = Command::new(env!("CARGO_BIN_EXE_loadtest"))
        .arg("--help")
        .env("BOXOFFICE_ADMIN_TOKEN", "secret-admin-token-value")
        .env("DATABASE_URL", "postgres://bo:hunter2@db/boxoffice")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    for word in [
        "--profile",
        "steady",
        "spike",
        "soak",
        "sale",
        "--users",
        "--threshold",
        "--rule",
    ] {
        assert!(help.contains(word), "{word} in --help");
    }
    assert!(
        !help.contains("secret-admin-token-value") && !help.contains("hunter2"),
        "{help}"
    );
}
