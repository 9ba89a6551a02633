//! What a file is: magic bytes first, the name only to settle borderline text.

use std::borrow::Cow;

use super::PreviewKind;

/// PDF readers accept the header anywhere in the first 1 KiB (ISO 32000 implementation note).
const PDF_HEADER_WINDOW: usize = 1024;

/// Extensions that are text whatever their content looks like at first glance, so a log full
/// of escape sequences or a file with odd control characters still previews as text.
const TEXT_EXTENSIONS: &[&str] = &[
    "txt", "text", "md", "markdown", "rst", "adoc", "csv", "tsv", "log", "json", "jsonl", "xml",
    "html", "htm", "css", "js", "ts", "rs", "c", "h", "cc", "cpp", "hpp", "py", "rb", "go", "java",
    "kt", "sh", "bash", "zsh", "toml", "yaml", "yml", "ini", "cfg", "conf", "sql", "tex", "svg",
    "diff", "patch", "srt", "vtt",
];

/// `head` is the first bytes of the file (at least the first 8 KiB when the file is longer).
pub fn sniff(name: &str, head: &[u8]) -> PreviewKind {
    if head.is_empty() {
        return PreviewKind::Unsupported;
    }
    let ext = extension(name);
    let pdf_window = &head[..head.len().min(PDF_HEADER_WINDOW)];
    if find(pdf_window, b"%PDF-") || (ext.as_deref() == Some("pdf") && find(head, b"%PDF-")) {
        return PreviewKind::Pdf;
    }
    if image_format(head).is_some() {
        return PreviewKind::Image;
    }
    if decode_text(head, is_text_name(name)).is_some() {
        return PreviewKind::Text;
    }
    PreviewKind::Unsupported
}

/// The kind of some bytes for each class of name ([`name_class`]): `sniff(name, head)` is
/// `kinds(head)[name_class(name)]`. The same bytes can be two kinds under two names (a log full
/// of control characters is text as `a.log`, nothing as `a.bin`).
pub type Kinds = [PreviewKind; 3];

/// What a name tells [`sniff`], the only two facts of it that it reads: 0 for a `.pdf`, 1 for
/// an extension of a text format, 2 for any other name.
pub fn name_class(name: &str) -> usize {
    match extension(name).as_deref() {
        Some("pdf") => 0,
        _ if is_text_name(name) => 1,
        _ => 2,
    }
}

/// The kind of `head` under a name of each class (see [`Kinds`]).
pub fn kinds(head: &[u8]) -> Kinds {
    ["x.pdf", "x.txt", "x"].map(|name| sniff(name, head))
}

/// The image format of the content by its magic bytes (only the formats we decode).
pub(super) fn image_format(head: &[u8]) -> Option<image::ImageFormat> {
    use image::ImageFormat as F;
    if head.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some(F::Png)
    } else if head.starts_with(&[0xFF, 0xD8, 0xFF]) {
        Some(F::Jpeg)
    } else if head.starts_with(b"GIF87a") || head.starts_with(b"GIF89a") {
        Some(F::Gif)
    } else if head.len() >= 12 && &head[..4] == b"RIFF" && &head[8..12] == b"WEBP" {
        Some(F::WebP)
    } else if is_bmp(head) {
        Some(F::Bmp)
    } else if head.starts_with(b"II*\0")
        || head.starts_with(b"MM\0*")
        || head.starts_with(b"II+\0")
        || head.starts_with(b"MM\0+")
    {
        Some(F::Tiff)
    } else {
        None
    }
}

/// "BM" alone would claim any text starting with those letters: also require a known DIB
/// header size (core, V1..V5 and the OS/2 variants).
fn is_bmp(head: &[u8]) -> bool {
    if head.len() < 18 || !head.starts_with(b"BM") {
        return false;
    }
    let dib = u32::from_le_bytes([head[14], head[15], head[16], head[17]]);
    matches!(dib, 12 | 16 | 40 | 52 | 56 | 64 | 108 | 124)
}

/// Whether the name has an extension of a text format.
pub(super) fn is_text_name(name: &str) -> bool {
    extension(name).is_some_and(|e| TEXT_EXTENSIONS.contains(&e.as_str()))
}

fn extension(name: &str) -> Option<String> {
    let base = name.rsplit('/').next().unwrap_or(name);
    let (stem, ext) = base.rsplit_once('.')?;
    (!stem.is_empty() && !ext.is_empty()).then(|| ext.to_ascii_lowercase())
}

fn find(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// The text of `bytes` if they look like text: UTF-16 with a BOM, or bytes without NULs and
/// with few control characters, read as UTF-8 when valid, else as Windows-1252 (Latin-1 plus
/// the printable 0x80..0x9F of Windows files). A known text extension allows more control
/// characters. A byte order mark is dropped.
pub(super) fn decode_text(bytes: &[u8], known_text: bool) -> Option<Cow<'_, str>> {
    // 1 in 100 for content alone (random bytes have ~12%), 1 in 10 with a text extension.
    let allowed = |len: usize| if known_text { len / 10 } else { len / 100 };
    if let Some(little_endian) = utf16_bom(bytes) {
        let units = bytes[2..].chunks_exact(2).map(|p| {
            let pair = [p[0], p[1]];
            if little_endian {
                u16::from_le_bytes(pair)
            } else {
                u16::from_be_bytes(pair)
            }
        });
        let text: String = char::decode_utf16(units)
            .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER))
            .collect();
        let odd = text
            .chars()
            .filter(|&c| {
                c == '\0'
                    || c == char::REPLACEMENT_CHARACTER
                    || (c.is_ascii() && is_odd_control(c as u8))
            })
            .count();
        return (odd <= allowed(text.len())).then_some(Cow::Owned(text));
    }
    if bytes.contains(&0) {
        return None;
    }
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    if let Some(text) = valid_utf8_prefix(bytes) {
        let odd = bytes.iter().filter(|&&b| is_odd_control(b)).count();
        return (odd <= allowed(bytes.len())).then_some(Cow::Borrowed(text));
    }
    // Mostly UTF-8 with a few bad bytes (files pasted together from two encodings): keep it
    // UTF-8, or its real multi-byte characters would all turn into Windows-1252 pairs.
    let lossy = String::from_utf8_lossy(bytes);
    let bad = lossy
        .chars()
        .filter(|&c| c == char::REPLACEMENT_CHARACTER)
        .count();
    let good = lossy
        .chars()
        .filter(|&c| !c.is_ascii() && c != char::REPLACEMENT_CHARACTER)
        .count();
    if good > bad {
        let odd = bytes.iter().filter(|&&b| is_odd_control(b)).count() + bad;
        return (odd <= allowed(bytes.len())).then(|| Cow::Owned(lossy.into_owned()));
    }
    let odd = bytes
        .iter()
        .filter(|&&b| is_odd_control(b) || is_undefined_cp1252(b))
        .count();
    (odd <= allowed(bytes.len())).then(|| Cow::Owned(bytes.iter().map(|&b| cp1252(b)).collect()))
}

/// Control bytes that plain text does not contain (tab, newlines, form feed and the ESC of
/// colour codes are fine).
fn is_odd_control(b: u8) -> bool {
    (b < 0x20 && !matches!(b, b'\t' | b'\n' | b'\r' | 0x0C | 0x1B)) || b == 0x7F
}

/// Bytes with no character in Windows-1252.
fn is_undefined_cp1252(b: u8) -> bool {
    matches!(b, 0x81 | 0x8D | 0x8F | 0x90 | 0x9D)
}

/// Windows-1252: Latin-1 except 0x80..0x9F, which hold printable characters (€, quotes, dashes)
/// instead of the C1 controls no text file means.
fn cp1252(b: u8) -> char {
    const HIGH: [char; 32] = [
        '€', '\u{FFFD}', '‚', 'ƒ', '„', '…', '†', '‡', 'ˆ', '‰', 'Š', '‹', 'Œ', '\u{FFFD}', 'Ž',
        '\u{FFFD}', '\u{FFFD}', '‘', '’', '“', '”', '•', '–', '—', '˜', '™', 'š', '›', 'œ',
        '\u{FFFD}', 'ž', 'Ÿ',
    ];
    match b {
        0x80..=0x9F => HIGH[usize::from(b - 0x80)],
        _ => char::from(b),
    }
}

/// The UTF-8 text of `bytes`, allowing one incomplete character at the very end (a cut-off
/// head, or a text file cut at TEXT_MAX_BYTES).
pub(super) fn valid_utf8_prefix(bytes: &[u8]) -> Option<&str> {
    match std::str::from_utf8(bytes) {
        Ok(s) => Some(s),
        Err(e) if e.error_len().is_none() => std::str::from_utf8(&bytes[..e.valid_up_to()]).ok(),
        Err(_) => None,
    }
}

/// Whether the bytes start with a UTF-16 byte order mark: Some(true) for little endian.
fn utf16_bom(bytes: &[u8]) -> Option<bool> {
    if bytes.starts_with(&[0xFF, 0xFE]) {
        Some(true)
    } else if bytes.starts_with(&[0xFE, 0xFF]) {
        Some(false)
    } else {
        None
    }
}
