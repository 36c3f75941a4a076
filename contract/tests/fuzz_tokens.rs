//! Property tests over token parsing: whatever arrives as a bearer token,
//! verification answers (never panics), and nothing but a genuine token passes.
//! Bounded case counts keep it a few seconds in CI.

use std::sync::OnceLock;

use boxoffice_contract::token::{generate_ed25519_pem, now_s, Claims, KeySet, TokenUse};
use proptest::prelude::*;

const KINDS: [TokenUse; 3] = [TokenUse::Queue, TokenUse::Access, TokenUse::Order];

fn keys() -> &'static KeySet {
    static KEYS: OnceLock<KeySet> = OnceLock::new();
    KEYS.get_or_init(|| {
        KeySet::from_pems(
            "boxoffice",
            &generate_ed25519_pem(),
            &[],
            b"0123456789abcdef0123456789abcdef",
        )
        .unwrap()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn any_string_gets_an_answer(token in ".{0,600}") {
        for kind in KINDS {
            let _ = keys().verify(&token, kind, Some("ev"));
            let _ = keys().verify(&token, kind, None);
        }
        let _ = keys().queue_ticket_fan(&token, "ev");
    }

    #[test]
    fn jwt_shaped_garbage_never_passes(
        header in "[A-Za-z0-9_-]{0,80}",
        payload in "[A-Za-z0-9_-]{0,300}",
        signature in "[A-Za-z0-9_-]{0,100}",
    ) {
        let token = format!("{header}.{payload}.{signature}");
        for kind in KINDS {
            prop_assert!(keys().verify(&token, kind, Some("ev")).is_err());
        }
        prop_assert!(keys().queue_ticket_fan(&token, "ev").is_err());
    }

    #[test]
    fn any_changed_character_breaks_a_genuine_token(kind_index in 0usize..3, at in any::<prop::sample::Index>(), pick in any::<prop::sample::Index>()) {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let kind = KINDS[kind_index];
        let token = keys().sign(&Claims::new("boxoffice", "ev", "fan", kind, now_s(), 600));
        let bytes = token.as_bytes();
        // Not a dot, and not the last character of a segment (it may carry unused bits).
        let at = at.index(bytes.len());
        prop_assume!(bytes[at] != b'.' && at + 1 < bytes.len() && bytes[at + 1] != b'.');
        let mut replacement = ALPHABET[pick.index(ALPHABET.len())];
        if replacement == bytes[at] {
            replacement = if bytes[at] == b'A' { b'B' } else { b'A' };
        }
        let mut forged = bytes.to_vec();
        forged[at] = replacement;
        let forged = String::from_utf8(forged).unwrap();
        prop_assert!(keys().verify(&forged, kind, Some("ev")).is_err(), "a changed token passed: {}", forged);
        prop_assert!(keys().queue_ticket_fan(&forged, "ev").is_err(), "a changed ticket passed: {}", forged);
    }

    /// The fan-only read and the full check agree on every genuine ticket,
    /// whatever its fan id holds (quotes and backslashes come back escaped
    /// in the JSON, so they are read through a copy).
    #[test]
    fn the_fan_read_agrees_with_the_full_check(fan in "\\PC{1,80}", event in "[a-z0-9-]{1,20}") {
        let token = keys().sign(&Claims::new("boxoffice", &event, &fan, TokenUse::Queue, now_s(), 600));
        prop_assert_eq!(keys().queue_ticket_fan(&token, &event).unwrap(), fan.clone());
        prop_assert_eq!(keys().verify(&token, TokenUse::Queue, Some(&event)).unwrap().sub, fan);
        prop_assert!(keys().queue_ticket_fan(&token, "Another-Event").is_err());
    }
}
