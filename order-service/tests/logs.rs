//! `--log-json` on the real binary: every log line is one JSON object;
//! without it, plain text, uncoloured when not written to a terminal.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

fn first_line(args: &[&str]) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_order-service"))
        .args(args)
        .env("RUST_LOG", "info")
        .env_remove("BOXOFFICE_LOG_JSON")
        .env_remove("NO_COLOR")
        .env("PAYMENT_API_KEY", "a-payment-api-key-of-at-least-32-bytes")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    child.kill().ok();
    child.wait().ok();
    line
}

#[test]
fn log_json_writes_one_json_object_a_line() {
    let line = first_line(&["--log-json", "payment-provider", "--listen", "127.0.0.1:0"]);
    let record: serde_json::Value =
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
    assert_eq!(record["level"], "INFO", "{record}");
    assert_eq!(
        record["fields"]["message"], "fake payment provider listening",
        "{record}"
    );
    assert!(record["timestamp"].is_string(), "{record}");

    // Without the flag the same line is plain text.
    let plain = first_line(&["payment-provider", "--listen", "127.0.0.1:0"]);
    assert!(
        plain.contains("fake payment provider listening"),
        "{plain:?}"
    );
    assert!(serde_json::from_str::<serde_json::Value>(&plain).is_err());
    // Written to a pipe, not a terminal: no colour codes in the text.
    assert!(!plain.contains('\x1b'), "{plain:?}");
}
