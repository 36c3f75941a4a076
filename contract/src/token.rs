//! Tokens: who may wait, who may buy, who may read an order.
//!
//! Three kinds share one claim set and differ in `token_use`:
//! - `queue` tickets are read only by the gateway fleet on its hottest path
//!   (the status poll), so they are HS256 under a shared secret;
//! - `access` tokens open the shop for one fan and one event, and anyone can
//!   verify them with the JWKS, so they are EdDSA (Ed25519) with a `kid`;
//! - `order` tokens follow one order for days, EdDSA as well.
//!
//! The algorithm is pinned per kind (no `none`, no HS/EdDSA confusion) and the
//! leeway is explicit. Queue tickets are standard HS256 JWTs, but checked by
//! a short path of our own: the header must be byte-for-byte the one we issue,
//! the HMAC key schedule is done once, and the claims are parsed once, in
//! place, from a buffer on the stack; that makes the status poll's token
//! check about five times cheaper than the general decoder. Signing uses the
//! newest key; verification accepts any key in the verify set, which is how
//! keys rotate without downtime.

use std::collections::HashMap;
use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
// The codec of the hot paths (a queue ticket's tag and claims read at each
// status poll; every token written when signed, a queue ticket at each
// join): SIMD, and as strict as `base64`'s engine (a test holds it).
// `base64` decoded a ticket in about 2,200 instructions (callgrind,
// `scripts/edge_cost.sh`).
use base64_simd::{Out, URL_SAFE_NO_PAD as BASE64URL};
use ed25519_dalek::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePrivateKey};
use hmac::{Hmac, Mac};
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use uuid::Uuid;

/// Clock skew tolerated on `exp` and `nbf`, in seconds.
pub const LEEWAY_S: u64 = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenUse {
    Queue,
    Access,
    Order,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    pub iss: String,
    /// The event id: a token for one sale never opens another.
    pub aud: String,
    /// The fan id.
    pub sub: String,
    pub jti: String,
    pub iat: u64,
    pub nbf: u64,
    pub exp: u64,
    pub token_use: TokenUse,
    /// Only on order tokens: the one order they may read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order_id: Option<Uuid>,
}

impl Claims {
    /// Claims valid from `now` for `ttl_s` seconds with a fresh `jti`.
    pub fn new(
        issuer: &str,
        event_id: &str,
        fan_id: &str,
        token_use: TokenUse,
        now: u64,
        ttl_s: u64,
    ) -> Self {
        Self {
            iss: issuer.to_owned(),
            aud: event_id.to_owned(),
            sub: fan_id.to_owned(),
            // Written into a buffer, not through `fmt` (`to_string`).
            jti: Uuid::now_v7()
                .simple()
                .encode_lower(&mut Uuid::encode_buffer())
                .to_owned(),
            iat: now,
            nbf: now,
            exp: now + ttl_s,
            token_use,
            order_id: None,
        }
    }

    /// The claims' JSON, byte for byte as `serde_json` writes them, written
    /// by hand where no string needs an escape and there is no `order_id`
    /// (every queue ticket: a join signs one), else by `serde_json`.
    fn to_json(&self) -> Vec<u8> {
        let strings = [&self.iss, &self.aud, &self.sub, &self.jti];
        if self.order_id.is_some() || !strings.iter().all(|text| is_plain_json_string(text)) {
            return serde_json::to_vec(self).expect("serializing claims");
        }
        let mut json = Vec::with_capacity(128 + strings.iter().map(|s| s.len()).sum::<usize>());
        let mut number = itoa::Buffer::new();
        json.extend_from_slice(br#"{"iss":""#);
        json.extend_from_slice(self.iss.as_bytes());
        json.extend_from_slice(br#"","aud":""#);
        json.extend_from_slice(self.aud.as_bytes());
        json.extend_from_slice(br#"","sub":""#);
        json.extend_from_slice(self.sub.as_bytes());
        json.extend_from_slice(br#"","jti":""#);
        json.extend_from_slice(self.jti.as_bytes());
        json.extend_from_slice(br#"","iat":"#);
        json.extend_from_slice(number.format(self.iat).as_bytes());
        json.extend_from_slice(br#","nbf":"#);
        json.extend_from_slice(number.format(self.nbf).as_bytes());
        json.extend_from_slice(br#","exp":"#);
        json.extend_from_slice(number.format(self.exp).as_bytes());
        json.extend_from_slice(match self.token_use {
            TokenUse::Queue => br#","token_use":"queue"}"#.as_slice(),
            TokenUse::Access => br#","token_use":"access"}"#,
            TokenUse::Order => br#","token_use":"order"}"#,
        });
        json
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    #[error("token is malformed")]
    Malformed,
    #[error("token is signed with an unknown key")]
    UnknownKey,
    #[error("token signature or claims are invalid: {0}")]
    Invalid(String),
    #[error("token has expired")]
    Expired,
    #[error("token is not valid yet")]
    NotYetValid,
    #[error("token is for another event")]
    WrongAudience,
    #[error("token is a {found:?} token, expected {expected:?}")]
    WrongUse { expected: TokenUse, found: TokenUse },
}

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot read key {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("key {0} is not an Ed25519 PEM key (PKCS#8 private or SPKI public)")]
    NotEd25519(String),
    #[error("queue ticket secret must be at least 32 bytes")]
    WeakSecret,
}

/// One Ed25519 public key of the verify set.
#[derive(Clone)]
struct VerifyKey {
    decoding: DecodingKey,
    /// base64url of the 32-byte public key, the JWK `x`.
    x: String,
}

/// Signs and verifies every BoxOffice token. Cheap to clone.
#[derive(Clone)]
pub struct KeySet {
    inner: Arc<Inner>,
}

struct Inner {
    issuer: String,
    signing_kid: String,
    /// Parsed once: jsonwebtoken's signer re-derives the key on every call
    /// (half the cost of a signature), so access and order tokens are
    /// assembled here and signed with this key; they stay standard JWTs.
    signing: ed25519_dalek::SigningKey,
    /// base64url of `{"typ":"JWT","alg":"EdDSA","kid":…}`, made once.
    signing_header: String,
    verify: HashMap<String, VerifyKey>,
    /// Keyed once; cloned per ticket (cheaper than keying per ticket).
    queue_mac: Hmac<Sha256>,
}

/// base64url of `{"typ":"JWT","alg":"HS256"}`, the only queue-ticket header accepted.
const QUEUE_HEADER: &str = "eyJ0eXAiOiJKV1QiLCJhbGciOiJIUzI1NiJ9";

/// A queue ticket's claims read in place from the decoded payload: the
/// strings are borrowed unless JSON escapes in them had to be undone.
#[derive(Debug, PartialEq, Deserialize)]
struct QueueClaims<'a> {
    #[serde(borrow)]
    iss: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    aud: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    sub: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    jti: std::borrow::Cow<'a, str>,
    iat: u64,
    nbf: u64,
    exp: u64,
    token_use: TokenUse,
    #[serde(default)]
    order_id: Option<Uuid>,
}

impl<'a> QueueClaims<'a> {
    /// Claims as [`KeySet::sign`] writes a queue ticket's, read by a short
    /// path: the fields in [`Claims`]' order, no `order_id`, no space, no
    /// escape, no number but plain digits. `None` for anything else, which
    /// `serde_json` then reads (or refuses). Where this reads claims, they
    /// are what `serde_json` reads from the same text (tests hold it).
    fn read_as_signed(json: &'a str) -> Option<Self> {
        let mut rest = json.strip_prefix(r#"{"iss":"#)?;
        let iss = take_str(&mut rest)?;
        rest = rest.strip_prefix(r#","aud":"#)?;
        let aud = take_str(&mut rest)?;
        rest = rest.strip_prefix(r#","sub":"#)?;
        let sub = take_str(&mut rest)?;
        rest = rest.strip_prefix(r#","jti":"#)?;
        let jti = take_str(&mut rest)?;
        rest = rest.strip_prefix(r#","iat":"#)?;
        let iat = take_u64(&mut rest)?;
        rest = rest.strip_prefix(r#","nbf":"#)?;
        let nbf = take_u64(&mut rest)?;
        rest = rest.strip_prefix(r#","exp":"#)?;
        let exp = take_u64(&mut rest)?;
        rest = rest.strip_prefix(r#","token_use":"#)?;
        let token_use = match take_str(&mut rest)? {
            "queue" => TokenUse::Queue,
            "access" => TokenUse::Access,
            "order" => TokenUse::Order,
            _ => return None,
        };
        (rest == "}").then_some(Self {
            iss: iss.into(),
            aud: aud.into(),
            sub: sub.into(),
            jti: jti.into(),
            iat,
            nbf,
            exp,
            token_use,
            order_id: None,
        })
    }
}

/// Whether `serde_json` escapes `byte` in a string: a quote, a backslash or
/// a control character.
fn json_escapes(byte: u8) -> bool {
    byte < 0x20 || byte == b'"' || byte == b'\\'
}

/// Whether `serde_json` writes `text` between the quotes as it is, no byte
/// escaped. Looks at every byte, a pass that vectorises.
pub fn is_plain_json_string(text: &str) -> bool {
    text.bytes()
        .fold(true, |plain, byte| plain & !json_escapes(byte))
}

/// A JSON string with nothing to undo (no escape) at the start of `rest`,
/// taken off it.
fn take_str<'a>(rest: &mut &'a str) -> Option<&'a str> {
    let text = rest.strip_prefix('"')?;
    let end = text.bytes().position(json_escapes)?;
    if text.as_bytes()[end] != b'"' {
        return None;
    }
    *rest = &text[end + 1..];
    Some(&text[..end])
}

/// A JSON number of plain digits that fits a `u64` (no sign, fraction,
/// exponent or leading zero) at the start of `rest`, taken off it.
fn take_u64(rest: &mut &str) -> Option<u64> {
    let mut number = 0u64;
    let mut digits = 0;
    for byte in rest.bytes().take_while(u8::is_ascii_digit) {
        number = number
            .checked_mul(10)?
            .checked_add(u64::from(byte - b'0'))?;
        digits += 1;
    }
    if digits == 0 || (digits > 1 && rest.starts_with('0')) {
        return None;
    }
    *rest = &rest[digits..];
    Some(number)
}

/// The JWK `kid` of an Ed25519 public key: a short hash, stable across restarts.
pub fn kid_of(public_key: &[u8; 32]) -> String {
    let digest = Sha256::digest(public_key);
    URL_SAFE_NO_PAD.encode(&digest[..12])
}

impl KeySet {
    /// `signing_pem` is the PKCS#8 private key that signs; `verify_pems` are
    /// further public (or private) keys still accepted, e.g. the previous key
    /// during a rotation. `queue_secret` signs queue tickets.
    pub fn from_pems(
        issuer: &str,
        signing_pem: &str,
        verify_pems: &[String],
        queue_secret: &[u8],
    ) -> Result<Self, KeyError> {
        if queue_secret.len() < 32 {
            return Err(KeyError::WeakSecret);
        }
        let signing_key = ed25519_dalek::SigningKey::from_pkcs8_pem(signing_pem)
            .map_err(|_| KeyError::NotEd25519("signing key".into()))?;
        let public = signing_key.verifying_key().to_bytes();
        let signing_kid = kid_of(&public);
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(signing_kid.clone());
        let signing_header =
            URL_SAFE_NO_PAD.encode(serde_json::to_vec(&header).expect("plain header"));

        let mut verify = HashMap::new();
        let mut add = |public: [u8; 32]| -> Result<(), KeyError> {
            let x = URL_SAFE_NO_PAD.encode(public);
            let decoding = DecodingKey::from_ed_components(&x)
                .map_err(|_| KeyError::NotEd25519("verify key".into()))?;
            verify.insert(kid_of(&public), VerifyKey { decoding, x });
            Ok(())
        };
        add(public)?;
        for (i, pem) in verify_pems.iter().enumerate() {
            let public = match ed25519_dalek::VerifyingKey::from_public_key_pem(pem) {
                Ok(key) => key.to_bytes(),
                Err(_) => ed25519_dalek::SigningKey::from_pkcs8_pem(pem)
                    .map_err(|_| KeyError::NotEd25519(format!("verify key #{}", i + 1)))?
                    .verifying_key()
                    .to_bytes(),
            };
            add(public)?;
        }
        Ok(Self {
            inner: Arc::new(Inner {
                issuer: issuer.to_owned(),
                signing_kid,
                signing: signing_key,
                signing_header,
                verify,
                queue_mac: Hmac::new_from_slice(queue_secret).map_err(|_| KeyError::WeakSecret)?,
            }),
        })
    }

    /// Reads the PEM files named by `BOXOFFICE_SIGNING_KEY` / `BOXOFFICE_VERIFY_KEYS`.
    pub fn from_files(
        issuer: &str,
        signing_path: &str,
        verify_paths: &[String],
        queue_secret: &[u8],
    ) -> Result<Self, KeyError> {
        let read = |path: &str| {
            std::fs::read_to_string(path).map_err(|source| KeyError::Read {
                path: path.to_owned(),
                source,
            })
        };
        let signing = read(signing_path)?;
        let verify = verify_paths
            .iter()
            .map(|p| read(p))
            .collect::<Result<Vec<_>, _>>()?;
        Self::from_pems(issuer, &signing, &verify, queue_secret)
    }

    pub fn issuer(&self) -> &str {
        &self.inner.issuer
    }

    pub fn signing_kid(&self) -> &str {
        &self.inner.signing_kid
    }

    /// Signs `claims` with the algorithm its `token_use` pins.
    pub fn sign(&self, claims: &Claims) -> String {
        match claims.token_use {
            TokenUse::Queue => self.sign_queue(claims),
            TokenUse::Access | TokenUse::Order => {
                use ed25519_dalek::Signer;
                let payload = claims.to_json();
                let mut token = Vec::with_capacity(
                    self.inner.signing_header.len() + payload.len() * 4 / 3 + 90,
                );
                token.extend_from_slice(self.inner.signing_header.as_bytes());
                token.push(b'.');
                BASE64URL.encode_append(&payload, &mut token);
                let signature = self.inner.signing.sign(&token);
                token.push(b'.');
                BASE64URL.encode_append(signature.to_bytes(), &mut token);
                String::from_utf8(token).expect("a header and base64: ASCII")
            }
        }
    }

    fn sign_queue(&self, claims: &Claims) -> String {
        let payload = claims.to_json();
        let mut token = Vec::with_capacity(QUEUE_HEADER.len() + payload.len() * 4 / 3 + 48);
        token.extend_from_slice(QUEUE_HEADER.as_bytes());
        token.push(b'.');
        BASE64URL.encode_append(&payload, &mut token);
        let mut mac = self.inner.queue_mac.clone();
        mac.update(&token);
        token.push(b'.');
        BASE64URL.encode_append(mac.finalize().into_bytes(), &mut token);
        String::from_utf8(token).expect("a header and base64: ASCII")
    }

    fn verify_queue(&self, token: &str, event_id: Option<&str>) -> Result<Claims, TokenError> {
        self.read_queue_ticket(token, event_id, |claims| Claims {
            iss: claims.iss.into_owned(),
            aud: claims.aud.into_owned(),
            sub: claims.sub.into_owned(),
            jti: claims.jti.into_owned(),
            iat: claims.iat,
            nbf: claims.nbf,
            exp: claims.exp,
            token_use: claims.token_use,
            order_id: claims.order_id,
        })
    }

    /// The fan a queue ticket for `event_id` names, checked as
    /// [`Self::verify`] checks it: the status poll's and a repeat join's
    /// one need. Copies nothing but the fan id: the signature and claims are
    /// decoded on the stack and read in place, where `verify` hands back
    /// owned claims (four strings).
    pub fn queue_ticket_fan(&self, token: &str, event_id: &str) -> Result<String, TokenError> {
        self.read_queue_ticket(token, Some(event_id), |claims| claims.sub.into_owned())
    }

    /// Checks a queue ticket and hands its claims, read in place, to `take`.
    fn read_queue_ticket<T>(
        &self,
        token: &str,
        event_id: Option<&str>,
        take: impl FnOnce(QueueClaims<'_>) -> T,
    ) -> Result<T, TokenError> {
        let (signed, signature) = token.rsplit_once('.').ok_or(TokenError::Malformed)?;
        let (header, payload) = signed.split_once('.').ok_or(TokenError::Malformed)?;
        if header != QUEUE_HEADER {
            return Err(TokenError::Invalid(
                "only HS256 queue tickets of this issuer are accepted".into(),
            ));
        }
        let bad_signature = || TokenError::Invalid("bad signature".into());
        // An HS256 tag is 32 bytes, 43 characters: anything longer is not one.
        if signature.len() > 43 {
            return Err(bad_signature());
        }
        let mut tag = [0u8; 33];
        let tag = BASE64URL
            .decode(signature.as_bytes(), Out::from_slice(&mut tag))
            .map_err(|_| TokenError::Malformed)?;
        let mut mac = self.inner.queue_mac.clone();
        mac.update(signed.as_bytes());
        // Constant-time comparison.
        mac.verify_slice(tag).map_err(|_| bad_signature())?;
        // The claims of every ticket we sign fit the stack buffer; a longer
        // (still signed) payload is decoded on the heap.
        let mut stack = [0u8; 512];
        let heap;
        let json = if BASE64URL.estimated_decoded_length(payload.len()) <= stack.len() {
            &*BASE64URL
                .decode(payload.as_bytes(), Out::from_slice(&mut stack))
                .map_err(|_| TokenError::Malformed)?
        } else {
            heap = BASE64URL
                .decode_to_vec(payload)
                .map_err(|_| TokenError::Malformed)?;
            &heap[..]
        };
        // Checked as UTF-8 once, whole, rather than string by string as
        // `from_slice` does.
        let json = std::str::from_utf8(json).map_err(|_| TokenError::Malformed)?;
        // Claims as we sign them by the short path; any other JSON by serde.
        let claims = match QueueClaims::read_as_signed(json) {
            Some(claims) => claims,
            None => serde_json::from_str(json).map_err(|_| TokenError::Malformed)?,
        };
        self.check_claims(&claims, TokenUse::Queue, event_id)?;
        Ok(take(claims))
    }

    /// The claim checks of [`Self::verify_queue`], as `jsonwebtoken` does them for the others.
    fn check_claims(
        &self,
        claims: &QueueClaims<'_>,
        expected: TokenUse,
        event_id: Option<&str>,
    ) -> Result<(), TokenError> {
        let now = now_s();
        if claims.iss != self.inner.issuer {
            return Err(TokenError::Invalid("InvalidIssuer".into()));
        }
        if claims.exp + LEEWAY_S < now {
            return Err(TokenError::Expired);
        }
        if claims.nbf > now + LEEWAY_S {
            return Err(TokenError::NotYetValid);
        }
        if event_id.is_some_and(|event| claims.aud != event) {
            return Err(TokenError::WrongAudience);
        }
        if claims.token_use != expected {
            return Err(TokenError::WrongUse {
                expected,
                found: claims.token_use,
            });
        }
        Ok(())
    }

    /// Verifies a token of kind `expected` for `event_id` and returns its claims.
    pub fn verify(
        &self,
        token: &str,
        expected: TokenUse,
        event_id: Option<&str>,
    ) -> Result<Claims, TokenError> {
        if expected == TokenUse::Queue {
            return self.verify_queue(token, event_id);
        }
        let header = jsonwebtoken::decode_header(token).map_err(|_| TokenError::Malformed)?;
        let kid = header.kid.as_deref().ok_or(TokenError::UnknownKey)?;
        let key = &self
            .inner
            .verify
            .get(kid)
            .ok_or(TokenError::UnknownKey)?
            .decoding;
        let algorithm = Algorithm::EdDSA;
        if header.alg != algorithm {
            return Err(TokenError::Invalid(format!(
                "algorithm {:?} not accepted",
                header.alg
            )));
        }
        let mut validation = Validation::new(algorithm);
        validation.leeway = LEEWAY_S;
        validation.validate_nbf = true;
        validation.set_issuer(&[self.inner.issuer.as_str()]);
        validation.set_required_spec_claims(&["exp", "nbf", "iat", "aud", "iss", "sub", "jti"]);
        match event_id {
            Some(event) => validation.set_audience(&[event]),
            None => validation.validate_aud = false,
        }
        let data = jsonwebtoken::decode::<Claims>(token, key, &validation).map_err(|error| {
            use jsonwebtoken::errors::ErrorKind;
            match error.kind() {
                ErrorKind::ExpiredSignature => TokenError::Expired,
                ErrorKind::ImmatureSignature => TokenError::NotYetValid,
                ErrorKind::InvalidAudience => TokenError::WrongAudience,
                ErrorKind::InvalidToken
                | ErrorKind::Base64(_)
                | ErrorKind::Json(_)
                | ErrorKind::Utf8(_) => TokenError::Malformed,
                other => TokenError::Invalid(format!("{other:?}")),
            }
        })?;
        if data.claims.token_use != expected {
            return Err(TokenError::WrongUse {
                expected,
                found: data.claims.token_use,
            });
        }
        Ok(data.claims)
    }

    /// HMAC-SHA256 under the gateway fleet's secret of `pow|data`, for
    /// stateless proof-of-work challenges (the prefix keeps these tags apart
    /// from queue-ticket signatures).
    pub fn challenge_tag(&self, data: &str) -> [u8; 32] {
        let mut mac = self.inner.queue_mac.clone();
        mac.update(b"pow|");
        mac.update(data.as_bytes());
        mac.finalize().into_bytes().into()
    }

    /// Whether `tag` is the first bytes of [`Self::challenge_tag`] of `data` (constant time).
    pub fn check_challenge_tag(&self, data: &str, tag: &[u8]) -> bool {
        let mut mac = self.inner.queue_mac.clone();
        mac.update(b"pow|");
        mac.update(data.as_bytes());
        tag.len() >= 16 && mac.verify_truncated_left(tag).is_ok()
    }

    /// The public half of the verify set as a JWK Set document, sorted by `kid`.
    pub fn jwks(&self) -> JwkSet {
        use jsonwebtoken::jwk::{
            AlgorithmParameters, CommonParameters, EllipticCurve, Jwk, KeyAlgorithm,
            OctetKeyPairParameters, OctetKeyPairType, PublicKeyUse,
        };
        let mut keys: Vec<Jwk> = self
            .inner
            .verify
            .iter()
            .map(|(kid, key)| Jwk {
                common: CommonParameters {
                    public_key_use: Some(PublicKeyUse::Signature),
                    key_algorithm: Some(KeyAlgorithm::EdDSA),
                    key_id: Some(kid.clone()),
                    ..Default::default()
                },
                algorithm: AlgorithmParameters::OctetKeyPair(OctetKeyPairParameters {
                    key_type: OctetKeyPairType::OctetKeyPair,
                    curve: EllipticCurve::Ed25519,
                    x: key.x.clone(),
                }),
            })
            .collect();
        keys.sort_by(|a, b| a.common.key_id.cmp(&b.common.key_id));
        JwkSet { keys }
    }
}

/// The `jti` of the access token of one admission (event, fan, expiry in ms):
/// every status poll during that admission gets the same one, so the fan can
/// buy once, not once per poll, and ops can revoke exactly that admission.
pub fn admission_jti(event_id: &str, fan_id: &str, expires_ms: i64) -> String {
    let digest = Sha256::digest(format!("{event_id}\n{fan_id}\n{expires_ms}"));
    URL_SAFE_NO_PAD.encode(&digest[..16])
}

/// The `jti` of the fan's current admission, whose expiry (the active set's
/// score) is `expires_ms`: the one [`admission_jti`] made from its first
/// expiry, kept across renewals. `held_over` is the fan's `held-over` key
/// (`JTI|EXPIRY`, written when a `seats-held` answer renewed the admission);
/// it names this admission only while its expiry is the current one, so a
/// stale one (of an earlier admission) is ignored.
pub fn admission_jti_of(
    event_id: &str,
    fan_id: &str,
    expires_ms: i64,
    held_over: Option<&str>,
) -> String {
    held_over
        .and_then(|value| value.rsplit_once('|'))
        .filter(|(_, until)| *until == expires_ms.to_string())
        .map(|(jti, _)| jti.to_owned())
        .unwrap_or_else(|| admission_jti(event_id, fan_id, expires_ms))
}

/// A fresh Ed25519 private key as PKCS#8 PEM, for dev scripts and tests.
pub fn generate_ed25519_pem() -> String {
    use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
    let key = ed25519_dalek::SigningKey::generate(&mut rand::rngs::OsRng);
    key.to_pkcs8_pem(LineEnding::LF)
        .expect("encoding a fresh key")
        .to_string()
}

/// Seconds since the Unix epoch.
pub fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::EncodingKey;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn keys() -> KeySet {
        KeySet::from_pems("boxoffice", &generate_ed25519_pem(), &[], SECRET).unwrap()
    }

    #[test]
    fn access_token_round_trips_and_names_its_kid() {
        let keys = keys();
        let claims = Claims::new("boxoffice", "ev1", "fan1", TokenUse::Access, now_s(), 60);
        let token = keys.sign(&claims);
        let header = jsonwebtoken::decode_header(&token).unwrap();
        assert_eq!(header.alg, Algorithm::EdDSA);
        assert_eq!(header.kid.as_deref(), Some(keys.signing_kid()));
        assert_eq!(
            keys.verify(&token, TokenUse::Access, Some("ev1")).unwrap(),
            claims
        );
    }

    #[test]
    fn a_queue_ticket_never_passes_as_an_access_token() {
        let keys = keys();
        let ticket = keys.sign(&Claims::new(
            "boxoffice",
            "ev1",
            "f",
            TokenUse::Queue,
            now_s(),
            60,
        ));
        assert!(keys.verify(&ticket, TokenUse::Queue, Some("ev1")).is_ok());
        assert!(keys.verify(&ticket, TokenUse::Access, Some("ev1")).is_err());
        let order = keys.sign(&Claims::new(
            "boxoffice",
            "ev1",
            "f",
            TokenUse::Order,
            now_s(),
            60,
        ));
        assert_eq!(
            keys.verify(&order, TokenUse::Access, Some("ev1")),
            Err(TokenError::WrongUse {
                expected: TokenUse::Access,
                found: TokenUse::Order
            })
        );
    }

    #[test]
    fn wrong_event_expired_and_foreign_keys_are_rejected() {
        let keys = keys();
        let token = keys.sign(&Claims::new(
            "boxoffice",
            "ev1",
            "f",
            TokenUse::Access,
            now_s(),
            60,
        ));
        assert_eq!(
            keys.verify(&token, TokenUse::Access, Some("ev2")),
            Err(TokenError::WrongAudience)
        );
        let old = keys.sign(&Claims::new(
            "boxoffice",
            "ev1",
            "f",
            TokenUse::Access,
            now_s() - 600,
            60,
        ));
        assert_eq!(
            keys.verify(&old, TokenUse::Access, Some("ev1")),
            Err(TokenError::Expired)
        );
        let other = self::keys();
        assert_eq!(
            other.verify(&token, TokenUse::Access, Some("ev1")),
            Err(TokenError::UnknownKey)
        );
        assert_eq!(
            keys.verify("garbage", TokenUse::Access, None),
            Err(TokenError::Malformed)
        );
    }

    #[test]
    fn a_previous_key_in_the_verify_set_still_verifies() {
        let old_pem = generate_ed25519_pem();
        let old = KeySet::from_pems("boxoffice", &old_pem, &[], SECRET).unwrap();
        let token = old.sign(&Claims::new(
            "boxoffice",
            "ev1",
            "f",
            TokenUse::Access,
            now_s(),
            60,
        ));
        let rotated =
            KeySet::from_pems("boxoffice", &generate_ed25519_pem(), &[old_pem], SECRET).unwrap();
        assert!(rotated
            .verify(&token, TokenUse::Access, Some("ev1"))
            .is_ok());
        assert_eq!(rotated.jwks().keys.len(), 2);
    }

    #[test]
    fn queue_tickets_are_standard_hs256_jwts() {
        let keys = keys();
        let claims = Claims::new("boxoffice", "ev1", "f", TokenUse::Queue, now_s(), 60);
        let ticket = keys.sign(&claims);
        // Readable by any JWT library holding the secret.
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_audience(&["ev1"]);
        let decoded =
            jsonwebtoken::decode::<Claims>(&ticket, &DecodingKey::from_secret(SECRET), &validation)
                .unwrap();
        assert_eq!(decoded.claims, claims);
        // And one made by such a library passes our short path.
        let made = jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(SECRET),
        )
        .unwrap();
        assert_eq!(
            keys.verify(&made, TokenUse::Queue, Some("ev1")).unwrap(),
            claims
        );
    }

    #[test]
    fn forged_or_tampered_queue_tickets_are_rejected() {
        let keys = keys();
        let claims = Claims::new("boxoffice", "ev1", "f", TokenUse::Queue, now_s(), 60);
        let ticket = keys.sign(&claims);
        let (signed, _) = ticket.rsplit_once('.').unwrap();
        let (_, payload) = signed.split_once('.').unwrap();
        // alg none, another HMAC, another secret, a swapped payload.
        let none = format!(
            "{}.{payload}.",
            URL_SAFE_NO_PAD.encode(br#"{"typ":"JWT","alg":"none"}"#)
        );
        let hs384 = jsonwebtoken::encode(
            &Header::new(Algorithm::HS384),
            &claims,
            &EncodingKey::from_secret(SECRET),
        )
        .unwrap();
        let other_secret = jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(b"another-secret-of-thirty-two-bytes!!"),
        )
        .unwrap();
        let mut richer = claims.clone();
        richer.sub = "someone-else".into();
        let swapped = format!(
            "{QUEUE_HEADER}.{}.{}",
            URL_SAFE_NO_PAD.encode(serde_json::to_vec(&richer).unwrap()),
            ticket.rsplit_once('.').unwrap().1
        );
        for forged in [
            none,
            hs384,
            other_secret,
            swapped,
            format!("{ticket}x"),
            "a.b".into(),
            String::new(),
        ] {
            assert!(
                keys.verify(&forged, TokenUse::Queue, Some("ev1")).is_err(),
                "{forged}"
            );
            assert!(keys.queue_ticket_fan(&forged, "ev1").is_err(), "{forged}");
        }
        let mut late = claims.clone();
        late.nbf = now_s() + 600;
        assert_eq!(
            keys.verify(&keys.sign(&late), TokenUse::Queue, Some("ev1")),
            Err(TokenError::NotYetValid)
        );
        assert_eq!(
            keys.queue_ticket_fan(&keys.sign(&late), "ev1"),
            Err(TokenError::NotYetValid)
        );
        let mut foreign = claims;
        foreign.iss = "someone".into();
        assert!(keys
            .verify(&keys.sign(&foreign), TokenUse::Queue, Some("ev1"))
            .is_err());
        assert!(keys.queue_ticket_fan(&keys.sign(&foreign), "ev1").is_err());
    }

    #[test]
    fn a_queue_tickets_fan_is_read_through_escapes_and_at_any_length() {
        let keys = keys();
        let long = "f".repeat(2_000);
        for fan in [
            "plain",
            "quote\"back\\slash",
            "line\nfeed\u{1}",
            "é😀",
            long.as_str(),
        ] {
            let ticket = keys.sign(&Claims::new(
                "boxoffice",
                "ev1",
                fan,
                TokenUse::Queue,
                now_s(),
                60,
            ));
            assert_eq!(keys.queue_ticket_fan(&ticket, "ev1").as_deref(), Ok(fan));
            assert_eq!(
                keys.queue_ticket_fan(&ticket, "ev2"),
                Err(TokenError::WrongAudience)
            );
        }
        let mut expired = Claims::new("boxoffice", "ev1", "f", TokenUse::Queue, now_s() - 600, 60);
        expired.exp = now_s() - LEEWAY_S - 1;
        assert_eq!(
            keys.queue_ticket_fan(&keys.sign(&expired), "ev1"),
            Err(TokenError::Expired)
        );
        let access = keys.sign(&Claims::new(
            "boxoffice",
            "ev1",
            "f",
            TokenUse::Access,
            now_s(),
            60,
        ));
        assert!(keys.queue_ticket_fan(&access, "ev1").is_err());
    }

    /// Claims signed with the queue secret but not UTF-8 (or not JSON) are
    /// refused as malformed.
    #[test]
    fn signed_claims_that_are_not_utf8_json_are_malformed() {
        let keys = keys();
        for payload in [&b"{\"iss\":\"\xff\"}"[..], b"\xc3", b"not json"] {
            let signed = format!("{QUEUE_HEADER}.{}", URL_SAFE_NO_PAD.encode(payload));
            let mut mac = Hmac::<Sha256>::new_from_slice(SECRET).unwrap();
            mac.update(signed.as_bytes());
            let ticket = format!(
                "{signed}.{}",
                URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
            );
            assert_eq!(
                keys.queue_ticket_fan(&ticket, "ev1"),
                Err(TokenError::Malformed)
            );
        }
    }

    /// The claims of a queue ticket as `sign` writes them.
    fn signed_claims_json(claims: &Claims) -> String {
        let ticket = keys().sign(claims);
        let payload = ticket.split('.').nth(1).unwrap();
        String::from_utf8(URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap()
    }

    #[test]
    fn claims_as_signed_are_read_by_the_short_path_as_serde_reads_them() {
        let mut claims = Claims::new("boxoffice", "ev1", "fan-1", TokenUse::Queue, now_s(), 600);
        claims.iat = 0;
        let json = signed_claims_json(&claims);
        let short = QueueClaims::read_as_signed(&json).expect("read by the short path");
        assert_eq!(short, serde_json::from_str::<QueueClaims>(&json).unwrap());
        assert_eq!((short.sub.as_ref(), short.iat), ("fan-1", 0));
        // Anything else is left to serde.
        for other in [
            json.replace(r#""iss":"#, r#""iss" :"#),
            json.replace("}", r#","order_id":null}"#),
            json.replace(r#""iat":0"#, r#""iat":00"#),
            json.replace(r#""iat":0"#, r#""iat":0.0"#),
            json.replace("fan-1", r#"fan\u002d1"#),
            json.replace(r#""queue""#, r#""Queue""#),
            format!("{json} "),
        ] {
            assert_eq!(QueueClaims::read_as_signed(&other), None, "{other}");
        }
    }

    /// Claims with an order id, or a string to escape, are written by
    /// `serde_json` itself.
    #[test]
    fn claims_the_short_writer_leaves_are_written_by_serde() {
        let mut order = Claims::new("boxoffice", "ev1", "fan-1", TokenUse::Order, now_s(), 600);
        order.order_id = Some(Uuid::now_v7());
        let escaped = Claims::new("box\"office", "ev\\1", "fan\n1", TokenUse::Access, 0, 0);
        for claims in [order, escaped] {
            assert_eq!(claims.to_json(), serde_json::to_vec(&claims).unwrap());
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]

        /// Claims with any strings and numbers are written as `serde_json`
        /// writes them; where the short path reads them back, serde reads
        /// the same; it reads every one with nothing to escape.
        #[test]
        fn the_short_path_reads_signed_claims_as_serde_does(
            iss in ".{0,12}", aud in ".{0,12}", sub in "\\PC{0,40}", jti in ".{0,12}",
            iat: u64, nbf: u64, exp: u64, token_use in 0usize..3,
        ) {
            let token_use = [TokenUse::Queue, TokenUse::Access, TokenUse::Order][token_use];
            let claims = Claims { iss, aud, sub, jti, iat, nbf, exp, token_use, order_id: None };
            let json = serde_json::to_string(&claims).unwrap();
            proptest::prop_assert_eq!(String::from_utf8(claims.to_json()).unwrap(), json.clone());
            let serde: QueueClaims = serde_json::from_str(&json).unwrap();
            match QueueClaims::read_as_signed(&json) {
                Some(short) => proptest::prop_assert_eq!(short, serde),
                None => proptest::prop_assert!(
                    json.contains('\\'),
                    "not read by the short path: {}", json
                ),
            }
        }

        /// The SIMD codec the tickets use takes and refuses the same text
        /// as `base64`'s URL-safe engine without padding, and encodes
        /// alike: no padding, no character outside the alphabet, no length
        /// of 1 mod 4, no set bit past the last byte (so a ticket has one
        /// spelling). The text is mostly the alphabet, near the lengths of a
        /// tag and of claims, with a few strays.
        #[test]
        fn the_simd_codec_agrees_with_base64(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
            text in "[A-Za-z0-9_-]{0,90}[A-Za-z0-9_=+/. -]{0,2}[A-Za-z0-9_-]{0,90}",
        ) {
            let encoded = URL_SAFE_NO_PAD.encode(&bytes);
            proptest::prop_assert_eq!(BASE64URL.encode_to_string(&bytes), encoded.clone());
            for text in [encoded.as_str(), &text] {
                proptest::prop_assert_eq!(
                    BASE64URL.decode_to_vec(text).ok(),
                    URL_SAFE_NO_PAD.decode(text).ok(),
                    "{}", text
                );
            }
        }

        /// Whatever text the short path reads, serde reads the same from it.
        #[test]
        fn what_the_short_path_reads_serde_reads_alike(
            at in proptest::prelude::any::<proptest::sample::Index>(),
            cut in 0usize..3,
            insert in "[\"\\\\0-9a-z:,{} .eE+-]{0,3}",
        ) {
            let claims = Claims::new("boxoffice", "ev1", "fan-1", TokenUse::Queue, 1_700_000_000, 600);
            let json = serde_json::to_string(&claims).unwrap();
            let at = at.index(json.len());
            let end = (at + cut).min(json.len());
            let changed = format!("{}{insert}{}", &json[..at], &json[end..]);
            if let Some(short) = QueueClaims::read_as_signed(&changed) {
                proptest::prop_assert_eq!(Ok(short), serde_json::from_str::<QueueClaims>(&changed).map_err(|_| ()));
            }
        }
    }

    #[test]
    fn the_jwks_is_the_rfc_8037_shape_of_each_verify_key() {
        let keys = KeySet::from_pems("boxoffice", &generate_ed25519_pem(), &[], SECRET).unwrap();
        let jwks = serde_json::to_value(keys.jwks()).unwrap();
        let x = jwks["keys"][0]["x"].as_str().unwrap();
        assert_eq!(x.len(), 43, "32 bytes, base64url without padding");
        assert_eq!(
            jwks,
            serde_json::json!({ "keys": [{
                "kty": "OKP", "crv": "Ed25519", "alg": "EdDSA", "use": "sig",
                "kid": keys.signing_kid(), "x": x,
            }] })
        );
    }

    #[test]
    fn access_tokens_are_standard_eddsa_jwts() {
        let pem = generate_ed25519_pem();
        let keys = KeySet::from_pems("boxoffice", &pem, &[], SECRET).unwrap();
        let claims = Claims::new("boxoffice", "ev1", "f", TokenUse::Access, now_s(), 60);
        let token = keys.sign(&claims);
        // Readable by any JWT library holding the public key...
        let x = serde_json::to_value(keys.jwks()).unwrap()["keys"][0]["x"]
            .as_str()
            .unwrap()
            .to_owned();
        let mut validation = Validation::new(Algorithm::EdDSA);
        validation.set_audience(&["ev1"]);
        let decoded = jsonwebtoken::decode::<Claims>(
            &token,
            &DecodingKey::from_ed_components(&x).unwrap(),
            &validation,
        )
        .unwrap();
        assert_eq!(decoded.claims, claims);
        assert_eq!(decoded.header.kid.as_deref(), Some(keys.signing_kid()));
        // ...and one such a library signs passes here.
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(keys.signing_kid().to_owned());
        let made = jsonwebtoken::encode(
            &header,
            &claims,
            &EncodingKey::from_ed_pem(pem.as_bytes()).unwrap(),
        )
        .unwrap();
        assert_eq!(made, token, "Ed25519 is deterministic: the same bytes");
    }

    #[test]
    fn one_admission_has_one_jti() {
        assert_eq!(admission_jti("e", "f", 1), admission_jti("e", "f", 1));
        assert_ne!(admission_jti("e", "f", 1), admission_jti("e", "f", 2));
        assert_ne!(admission_jti("e", "f", 1), admission_jti("e", "g", 1));
    }

    #[test]
    fn a_renewed_admission_keeps_its_first_jti() {
        let first = admission_jti("e", "f", 1_000);
        assert_eq!(admission_jti_of("e", "f", 1_000, None), first);
        let held_over = format!("{first}|9000");
        assert_eq!(admission_jti_of("e", "f", 9_000, Some(&held_over)), first);
        // A held-over key of an earlier admission names another expiry.
        assert_eq!(
            admission_jti_of("e", "f", 20_000, Some(&held_over)),
            admission_jti("e", "f", 20_000)
        );
    }

    #[test]
    fn short_queue_secret_is_refused() {
        assert!(matches!(
            KeySet::from_pems("b", &generate_ed25519_pem(), &[], b"short"),
            Err(KeyError::WeakSecret)
        ));
    }
}
