//! Property tests of the parsers that face hostile input: node paths (request line and
//! `dst_uri`), the `Range` header, and the envelope the client reads. Whatever the input, no
//! panic, and whatever is accepted is safe and round-trips.

use proptest::prelude::*;
use vaultfs::api::path::validate_name;
use vaultfs::api::{Envelope, NodePath, RangeRequest};

/// Segments as a hostile client might spell them: dots, slashes, percent signs, NULs, Unicode.
fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-zA-Z0-9 ._~-]{1,12}",
        "(%2[eEfF]|%00|%[0-9a-fA-F]{2}|\\.|/|\\\\|é|\u{0}){1,6}",
        any::<String>(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn request_paths_never_panic_and_never_escape(segs in proptest::collection::vec(segment(), 0..6)) {
        let raw = format!("/{}", segs.join("/"));
        if let Ok(p) = NodePath::parse_encoded(&raw) {
            for s in p.segments() {
                prop_assert!(validate_name(s).is_ok(), "{raw:?} gave segment {s:?}");
                prop_assert!(s != "." && s != ".." && !s.contains('/') && !s.contains('\0'));
            }
            // What was accepted encodes back to itself.
            let again = NodePath::parse_encoded(&p.encoded()["/nodes/pth".len()..]).unwrap();
            prop_assert_eq!(&again, &p);
            prop_assert_eq!(NodePath::parse_uri(&p.uri()).unwrap(), p);
        }
    }

    #[test]
    fn valid_names_round_trip_through_both_forms(names in proptest::collection::vec("[^/\u{0}]{1,40}", 1..5)) {
        prop_assume!(names.iter().all(|n| validate_name(n).is_ok()));
        let p = NodePath::from_segments(names.clone()).unwrap();
        prop_assert_eq!(p.segments(), &names[..]);
        prop_assert_eq!(NodePath::parse_encoded(&p.encoded()["/nodes/pth".len()..]).unwrap(), p.clone());
        prop_assert_eq!(NodePath::parse_uri(&p.uri()).unwrap(), p);
    }

    #[test]
    fn dst_uris_never_panic(s in any::<String>()) {
        if let Ok(p) = NodePath::parse_uri(&s) {
            prop_assert!(s.starts_with("/nodes/pth"));
            prop_assert!(p.segments().iter().all(|x| validate_name(x).is_ok()));
        }
    }

    #[test]
    fn ranges_resolve_inside_the_file(h in "bytes=[0-9]{0,20}-[0-9]{0,20}|.{0,30}", size in 0u64..1_000_000_000_000) {
        if let Ok(r) = RangeRequest::parse(&h) {
            prop_assert_eq!(RangeRequest::parse(&r.to_string()).unwrap(), r);
            if let Ok((a, b)) = r.resolve(size) {
                prop_assert!(a <= b && b < size, "{h:?} over {size}: {a}-{b}");
            }
        }
    }

    #[test]
    fn envelopes_never_panic(body in any::<Vec<u8>>(), status in 100u16..600) {
        if let Ok(env) = serde_json::from_slice::<Envelope<serde_json::Value>>(&body) {
            let success = env.error.success;
            match env.into_result(status) {
                Ok(_) => prop_assert!(success),
                Err(e) => prop_assert!(!success && !e.code.is_empty()),
            }
        }
    }

    #[test]
    fn json_shaped_envelopes_decide_by_error_success(success in any::<bool>(), code in "[a-z_]{0,12}", status in 100u16..600) {
        let body = serde_json::json!({"error": {"success": success, "error_code": code, "extra": [1, 2]}, "message": {"x": 1}});
        let env: Envelope<serde_json::Value> = serde_json::from_value(body).unwrap();
        prop_assert_eq!(env.into_result(status).is_ok(), success);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// The names the built-in store creates: whatever is accepted is valid, in NFC, free of
    /// control and bidirectional characters, and stays itself when given again.
    #[test]
    fn new_names_are_nfc_and_clean(name in prop_oneof![
        any::<String>(),
        "([a-z]|e\u{301}|\u{e9}|A\u{30a}|\u{212b}|\u{202e}|\u{200f}|\n|\u{1b}|\u{85}|\u{7f}){1,12}",
    ]) {
        if let Ok(n) = vaultfs::api::path::new_name(&name) {
            prop_assert!(validate_name(&n).is_ok());
            prop_assert_eq!(vaultfs::api::path::nfc(&n), n.clone());
            let bad = |c: char| c.is_control()
                || matches!(c, '\u{61c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
            prop_assert!(!n.chars().any(bad), "{:?}", n);
            prop_assert_eq!(vaultfs::api::path::new_name(&n).unwrap(), n);
        }
    }
}
