//! Small numbers as header values without an allocation. Every answer to
//! the crowd carries a `Content-Length` and most a `Retry-After`;
//! `HeaderValue::from(u64)` writes each into a buffer allocated for it (and
//! freed once the answer is sent), where a value from this table is a
//! static string, copied by pointer.

use std::sync::LazyLock;

use axum::http::HeaderValue;

/// How many numbers the table holds, from 0: a waiting fan's or a join's
/// whole answer is shorter, and a `Retry-After` is at most minutes.
const TABLE: usize = 1024;

static SMALL: LazyLock<Box<[HeaderValue]>> = LazyLock::new(|| {
    let mut digits = String::new();
    let mut ends = Vec::with_capacity(TABLE);
    for n in 0..TABLE {
        digits.push_str(itoa::Buffer::new().format(n));
        ends.push(digits.len());
    }
    // Once per process, for as long as it runs: the table's values point
    // into it.
    let digits: &'static str = Box::leak(digits.into_boxed_str());
    let mut start = 0;
    ends.into_iter()
        .map(|end| {
            let value = HeaderValue::from_static(&digits[start..end]);
            start = end;
            value
        })
        .collect()
});

/// `n` as a header value: the same bytes as `HeaderValue::from(n)`.
pub fn header_number(n: u64) -> HeaderValue {
    match usize::try_from(n).ok().and_then(|i| SMALL.get(i)) {
        Some(value) => value.clone(),
        None => HeaderValue::from(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_number_reads_as_from_writes_it() {
        for n in (0..TABLE as u64 + 10).chain([u64::from(u32::MAX), u64::MAX]) {
            let value = header_number(n);
            assert_eq!(value, HeaderValue::from(n), "{n}");
            assert_eq!(value.to_str().unwrap().parse::<u64>().unwrap(), n);
        }
    }
}
