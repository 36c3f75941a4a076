//! The fixed-rate measure's latencies as the open-model client leaves them
//! in files, one a server and round, for the edge benchmark to pool each
//! server's rounds.

use std::path::Path;

/// The latency at quantile `q` of `sorted` (µs, ascending), in ms: the one
/// `q` of the way along, the last for `q` = 1; NaN for none.
pub fn quantile_ms(sorted: &[u32], q: f64) -> f64 {
    let at = ((sorted.len() as f64 * q) as usize).min(sorted.len().saturating_sub(1));
    sorted
        .get(at)
        .map_or(f64::NAN, |&us| f64::from(us) / 1000.0)
}

/// Latencies as the client writes them: each a little-endian `u32` of µs.
pub fn to_bytes(latencies: &[u32]) -> Vec<u8> {
    latencies.iter().flat_map(|l| l.to_le_bytes()).collect()
}

/// Every latency in `files`, sorted: a server's rounds pooled.
pub fn pooled<P: AsRef<Path>>(files: impl IntoIterator<Item = P>) -> std::io::Result<Vec<u32>> {
    let mut latencies = Vec::new();
    for file in files {
        let bytes = std::fs::read(file)?;
        latencies.extend(
            bytes
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        );
    }
    latencies.sort_unstable();
    Ok(latencies)
}
