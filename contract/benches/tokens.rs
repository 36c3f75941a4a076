//! Token sign and verify cost per operation, per kind.
//! `cargo bench -p boxoffice-contract --bench tokens`

use std::hint::black_box;
use std::time::Instant;

use boxoffice_contract::token::{generate_ed25519_pem, now_s, Claims, KeySet, TokenUse};

fn per_op(name: &str, iterations: u32, mut f: impl FnMut()) -> f64 {
    for _ in 0..iterations / 10 {
        f();
    }
    let start = Instant::now();
    for _ in 0..iterations {
        f();
    }
    let micros = start.elapsed().as_secs_f64() * 1e6 / f64::from(iterations);
    println!("{name:<36} {micros:>8.2} µs/op");
    micros
}

fn main() {
    let keys = KeySet::from_pems(
        "boxoffice",
        &generate_ed25519_pem(),
        &[],
        b"0123456789abcdef0123456789abcdef",
    )
    .unwrap();
    raw_ed25519();
    for kind in [TokenUse::Queue, TokenUse::Access] {
        let claims = Claims::new("boxoffice", "event-1", "fan-123456", kind, now_s(), 300);
        let token = keys.sign(&claims);
        per_op(&format!("sign {kind:?}"), 20_000, || {
            black_box(keys.sign(black_box(&claims)));
        });
        per_op(&format!("verify {kind:?}"), 20_000, || {
            black_box(
                keys.verify(black_box(&token), kind, Some("event-1"))
                    .unwrap(),
            );
        });
    }
}

/// The raw Ed25519 operations, to tell the signature's cost from the JWT library's.
#[allow(dead_code)]
fn raw_ed25519() {
    use ed25519_dalek::{Signer, Verifier};
    let key = ed25519_dalek::SigningKey::generate(&mut rand::rngs::OsRng);
    let message = [7u8; 300];
    let signature = key.sign(&message);
    let public = key.verifying_key();
    per_op("raw ed25519 sign (300 B)", 20_000, || {
        black_box(key.sign(black_box(&message)));
    });
    per_op("raw ed25519 verify (300 B)", 20_000, || {
        public.verify(black_box(&message), &signature).unwrap();
    });
}
