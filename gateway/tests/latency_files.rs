//! The edge benchmark's fixed-rate latencies (`benches/common/latency_files.rs`):
//! a quantile is read by position, and a server's rounds, each in a file
//! of its own, are pooled whole.

#[path = "../benches/common/latency_files.rs"]
mod latency_files;

use latency_files::{pooled, quantile_ms, to_bytes};

/// 1, 2, … 1,000 µs: the p50 is the 501st, the p99 the 991st, the p99.9
/// the 1,000th; `q` = 1 is the last and no latencies read as NaN.
#[test]
fn a_quantile_is_read_by_position() {
    let sorted: Vec<u32> = (1..=1_000).collect();
    assert_eq!(quantile_ms(&sorted, 0.50), 0.501);
    assert_eq!(quantile_ms(&sorted, 0.99), 0.991);
    assert_eq!(quantile_ms(&sorted, 0.999), 1.0);
    assert_eq!(quantile_ms(&sorted, 1.0), 1.0);
    assert_eq!(quantile_ms(&[7_000], 0.99), 7.0);
    assert!(quantile_ms(&[], 0.99).is_nan());
}

/// Two rounds of one server: a round of a hundred 1 ms requests, and one
/// that met a stall, five of its hundred 80 ms. Each round's p99 says 1 ms
/// or 80 ms; the pool holds all two hundred, sorted, and its p99 is the
/// stalled requests' (the 199th of 200).
#[test]
fn a_servers_rounds_are_pooled_whole() {
    let dir = std::env::temp_dir().join(format!("latency-files-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let calm = vec![1_000u32; 100];
    let mut stalled = vec![1_000u32; 95];
    stalled.extend([80_000; 5]);
    stalled.reverse(); // the client sorts what it writes, but pooling does not rely on it
    let files = [dir.join("ours-0.u32"), dir.join("ours-1.u32")];
    std::fs::write(&files[0], to_bytes(&calm)).unwrap();
    std::fs::write(&files[1], to_bytes(&stalled)).unwrap();

    let all = pooled(&files).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();

    assert_eq!(all.len(), 200);
    assert!(all.windows(2).all(|w| w[0] <= w[1]), "sorted");
    assert_eq!(all.iter().filter(|&&l| l == 80_000).count(), 5);
    assert_eq!(quantile_ms(&calm, 0.99), 1.0);
    assert_eq!(quantile_ms(&all, 0.99), 80.0);
    assert_eq!(quantile_ms(&all, 0.97), 1.0);
}

/// A file that is not there, or cut short of a whole latency, is an
/// error, not an empty or shorter round.
#[test]
fn a_missing_or_cut_round_is_an_error() {
    let missing = std::env::temp_dir().join(format!("latency-files-none-{}", std::process::id()));
    assert!(pooled([&missing]).is_err());
    let cut = std::env::temp_dir().join(format!("latency-files-cut-{}", std::process::id()));
    let mut bytes = to_bytes(&[1_000, 2_000]);
    bytes.pop();
    std::fs::write(&cut, bytes).unwrap();
    let read = pooled([&cut]);
    std::fs::remove_file(&cut).unwrap();
    assert_eq!(read.unwrap_err().kind(), std::io::ErrorKind::InvalidData);
}
