//! AWS Signature Version 4 for S3: the canonical form of a request, the signing key derived from
//! the secret, and the `Authorization` header made from them.

use sha2::{Digest, Sha256};

use crate::api::checksum::hex;

pub(super) struct Credentials {
    pub(super) access_key: String,
    pub(super) secret_key: String,
    pub(super) session_token: Option<String>,
}

/// RFC 3986 unreserved characters stay, everything else is %-encoded (S3's canonical form);
/// `/` stays in paths.
pub(super) fn encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) || (keep_slash && b == b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

pub(super) fn hmac(key: &[u8], msg: &[u8]) -> [u8; 32] {
    let mut k = [0u8; 64];
    if key.len() > 64 {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(k.map(|b| b ^ 0x36));
    inner.update(msg);
    let mut outer = Sha256::new();
    outer.update(k.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

/// `20130524T000000Z` for a time.
pub(super) fn amz_date(t: time::OffsetDateTime) -> String {
    format!(
        "{:04}{:02}{:02}T{:02}{:02}{:02}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// What a request signs: the parts of its canonical form.
pub(super) struct ToSign<'a> {
    pub(super) method: &'a str,
    /// Already encoded.
    pub(super) path: &'a str,
    /// Encoded and sorted `k=v` pairs.
    pub(super) query: &'a str,
    /// Lowercase names, sorted, values trimmed.
    pub(super) headers: &'a [(String, String)],
    pub(super) payload_sha256: &'a str,
}

/// The `Authorization` header of a request (AWS Signature Version 4).
pub(super) fn authorization(
    creds: &Credentials,
    region: &str,
    date: &str,
    req: &ToSign<'_>,
) -> String {
    let mut canonical_headers = String::new();
    for (k, v) in req.headers {
        canonical_headers.push_str(&format!("{k}:{v}\n"));
    }
    let signed: Vec<&str> = req.headers.iter().map(|(k, _)| k.as_str()).collect();
    let signed = signed.join(";");
    let canonical = format!(
        "{}\n{}\n{}\n{}\n{}\n{}",
        req.method, req.path, req.query, canonical_headers, signed, req.payload_sha256
    );
    let day = &date[..8];
    let scope = format!("{day}/{region}/s3/aws4_request");
    let string_to_sign = format!(
        "AWS4-HMAC-SHA256\n{date}\n{scope}\n{}",
        hex(&Sha256::digest(canonical.as_bytes()))
    );
    let mut key = hmac(
        format!("AWS4{}", creds.secret_key).as_bytes(),
        day.as_bytes(),
    );
    for part in [region, "s3", "aws4_request"] {
        key = hmac(&key, part.as_bytes());
    }
    let signature = hex(&hmac(&key, string_to_sign.as_bytes()));
    format!(
        "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed}, Signature={signature}",
        creds.access_key
    )
}
