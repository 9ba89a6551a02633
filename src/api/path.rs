//! Node paths (`/nodes/pth/{account}/{vault}/{folders...}/{name}`): the one place that parses,
//! validates and encodes them. The request line carries percent-encoded UTF-8 segments; `uri`
//! fields and `dst_uri` carry the decoded path.

use std::fmt;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};

use super::error::{Error, Result};

pub const NODES_PREFIX: &str = "/nodes/pth";

/// Longest name, in bytes, that a node may have (NAME_MAX of the filesystems we mount on).
pub const MAX_NAME_BYTES: usize = 255;

/// Most segments a node path may have (account, vault, folders and name). Deeper paths are 400
/// `path_too_deep` on every route, and a copy or move that would put a node deeper is refused
/// the same way; the mount's mkdir gets ENAMETOOLONG. It bounds the work one request can ask
/// of the tree (walks, copies, deletes).
pub const MAX_PATH_DEPTH: usize = 256;

/// Longest file or version ID, in bytes, that the client accepts from a server.
pub const MAX_ID_BYTES: usize = 256;

/// Everything but RFC 3986's unreserved characters is encoded in a segment.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// A validated path below `/nodes/pth`: empty for the root, then account, vault, folders, name.
///
/// Kept as one string, the segments joined by `/` (no name holds one: [`validate_name`]): one
/// allocation a path, where a mount keeps a path or two for every file it knows (a `Vec` of
/// `String`s was five for `Local/My First Vault/t/f.txt`, 240 bytes). Equal, hashed and ordered
/// as the list of its segments (a folder's tree sorts right after it).
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct NodePath {
    joined: String,
}

impl Ord for NodePath {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.iter().cmp(other.iter())
    }
}

impl PartialOrd for NodePath {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Debug for NodePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodePath")
            .field("segments", &self.segments())
            .finish()
    }
}

/// Checks one node name: not empty, not `.` or `..`, no `/` or NUL, at most 255 bytes.
pub fn validate_name(name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::bad_path("empty path segment or name"));
    }
    if name == "." || name == ".." {
        return Err(Error::bad_path(format!(
            "`{name}` is not allowed as a path segment"
        )));
    }
    if name.contains('/') {
        return Err(Error::bad_path("a name cannot contain `/`"));
    }
    if name.contains('\0') {
        return Err(Error::bad_path("a name cannot contain NUL"));
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(Error::bad_path(format!(
            "a name is at most {MAX_NAME_BYTES} bytes"
        )));
    }
    Ok(())
}

/// Characters that reorder how text is displayed (bidirectional overrides, embeddings, isolates
/// and marks): in a name they make `evil\u{202e}fdp.exe` show as `evilexe.pdf`.
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// A character no new name holds and no terminal is given raw: a control character (C0, DEL,
/// C1) or a bidirectional one ([`new_name`], [`tagged_name`], `cli::terminal`).
pub fn is_unsafe_char(c: char) -> bool {
    c.is_control() || is_bidi_control(c)
}

/// The name of a node being created in the built-in store (a folder, a file, a copy's or a
/// move's destination), as it is stored: in Unicode NFC, so the two spellings of `é` are one
/// name; without control characters (C0, DEL, C1: a newline or an escape sequence in a name
/// breaks scripts and terminals) or bidirectional controls. Besides, [`validate_name`]'s rules.
/// Names already stored, and names a server sends the client, are taken as they are.
pub fn new_name(name: &str) -> Result<String> {
    validate_name(name)?;
    if let Some(c) = name.chars().find(|&c| is_unsafe_char(c)) {
        return Err(Error::bad_path(format!(
            "a name cannot contain the control character U+{:04X}",
            c as u32
        )));
    }
    let nfc = nfc(name);
    validate_name(&nfc)?;
    Ok(nfc)
}

/// `s` in Unicode normalization form C (how the built-in store keeps and looks up names).
pub fn nfc(s: &str) -> String {
    icu_normalizer::ComposingNormalizerBorrowed::new_nfc()
        .normalize(s)
        .into_owned()
}

/// `s` in Unicode normalization form D: the spelling of names that older builds stored as a
/// client (macOS's, typically) sent them, still looked up (`store::nodes::resolve`).
pub fn nfd(s: &str) -> String {
    icu_normalizer::DecomposingNormalizerBorrowed::new_nfd()
        .normalize(s)
        .into_owned()
}

/// `NAME (TAG).EXT` for `name`, ` N` after the tag when `n` > 1 (to make it unique): the
/// extension stays last so the file opens as the original did. Always a name the store takes,
/// whatever `name` and `tag` hold (conflict copies, restored files, issue 47): the tag loses
/// control and bidi characters and `/`; the stem is cut (at a character boundary) to fit
/// [`MAX_NAME_BYTES`], and an extension too long to leave the stem [`KEPT_STEM`] bytes is cut
/// at its end too.
pub fn tagged_name(name: &str, tag: &str, n: u32) -> String {
    let (stem, ext) = match name.rfind('.') {
        Some(i) if i > 0 => name.split_at(i),
        _ => (name, ""),
    };
    let tag: String = tag
        .chars()
        .filter(|&c| !is_unsafe_char(c) && c != '/')
        .collect();
    let suffix = if n > 1 {
        format!(" ({tag} {n})")
    } else {
        format!(" ({tag})")
    };
    let room = MAX_NAME_BYTES.saturating_sub(suffix.len());
    let ext = cut_at_char(ext, room.saturating_sub(stem.len().min(KEPT_STEM)));
    let stem = cut_at_char(stem, room - ext.len());
    format!("{stem}{suffix}{ext}")
}

/// What a [`tagged_name`] keeps of a stem at least (all of a shorter one), cutting a long
/// extension rather than leaving a name that starts with its tag.
pub const KEPT_STEM: usize = 32;

/// The longest start of `s` within `max` bytes that ends on a character boundary.
pub fn cut_at_char(s: &str, max: usize) -> &str {
    let mut cut = s.len().min(max);
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    &s[..cut]
}

/// `YYYY-MM-DD HHMMSS` (UTC): a time in a [`tagged_name`].
pub fn name_time(when: std::time::SystemTime) -> String {
    let t = time::OffsetDateTime::from(when);
    format!(
        "{:04}-{:02}-{:02} {:02}{:02}{:02}",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// `NAME (conflict YYYY-MM-DD HHMMSS BY).EXT`: the conflict copy of `name` made at `when` (UTC)
/// for the writer `by` (the mount's host, a WebDAV device's name), ` N` after it when `n` > 1
/// (to make it unique). The one spelling of conflict copies, whoever makes them.
pub fn conflict_name(name: &str, when: std::time::SystemTime, by: &str, n: u32) -> String {
    tagged_name(name, &format!("conflict {} {by}", name_time(when)), n)
}

/// The error of a path over [`MAX_PATH_DEPTH`] segments.
pub fn path_too_deep(depth: usize) -> Error {
    Error::bad_request(
        "path_too_deep",
        format!("a path has at most {MAX_PATH_DEPTH} segments; this one would have {depth}"),
    )
}

/// Checks an ID (file or version) that a server sent. IDs are opaque (decimal digits on our
/// server and the public service), but they end up in request lines, logs and the mount's
/// extended attributes, so the client takes only what is harmless there: 1 to
/// [`MAX_ID_BYTES`] bytes, no `/`, no NUL or other control character. (The mount never derives
/// a local file name from an ID: its read cache names files by a hash.)
pub fn validate_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= MAX_ID_BYTES
        && !id.contains('/')
        && !id.chars().any(char::is_control);
    if ok {
        Ok(())
    } else {
        Err(Error::new(
            super::ErrorKind::Server,
            "bad_response",
            format!(
                "the server sent an unusable ID ({} bytes; IDs are 1 to {MAX_ID_BYTES} bytes without `/` or control characters)",
                id.len()
            ),
        ))
    }
}

impl NodePath {
    pub fn root() -> Self {
        NodePath::default()
    }

    /// The path of these segments, each checked by [`validate_name`].
    pub fn from_segments<I, S>(segments: I) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut joined = String::new();
        for s in segments {
            let s = s.as_ref();
            validate_name(s)?;
            if !joined.is_empty() {
                joined.push('/');
            }
            joined.push_str(s);
        }
        Ok(NodePath { joined })
    }

    /// Parses the part of a request path after `/nodes/pth` (e.g. `/Acme/My%20First%20Vault`),
    /// percent-decoding each segment. An encoded `/`, `.`/`..` in any spelling, NUL, invalid UTF-8
    /// and empty segments are `bad_path`. One trailing slash is tolerated.
    pub fn parse_encoded(rest: &str) -> Result<Self> {
        let rest = match rest.strip_prefix('/') {
            Some(r) => r,
            None if rest.is_empty() => return Ok(NodePath::root()),
            None => return Err(Error::bad_path("path must start with `/`")),
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.is_empty() {
            return Ok(NodePath::root());
        }
        let depth = rest.split('/').count();
        if depth > MAX_PATH_DEPTH {
            return Err(path_too_deep(depth));
        }
        let mut segments = Vec::with_capacity(depth);
        for raw in rest.split('/') {
            let decoded = percent_decode_str(raw)
                .decode_utf8()
                .map_err(|_| Error::bad_path("path segment is not valid UTF-8"))?;
            segments.push(decoded);
        }
        Self::from_segments(segments)
    }

    /// Parses a decoded `/nodes/pth/...` path, as found in `uri` and `dst_uri` fields.
    pub fn parse_uri(uri: &str) -> Result<Self> {
        let rest = uri
            .strip_prefix(NODES_PREFIX)
            .filter(|r| r.is_empty() || r.starts_with('/'))
            .ok_or_else(|| {
                Error::bad_path(format!("`{uri}` does not begin with {NODES_PREFIX}"))
            })?;
        let rest = rest.strip_prefix('/').unwrap_or(rest);
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.is_empty() {
            return Ok(NodePath::root());
        }
        let depth = rest.split('/').count();
        if depth > MAX_PATH_DEPTH {
            return Err(path_too_deep(depth));
        }
        Self::from_segments(rest.split('/'))
    }

    /// The same path with every segment in NFC: how the built-in server takes a path, where it
    /// parses one (the request line, `dst_uri`), so that the two spellings of a name are one
    /// path for every comparison after. (The client keeps a server's names as they are.)
    pub fn into_nfc(self) -> Result<NodePath> {
        if self.iter().all(|s| nfc(s) == s) {
            return Ok(self);
        }
        Self::from_segments(self.iter().map(nfc))
    }

    /// 400 `path_too_deep` when the path has more than [`MAX_PATH_DEPTH`] segments. (Parsing
    /// checks it; paths built with [`NodePath::child`] are checked where they are created.)
    pub fn check_depth(&self) -> Result<()> {
        if self.depth() > MAX_PATH_DEPTH {
            return Err(path_too_deep(self.depth()));
        }
        Ok(())
    }

    /// The segments, first to last.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &str> + Clone {
        (!self.joined.is_empty())
            .then(|| self.joined.split('/'))
            .into_iter()
            .flatten()
    }
    pub fn segments(&self) -> Vec<&str> {
        self.iter().collect()
    }
    pub fn is_root(&self) -> bool {
        self.joined.is_empty()
    }
    pub fn depth(&self) -> usize {
        if self.is_root() {
            0
        } else {
            self.joined.bytes().filter(|b| *b == b'/').count() + 1
        }
    }
    /// Whether files and folders can be made in this node: a vault or a folder in one. The
    /// root lists accounts, and an account holds the vaults that come with it.
    pub fn holds_entries(&self) -> bool {
        self.depth() >= 2
    }
    /// The account this path is in (its first segment).
    pub fn account(&self) -> Option<&str> {
        self.iter().next()
    }
    pub fn name(&self) -> Option<&str> {
        self.iter().next_back()
    }
    pub fn parent(&self) -> Option<NodePath> {
        if self.is_root() {
            return None;
        }
        let head = self.joined.rfind('/').map_or("", |i| &self.joined[..i]);
        Some(NodePath {
            joined: head.to_string(),
        })
    }
    pub fn child(&self, name: &str) -> Result<NodePath> {
        validate_name(name)?;
        let mut joined = String::with_capacity(self.joined.len() + 1 + name.len());
        joined.push_str(&self.joined);
        if !joined.is_empty() {
            joined.push('/');
        }
        joined.push_str(name);
        Ok(NodePath { joined })
    }
    /// True when `self` is `other` or one of its ancestors.
    pub fn contains(&self, other: &NodePath) -> bool {
        self.is_root()
            || other
                .joined
                .strip_prefix(&self.joined)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    }

    /// The decoded form used in `uri` fields: `/nodes/pth/Acme/My First Vault`.
    pub fn uri(&self) -> String {
        let mut s = String::with_capacity(NODES_PREFIX.len() + 1 + self.joined.len());
        s.push_str(NODES_PREFIX);
        if !self.is_root() {
            s.push('/');
            s.push_str(&self.joined);
        }
        s
    }

    /// The percent-encoded form for a request line: `/nodes/pth/Acme/My%20First%20Vault`.
    pub fn encoded(&self) -> String {
        let mut s = String::from(NODES_PREFIX);
        for seg in self.iter() {
            s.push('/');
            s.extend(utf8_percent_encode(seg, SEGMENT));
        }
        s
    }
}

impl fmt::Display for NodePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.uri())
    }
}

/// Percent-encodes one segment (IDs, names) for a request line.
pub fn encode_segment(s: &str) -> String {
    utf8_percent_encode(s, SEGMENT).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tagged_names_stay_within_the_bound_whatever_the_extension() {
        assert_eq!(
            tagged_name("notes.txt", "restored x", 1),
            "notes (restored x).txt"
        );
        assert_eq!(
            tagged_name("notes.txt", "restored x", 2),
            "notes (restored x 2).txt"
        );
        for name in [
            format!("a.{}", "x".repeat(250)),
            format!(".{}", "y".repeat(254)),
            format!("{}.txt", "é".repeat(125)),
            "é".repeat(127),
        ] {
            let t = tagged_name(&name, "restored 2026-12-06 120000", 12);
            assert!(t.len() <= MAX_NAME_BYTES, "{} bytes: {t}", t.len());
            assert!(t.contains(" (restored 2026-12-06 120000 12)"), "{t}");
            assert!(new_name(&t).is_ok(), "{t}");
        }
    }

    #[test]
    fn parses_and_encodes_round_trip() {
        let p = NodePath::parse_encoded("/Acme/My%20First%20Vault/r%C3%A9sum%C3%A9.txt").unwrap();
        assert_eq!(p.segments(), ["Acme", "My First Vault", "résumé.txt"]);
        assert_eq!(p.uri(), "/nodes/pth/Acme/My First Vault/résumé.txt");
        assert_eq!(
            p.encoded(),
            "/nodes/pth/Acme/My%20First%20Vault/r%C3%A9sum%C3%A9.txt"
        );
        assert_eq!(
            NodePath::parse_encoded(&p.encoded()[NODES_PREFIX.len()..]).unwrap(),
            p
        );
        assert_eq!(NodePath::parse_uri(&p.uri()).unwrap(), p);
    }

    #[test]
    fn rejects_traversal_in_every_spelling() {
        for bad in [
            "/a/../b",
            "/a/./b",
            "/a/%2e%2e/b",
            "/a/%2E%2E",
            "/a/.%2e",
            "/a/%2e",
            "/a/b%2Fc",
            "/a/b%2fc",
            "/a//b",
            "/a/%00",
            "/a/b%00c",
            "/a/%ff",
            "a/b",
        ] {
            let err = NodePath::parse_encoded(bad).unwrap_err();
            assert_eq!(err.code, "bad_path", "{bad}");
        }
        for bad in [
            "/nodes/pth/a/../b",
            "/nodes/pthx/a",
            "/other/a",
            "nodes/pth/a",
            "/nodes/pth/a//b",
        ] {
            assert_eq!(
                NodePath::parse_uri(bad).unwrap_err().code,
                "bad_path",
                "{bad}"
            );
        }
        assert!(NodePath::parse_encoded(&format!("/{}", "x".repeat(256))).is_err());
        assert!(NodePath::parse_encoded(&format!("/{}", "x".repeat(255))).is_ok());
    }

    #[test]
    fn new_names_are_nfc_without_control_characters() {
        assert_eq!(
            new_name("e\u{301}te\u{301}.txt").unwrap(),
            "\u{e9}t\u{e9}.txt"
        );
        assert_eq!(new_name("plain name.txt").unwrap(), "plain name.txt");
        assert_eq!(new_name("日本語").unwrap(), "日本語");
        for bad in [
            "a\nb",
            "tab\there",
            "\u{1b}[2Jx",
            "del\u{7f}",
            "c1\u{85}",
            "evil\u{202e}fdp.exe",
            "iso\u{2066}late",
            "mark\u{200f}",
        ] {
            let e = new_name(bad).unwrap_err();
            assert_eq!(e.code, "bad_path", "{bad:?}");
        }
    }

    #[test]
    fn paths_taken_by_the_server_are_nfc_in_every_segment() {
        let p = NodePath::parse_uri("/nodes/pth/A/V/e\u{300}/sub/u\u{308}.txt")
            .unwrap()
            .into_nfc()
            .unwrap();
        assert_eq!(p.segments(), ["A", "V", "\u{e8}", "sub", "\u{fc}.txt"]);
        let q = NodePath::parse_encoded("/A/V/%C3%A8")
            .unwrap()
            .into_nfc()
            .unwrap();
        assert!(q.contains(&p));
        assert_eq!(nfd("\u{e8}"), "e\u{300}");
    }

    #[test]
    fn depth_is_bounded() {
        let at_limit = format!("/{}", vec!["d"; MAX_PATH_DEPTH].join("/"));
        let over = format!("/{}", vec!["d"; MAX_PATH_DEPTH + 1].join("/"));
        assert_eq!(
            NodePath::parse_encoded(&at_limit).unwrap().depth(),
            MAX_PATH_DEPTH
        );
        assert_eq!(
            NodePath::parse_encoded(&over).unwrap_err().code,
            "path_too_deep"
        );
        assert!(NodePath::parse_uri(&format!("{NODES_PREFIX}{at_limit}")).is_ok());
        let e = NodePath::parse_uri(&format!("{NODES_PREFIX}{over}")).unwrap_err();
        assert_eq!((e.code.as_ref(), e.status()), ("path_too_deep", 400));
        // A million empty segments are refused by counting, before anything is decoded.
        assert!(NodePath::parse_encoded(&"/".repeat(1_000_000)).is_err());
        let deep = NodePath::parse_encoded(&at_limit).unwrap();
        assert!(deep.check_depth().is_ok());
        assert_eq!(
            deep.child("x").unwrap().check_depth().unwrap_err().code,
            "path_too_deep"
        );
    }

    #[test]
    fn ids_from_a_server_are_checked() {
        for good in [
            "1",
            "4711",
            "abc-DEF_1.2",
            "x".repeat(MAX_ID_BYTES).as_str(),
            "é",
        ] {
            assert!(validate_id(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "../../../../tmp/x",
            "a/b",
            "/",
            "a\0b",
            "a\nb",
            "\u{1b}[31m",
            "\u{7f}",
            "x".repeat(MAX_ID_BYTES + 1).as_str(),
        ] {
            let e = validate_id(bad).unwrap_err();
            assert_eq!(e.code, "bad_response", "{bad:?}");
        }
    }

    #[test]
    fn root_and_trailing_slash() {
        assert!(NodePath::parse_encoded("").unwrap().is_root());
        assert!(NodePath::parse_encoded("/").unwrap().is_root());
        assert_eq!(
            NodePath::parse_encoded("/a/b/").unwrap().segments(),
            ["a", "b"]
        );
        assert!(NodePath::parse_uri("/nodes/pth").unwrap().is_root());
        let p = NodePath::parse_uri("/nodes/pth/a/b").unwrap();
        assert!(p.parent().unwrap().contains(&p));
        assert!(!p.contains(&p.parent().unwrap()));
    }

    /// One string inside, a list of segments outside: a parent, a child, a name, a depth, and
    /// the order and containment of segments, not of characters (`a b` is no part of `a`'s
    /// tree, and `a`'s tree sorts right after `a`, before `a b`, as `/` sorts after ` `).
    #[test]
    fn a_path_behaves_as_its_segments() {
        let p = |s: &str| NodePath::parse_uri(&format!("/nodes/pth{s}")).unwrap();
        let root = NodePath::root();
        assert_eq!((root.depth(), root.name(), root.parent()), (0, None, None));
        assert_eq!(root.uri(), "/nodes/pth");
        let a = root.child("a").unwrap();
        assert_eq!(a, p("/a"));
        assert_eq!(
            (a.depth(), a.name(), a.account()),
            (1, Some("a"), Some("a"))
        );
        assert_eq!(a.parent(), Some(root.clone()));
        let ab = a.child("b").unwrap();
        assert_eq!(
            (ab.depth(), ab.name(), ab.uri().as_str()),
            (2, Some("b"), "/nodes/pth/a/b")
        );
        assert_eq!(ab.segments(), ["a", "b"]);
        assert!(a.contains(&ab) && root.contains(&ab) && ab.contains(&ab));
        assert!(!p("/a b").contains(&ab) && !a.contains(&p("/a b")) && !p("/a/b").contains(&a));
        let mut sorted = vec![p("/a b"), p("/a/b/c"), p("/a"), p("/a/b"), root.clone()];
        sorted.sort();
        assert_eq!(sorted, [root, p("/a"), p("/a/b"), p("/a/b/c"), p("/a b")]);
        assert!(a.child("x/y").is_err() && NodePath::from_segments(["a", ""]).is_err());
        assert_eq!(p("/caf\u{e9}/x").encoded(), "/nodes/pth/caf%C3%A9/x");
        assert_eq!(format!("{ab:?}"), r#"NodePath { segments: ["a", "b"] }"#);
    }
}
