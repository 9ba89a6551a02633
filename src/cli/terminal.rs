//! Text from elsewhere (a server's answer, a document's words, a file's name, an extended
//! attribute) made safe to print on a terminal: the one place in `cli` that says which
//! characters could rewrite it (escape sequences that set the clipboard or clear the screen, a
//! right-to-left override that turns `txt.exe` around) and what is printed instead. Used by
//! `login`, `link`, `search` and `restore`.

/// A character a terminal may act on rather than show: C0 and C1 controls, DEL, and the
/// bidirectional formatting characters (marks, embeddings, overrides, isolates): the set a new
/// name may not hold either (`api::path::is_unsafe_char`).
pub use crate::api::path::is_unsafe_char as is_unsafe;

/// `text` with every unsafe character written as a visible escape (`\x1b`, `\u{202e}`); all
/// other text, any script, is kept as it is.
pub fn escaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            c if !is_unsafe(c) => out.push(c),
            c if (c as u32) < 0x100 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
        }
    }
    out
}

/// Serialized JSON with the unsafe characters left in its strings written as `\uXXXX`
/// (serde_json escapes C0 controls only: C1 controls and bidi overrides would reach the
/// terminal). The JSON means the same.
pub fn json(serialized: &str) -> String {
    let mut out = String::with_capacity(serialized.len());
    for c in serialized.chars() {
        // Outside strings JSON holds only ASCII punctuation, digits, letters and whitespace,
        // so each unsafe character is inside a string, where `\uXXXX` stands for it.
        if is_unsafe(c) && !matches!(c, '\n' | '\t' | '\r' | ' ') {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// A web address someone else gave (a server's answer, an attribute), made safe to print and
/// to open: an `http`/`https` address with a host, holding no unsafe character. One relative to
/// `base` (the server's address, when known) is joined to it. Otherwise an error that shows
/// what was sent, escaped (at most 200 characters of it).
pub fn web_url(base: Option<&str>, sent: &str) -> Result<String, String> {
    let shown: String = escaped(&sent.chars().take(200).collect::<String>());
    let refuse = || format!("not a web address: {shown}");
    if sent.chars().any(is_unsafe) {
        return Err(refuse());
    }
    let url = match base {
        Some(base) => reqwest::Url::parse(&format!("{}/", base.trim_end_matches('/')))
            .map_err(|e| format!("bad server address {base}: {e}"))?
            .join(sent),
        None => reqwest::Url::parse(sent),
    }
    .map_err(|_| refuse())?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(refuse());
    }
    Ok(url.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsafe_characters_are_shown_escaped_and_other_text_kept() {
        assert_eq!(
            escaped("a\u{1b}]52;c;aGk=\u{7}\u{1b}[2J b"),
            "a\\x1b]52;c;aGk=\\x07\\x1b[2J b"
        );
        assert_eq!(escaped("\u{9b}31m\u{7f}"), "\\x9b31m\\x7f");
        assert_eq!(escaped("invoice\u{202e}fdp.exe"), "invoice\\u{202e}fdp.exe");
        assert_eq!(escaped("a\u{2066}b\u{2069}"), "a\\u{2066}b\\u{2069}");
        assert_eq!(escaped("Grüße, 東京, مرحبا 🙂"), "Grüße, 東京, مرحبا 🙂");
        let j = json(
            &serde_json::to_string(&serde_json::json!({"a": "x\u{9b}\u{202e}\u{1b}"})).unwrap(),
        );
        assert_eq!(j, r#"{"a":"x\u009b\u202e\u001b"}"#);
        let back: serde_json::Value = serde_json::from_str(&j).unwrap();
        assert_eq!(back["a"], "x\u{9b}\u{202e}\u{1b}");
    }

    #[test]
    fn only_absolute_web_addresses_without_control_characters_pass() {
        let ok = |u: &str| web_url(None, u);
        assert_eq!(
            ok("https://vault.example.com/web/file/5?view=info&id=5").unwrap(),
            "https://vault.example.com/web/file/5?view=info&id=5"
        );
        assert!(ok("/web/file/5?view=info&id=5").is_err());
        assert_eq!(
            web_url(Some("http://127.0.0.1:8080"), "/web/file/5?id=5").unwrap(),
            "http://127.0.0.1:8080/web/file/5?id=5"
        );
        for bad in [
            "file:///etc/passwd",
            "javascript:alert(1)",
            "https://x.example/\u{1b}]52;c;aGk=\u{7}\u{1b}[2J",
            "https://x.example/\u{9b}2J",
            "https://x.example/\u{7f}",
            "https://x.example/\u{202e}fdp.exe",
            "https://x.example/\u{2067}a",
            "https://x.example/a\nb",
            "data:text/html,hi",
            "mailto:a@b.example",
        ] {
            let e = ok(bad).unwrap_err();
            assert!(!e.chars().any(is_unsafe), "{e:?}");
        }
    }
}
