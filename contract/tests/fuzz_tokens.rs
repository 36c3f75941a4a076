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
    }
}
