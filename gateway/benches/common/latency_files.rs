//! The fixed-rate measure's latencies as the open-model client leaves them
//! in files, one a server and round, for the edge benchmark to pool each
//! server's rounds.

use std::path::Path;

/// The latency at quantile `q` of `sorted` (µs, ascending), in ms: the one
/// at 0-based index `floor(n·q)`, the last for `q` = 1; NaN for none. One
/// rank above nearest-rank's `ceil(n·q) - 1`: of 1,000, the p99 is the
/// 991st and the p99.9 the last. Every server's is read the same way (and
/// the open-model client's per round too), so the ratios are not moved.
pub fn quantile_ms(sorted: &[u32], q: f64) -> f64 {
    debug_assert!((0.0..=1.0).contains(&q), "a quantile is within 0 and 1");
    let at = ((sorted.len() as f64 * q) as usize).min(sorted.len().saturating_sub(1));
    sorted
        .get(at)
        .map_or(f64::NAN, |&us| f64::from(us) / 1000.0)
}

/// Latencies as the client writes them: each a little-endian `u32` of µs.
pub fn to_bytes(latencies: &[u32]) -> Vec<u8> {
    latencies.iter().flat_map(|l| l.to_le_bytes()).collect()
}

/// Every latency in `files`, sorted: a server's rounds pooled. A file cut
/// short of a whole latency is an error.
pub fn pooled<P: AsRef<Path>>(files: impl IntoIterator<Item = P>) -> std::io::Result<Vec<u32>> {
    let mut latencies = Vec::new();
    for file in files {
        let bytes = std::fs::read(&file)?;
        if bytes.len() % 4 != 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "{}: {} bytes, not whole latencies of 4",
                    file.as_ref().display(),
                    bytes.len()
                ),
            ));
        }
        latencies.extend(
            bytes
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        );
    }
    latencies.sort_unstable();
    Ok(latencies)
}
