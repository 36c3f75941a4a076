//! Proof of work on join, per event (`pow_bits` > 0): cheap for one fan,
//! expensive for a bot farm joining a million fan ids.
//!
//! `GET /v1/events/{id}/challenge` hands out a stateless challenge
//! `EVENT.EXPIRES.RANDOM.TAG` (TAG: HMAC of the rest under the gateway fleet's
//! secret, so any gateway can check it and none stores it). The fan finds a
//! `nonce` such that SHA-256(`challenge:fan_id:nonce`) starts with `pow_bits`
//! zero bits, and joins with `{"fan_id", "pow": {"challenge", "nonce"}}`.
//! Binding the fan id into the hash means one solution admits one fan id;
//! the expiry bounds precomputation.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use boxoffice_contract::token::KeySet;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// How long a challenge may be used.
pub const CHALLENGE_TTL_S: u64 = 120;
/// Highest difficulty an event may ask: about 16 million hashes on average.
pub const MAX_BITS: u8 = 24;

/// A solved challenge: `SHA-256(challenge + ":" + fan_id + ":" + nonce)` starts with the asked zero bits.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Solution {
    pub challenge: String,
    pub nonce: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PowError {
    #[error("the challenge is malformed or not ours")]
    BadChallenge,
    #[error("the challenge is for another event")]
    OtherEvent,
    #[error("the challenge has expired; fetch a new one")]
    Expired,
    #[error("the nonce does not meet the difficulty")]
    TooEasy,
}

/// A fresh challenge for `event_id`, valid until `now_s + CHALLENGE_TTL_S`.
pub fn challenge(keys: &KeySet, event_id: &str, now_s: u64) -> String {
    let random = URL_SAFE_NO_PAD.encode(rand::random::<[u8; 12]>());
    let body = format!("{event_id}.{}.{random}", now_s + CHALLENGE_TTL_S);
    let tag = URL_SAFE_NO_PAD.encode(&keys.challenge_tag(&body)[..16]);
    format!("{body}.{tag}")
}

/// Number of leading zero bits of `bytes`.
pub fn leading_zero_bits(bytes: &[u8]) -> u32 {
    let mut bits = 0;
    for byte in bytes {
        if *byte == 0 {
            bits += 8;
        } else {
            return bits + byte.leading_zeros();
        }
    }
    bits
}

fn work(challenge: &str, fan_id: &str, nonce: &str) -> u32 {
    leading_zero_bits(&Sha256::digest(format!("{challenge}:{fan_id}:{nonce}")))
}

/// Checks a fan's solution for `event_id` at difficulty `bits`.
pub fn check(
    keys: &KeySet,
    event_id: &str,
    fan_id: &str,
    solution: &Solution,
    bits: u8,
    now_s: u64,
) -> Result<(), PowError> {
    let (body, tag) = solution
        .challenge
        .rsplit_once('.')
        .ok_or(PowError::BadChallenge)?;
    let tag = URL_SAFE_NO_PAD
        .decode(tag)
        .map_err(|_| PowError::BadChallenge)?;
    if !keys.check_challenge_tag(body, &tag) {
        return Err(PowError::BadChallenge);
    }
    let mut parts = body.split('.');
    let (Some(event), Some(expires), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(PowError::BadChallenge);
    };
    if event != event_id {
        return Err(PowError::OtherEvent);
    }
    if expires.parse::<u64>().map_err(|_| PowError::BadChallenge)? < now_s {
        return Err(PowError::Expired);
    }
    if solution.nonce.len() > 64
        || work(&solution.challenge, fan_id, &solution.nonce) < u32::from(bits)
    {
        return Err(PowError::TooEasy);
    }
    Ok(())
}

/// Finds a nonce by brute force, as the fan page does (about 2^bits hashes).
pub fn solve(challenge: &str, fan_id: &str, bits: u8) -> String {
    (0u64..)
        .map(|n| n.to_string())
        .find(|nonce| work(challenge, fan_id, nonce) >= u32::from(bits))
        .expect("some nonce meets any difficulty up to 256 bits")
}

#[cfg(test)]
mod tests {
    use super::*;
    use boxoffice_contract::token::{generate_ed25519_pem, now_s};

    fn keys() -> KeySet {
        KeySet::from_pems(
            "boxoffice",
            &generate_ed25519_pem(),
            &[],
            b"0123456789abcdef0123456789abcdef",
        )
        .unwrap()
    }

    #[test]
    fn counts_leading_zero_bits() {
        assert_eq!(leading_zero_bits(&[0, 0x0f, 0xff]), 12);
        assert_eq!(leading_zero_bits(&[0x80]), 0);
        assert_eq!(leading_zero_bits(&[0, 0]), 16);
    }

    #[test]
    fn a_solved_challenge_admits_its_fan_only() {
        let keys = keys();
        let other_fleet = KeySet::from_pems(
            "boxoffice",
            &generate_ed25519_pem(),
            &[],
            b"another-fleet-secret-of-32-bytes!!",
        )
        .unwrap();
        let now = now_s();
        let challenge = challenge(&keys, "ev", now);
        let nonce = solve(&challenge, "fan-1", 16);
        let solution = Solution {
            challenge: challenge.clone(),
            nonce,
        };
        assert_eq!(check(&keys, "ev", "fan-1", &solution, 16, now), Ok(()));
        assert_eq!(
            check(&keys, "ev", "fan-2", &solution, 16, now),
            Err(PowError::TooEasy),
            "bound to the fan id"
        );
        assert_eq!(
            check(&keys, "other", "fan-1", &solution, 16, now),
            Err(PowError::OtherEvent)
        );
        assert_eq!(
            check(
                &keys,
                "ev",
                "fan-1",
                &solution,
                16,
                now + CHALLENGE_TTL_S + 1
            ),
            Err(PowError::Expired)
        );
        assert_eq!(
            check(&other_fleet, "ev", "fan-1", &solution, 16, now),
            Err(PowError::BadChallenge),
            "another fleet's secret"
        );
        let forged = Solution {
            challenge: challenge.replacen("ev.", "ev2.", 1),
            nonce: solution.nonce.clone(),
        };
        assert_eq!(
            check(&keys, "ev2", "fan-1", &forged, 16, now),
            Err(PowError::BadChallenge)
        );
    }
}
