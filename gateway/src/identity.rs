//! Account identity: the ticketing site's login issues each signed-in user
//! an identity token (a JWT, RS256, ES256 or EdDSA), and a join of an
//! `account` event carries it. The gateway checks it against the site's
//! JWKS (a file or an `https://` URL, read at start), its `iss` and `aud`,
//! and its expiry; its `sub` is the fan. Only asymmetric keys are taken from
//! the set (an `oct` key or an `HS*` token is refused), and a token's `alg`
//! must match its key's type, so a public key can never be used as an HMAC
//! secret; RSA keys under 2048 bits are skipped, and a token is refused
//! before its `nbf`.
//!
//! The site rotates its keys by publishing the new one in its JWKS before
//! signing with it: [`keep_fresh`] reads the JWKS again every
//! `BOXOFFICE_IDENTITY_JWKS_REFRESH_S`. A read that fails keeps the keys in
//! hand; until a first read succeeds, `account` joins answer 503
//! `identity-unavailable` (every other event is unaffected).

use std::sync::{Arc, RwLock};
use std::time::Duration;

use jsonwebtoken::jwk::{
    AlgorithmParameters, EllipticCurve, Jwk, JwkSet, KeyAlgorithm, PublicKeyUse,
};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::queue::valid_fan_id;

/// The verifying keys of the site's login, with the claims a token must carry.
pub struct IdentityProvider {
    keys: Vec<(Option<String>, Algorithm, DecodingKey)>,
    issuer: String,
    audience: String,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum IdentityError {
    #[error("identity token refused")]
    Refused,
}

#[derive(Deserialize)]
struct IdentityClaims {
    sub: String,
}

/// The smallest RSA modulus taken, in bits (as NIST SP 800-131A asks).
const MIN_RSA_BITS: usize = 2048;

/// The algorithm a key is for, if it is one we accept: a signing key (not
/// one marked for encryption) whose `alg`, if it names one, agrees.
fn algorithm_of(jwk: &Jwk) -> Option<Algorithm> {
    if jwk.common.public_key_use == Some(PublicKeyUse::Encryption) {
        return None;
    }
    let algorithm = key_algorithm(jwk)?;
    match jwk.common.key_algorithm {
        None => Some(algorithm),
        Some(named) => {
            let named = match named {
                KeyAlgorithm::RS256 => Algorithm::RS256,
                KeyAlgorithm::ES256 => Algorithm::ES256,
                KeyAlgorithm::EdDSA => Algorithm::EdDSA,
                _ => return None,
            };
            (named == algorithm).then_some(algorithm)
        }
    }
}

fn key_algorithm(jwk: &Jwk) -> Option<Algorithm> {
    match &jwk.algorithm {
        AlgorithmParameters::RSA(p) => {
            use base64::Engine as _;
            let modulus = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(p.n.trim_end_matches('='))
                .ok()?;
            let significant = modulus.iter().skip_while(|b| **b == 0).count();
            let bits = match modulus.iter().find(|b| **b != 0) {
                Some(first) => (significant - 1) * 8 + (8 - first.leading_zeros() as usize),
                None => 0,
            };
            (bits >= MIN_RSA_BITS).then_some(Algorithm::RS256)
        }
        AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => {
            Some(Algorithm::ES256)
        }
        AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => {
            Some(Algorithm::EdDSA)
        }
        _ => None,
    }
}

impl IdentityProvider {
    /// From a JWKS document; keys of other types are skipped, none left is an error.
    pub fn from_jwks(jwks: &str, issuer: &str, audience: &str) -> anyhow::Result<Self> {
        anyhow::ensure!(
            !issuer.is_empty() && !audience.is_empty(),
            "identity tokens need an issuer and an audience to check"
        );
        let set: JwkSet = serde_json::from_str(jwks)?;
        let keys: Vec<_> = set
            .keys
            .iter()
            .filter_map(|jwk| {
                let algorithm = algorithm_of(jwk)?;
                let key = DecodingKey::from_jwk(jwk).ok()?;
                Some((jwk.common.key_id.clone(), algorithm, key))
            })
            .collect();
        anyhow::ensure!(
            !keys.is_empty(),
            "the JWKS has no RSA (2048 bits or more), P-256 or Ed25519 key"
        );
        Ok(Self {
            keys,
            issuer: issuer.to_owned(),
            audience: audience.to_owned(),
        })
    }

    /// Reads the JWKS from a file or an `http(s)://` URL.
    pub async fn load(source: &str, issuer: &str, audience: &str) -> anyhow::Result<Self> {
        let jwks = if is_url(source) {
            // A JWKS fetched in clear could be swapped on the way.
            anyhow::ensure!(
                source.starts_with("https://"),
                "the identity JWKS must be fetched over https"
            );
            reqwest::Client::builder()
                .timeout(std::time::Duration::from_secs(10))
                .redirect(reqwest::redirect::Policy::none())
                .build()?
                .get(source)
                .send()
                .await?
                .error_for_status()?
                .text()
                .await?
        } else {
            tokio::fs::read_to_string(source).await?
        };
        Self::from_jwks(&jwks, issuer, audience)
    }

    /// The fan an identity token names: its `sub` when that is a valid fan
    /// id, else `acct-` and a digest of it.
    pub fn verify(&self, token: &str) -> Result<String, IdentityError> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| IdentityError::Refused)?;
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[&self.issuer]);
        validation.set_audience(&[&self.audience]);
        validation.set_required_spec_claims(&["exp", "sub", "iss", "aud"]);
        validation.leeway = 5;
        validation.validate_nbf = true;
        // The key its `kid` names; without a `kid` (during a rotation there
        // are two keys of its algorithm), whichever verifies it.
        let claims = self
            .keys
            .iter()
            .filter(|(kid, algorithm, _)| {
                *algorithm == header.alg
                    && (header.kid.is_none() || kid.as_deref() == header.kid.as_deref())
            })
            .find_map(|(_, _, key)| {
                jsonwebtoken::decode::<IdentityClaims>(token, key, &validation).ok()
            })
            .ok_or(IdentityError::Refused)?
            .claims;
        if claims.sub.is_empty() {
            return Err(IdentityError::Refused);
        }
        Ok(if valid_fan_id(&claims.sub) {
            claims.sub
        } else {
            let digest = Sha256::digest(claims.sub.as_bytes());
            format!("acct-{}", &hex(&digest)[..40])
        })
    }
}

/// The identity keys in hand, replaced whole when the JWKS is read again.
#[derive(Default)]
pub struct IdentityKeys(RwLock<Option<Arc<IdentityProvider>>>);

impl IdentityKeys {
    pub fn get(&self) -> Option<Arc<IdentityProvider>> {
        self.0
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    pub fn set(&self, provider: IdentityProvider) {
        *self
            .0
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(Arc::new(provider));
    }
}

/// Reads the JWKS at `source` again and again: every `every` (± 10 %, so
/// replicas spread out) once it has keys, and sooner (1 s, doubling up to
/// `every`) while it has none. A failed read keeps the keys in hand. Runs
/// until dropped.
pub async fn keep_fresh(
    keys: Arc<IdentityKeys>,
    source: String,
    issuer: String,
    audience: String,
    every: Duration,
) {
    let first_retry = Duration::from_secs(1).min(every);
    let mut retry = first_retry;
    loop {
        let wait = match IdentityProvider::load(&source, &issuer, &audience).await {
            Ok(provider) => {
                keys.set(provider);
                retry = first_retry;
                every
            }
            Err(error) => {
                let have_keys = keys.get().is_some();
                tracing::warn!(%source, error = %format!("{error:#}"), have_keys, "reading the identity JWKS failed");
                if have_keys {
                    every
                } else {
                    let wait = retry;
                    retry = (retry * 2).min(every);
                    wait
                }
            }
        };
        tokio::time::sleep(wait.mul_f64(rand::random::<f64>() * 0.2 + 0.9)).await;
    }
}

pub fn is_url(source: &str) -> bool {
    source.starts_with("https://") || source.starts_with("http://")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;

    fn rsa_key(modulus_bytes: usize, first: u8) -> serde_json::Value {
        let mut n = vec![0xc5_u8; modulus_bytes];
        n[0] = first;
        n[modulus_bytes - 1] = 0x01;
        let n = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(n);
        serde_json::json!({ "kty": "RSA", "kid": "r", "n": n, "e": "AQAB" })
    }

    fn rsa_jwks(modulus_bytes: usize) -> String {
        serde_json::json!({ "keys": [rsa_key(modulus_bytes, 0xc5)] }).to_string()
    }

    fn provider(keys: &[serde_json::Value]) -> anyhow::Result<IdentityProvider> {
        IdentityProvider::from_jwks(
            &serde_json::json!({ "keys": keys }).to_string(),
            "https://login",
            "boxoffice",
        )
    }

    #[test]
    fn a_modulus_is_measured_in_bits_not_bytes() {
        // 256 bytes whose first is 0x01: 2041 bits.
        assert!(provider(&[rsa_key(256, 0x01)]).is_err());
        assert!(provider(&[rsa_key(256, 0x80)]).is_ok());
        // A leading zero byte does not count.
        let mut padded = vec![0_u8];
        padded.extend(vec![0xc5_u8; 256]);
        let n = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(padded);
        assert!(provider(&[serde_json::json!({ "kty": "RSA", "n": n, "e": "AQAB" })]).is_ok());
    }

    #[test]
    fn keys_for_encryption_or_another_algorithm_are_not_taken() {
        let mut enc = rsa_key(256, 0xc5);
        enc["use"] = "enc".into();
        assert!(provider(&[enc]).is_err(), "an encryption key was taken");
        let mut other = rsa_key(256, 0xc5);
        other["alg"] = "RS512".into();
        assert!(
            provider(&[other]).is_err(),
            "an RS512 key was taken as RS256"
        );
        let mut named = rsa_key(256, 0xc5);
        named["alg"] = "RS256".into();
        named["use"] = "sig".into();
        assert!(provider(&[named]).is_ok());
    }

    #[tokio::test]
    async fn a_jwks_url_is_fetched_over_tls() {
        // Nothing listens there: the error must come from connecting, not
        // from a client built without TLS ("URL scheme is not allowed").
        let error = IdentityProvider::load(
            "https://127.0.0.1:9/jwks.json",
            "https://login",
            "boxoffice",
        )
        .await
        .err()
        .expect("nothing listens on port 9");
        let text = format!("{error:#}").to_lowercase();
        assert!(!text.contains("scheme"), "{text}");
        assert!(text.contains("connect"), "{text}");
    }

    #[test]
    fn rsa_keys_under_2048_bits_are_not_taken() {
        let weak = IdentityProvider::from_jwks(&rsa_jwks(128), "https://login", "boxoffice");
        assert!(
            weak.err().unwrap().to_string().contains("2048 bits"),
            "a 1024-bit key was taken"
        );
        let weak = IdentityProvider::from_jwks(&rsa_jwks(255), "https://login", "boxoffice");
        assert!(weak.is_err(), "a 2040-bit key was taken");
        let strong =
            IdentityProvider::from_jwks(&rsa_jwks(256), "https://login", "boxoffice").unwrap();
        assert_eq!(strong.keys.len(), 1);
        assert_eq!(strong.keys[0].1, Algorithm::RS256);
    }
}
