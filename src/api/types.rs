//! The objects of the interface: nodes (file, folder, vault, account), request bodies, the pin
//! exchange and preview metadata. Unknown fields are ignored and optional ones tolerated, so the
//! client also reads the public service's richer objects.

use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::error::Result;
use super::path::{encode_segment, validate_id};
use super::time::parse_time;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeType {
    AccountNodeType,
    VaultNodeType,
    FolderNodeType,
    FileNodeType,
    /// A type this client does not know (treated as a folder when it has children).
    #[default]
    #[serde(other)]
    Unknown,
}

impl NodeType {
    pub fn is_file(self) -> bool {
        self == NodeType::FileNodeType
    }
}

/// The file object (and, with `children`, the folder object) of the interface.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Node {
    #[serde(default)]
    pub name: String,
    /// Decoded path: `/nodes/pth/Acme/My First Vault/a.txt`.
    #[serde(default)]
    pub uri: String,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient_string"
    )]
    pub id: Option<String>,
    #[serde(rename = "nodeType", default)]
    pub node_type: NodeType,
    #[serde(rename = "createdOn", default, skip_serializing_if = "Option::is_none")]
    pub created_on: Option<String>,
    #[serde(
        rename = "modifiedOn",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub modified_on: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient_number"
    )]
    pub size: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub md5_checksum: Option<String>,
    /// Files: the mode as kept (an extension of ours, see [`WHOLE_MODE`]: absent from servers
    /// that keep no modes, and then 0644).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient_number"
    )]
    pub mode: Option<u32>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient_number"
    )]
    pub total_children: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub children: Option<Vec<Node>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "absolute_link"
    )]
    pub link_uri: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "absolute_link"
    )]
    pub preview_link_uri: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "absolute_link"
    )]
    pub download_link_uri: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub download_uri: Option<String>,
    #[serde(
        rename = "fileExProperties",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub file_ex_properties: Option<FileExProperties>,
    /// Files, with `vprop=1`: the versions kept, newest first (our shape; the public service
    /// documents `vprop` without showing its fields, so a client reads none from it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub versions: Option<Vec<Version>>,
    /// Folders and vaults, with `deleted=1` (our extension): the files deleted from it that
    /// are kept restorable, most recently deleted first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deleted: Option<Vec<DeletedFile>>,
    /// With `locks=1` (our extension): the WebDAV locks that hold this node, taken on it or on
    /// a folder above it for its whole tree. A server without them says nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locks: Option<Vec<Lock>>,
}

/// A WebDAV client's lock on a node (`locks=1`; our extension): who holds it, and until when.
/// Only WebDAV clients are held back by it; the mount shows it (`user.vaultfs.lock`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lock {
    /// The node it was taken on, as a `uri` (this one, or a folder above it).
    pub on: String,
    /// Whom the client signed in as.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// What the client says of its owner (the text of WebDAV's `owner` element).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Shared locks may be held by several clients at once; an exclusive one by one.
    pub shared: bool,
    /// When it ends unless the client renews it (RFC 3339); none: when the client lets go.
    #[serde(rename = "expiresOn", default, skip_serializing_if = "Option::is_none")]
    pub expires_on: Option<String>,
}

/// A file deleted from a folder and kept restorable (`deleted=1`; our extension): restored by
/// its ID (`POST /files/id/Document/{id}/restore`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeletedFile {
    pub id: String,
    /// A deleted folder (restored with its tree), not a file.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub folder: bool,
    /// Its name in the folder when it was deleted.
    pub name: String,
    /// Its last version's size and md5.
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub md5_checksum: Option<String>,
    #[serde(
        rename = "modifiedOn",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub modified_on: Option<String>,
    #[serde(rename = "deletedOn")]
    pub deleted_on: String,
    /// Versions kept, its last one included.
    pub versions: u64,
    /// Its last version: `/files/id/Document/{id}/version/{version_id}` reads it.
    pub version_id: String,
}

/// One stored version of a file (`vprop=1`), readable by its ID.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Version {
    #[serde(deserialize_with = "required_string")]
    pub version_id: String,
    #[serde(deserialize_with = "required_number")]
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub md5_checksum: Option<String>,
    /// When it was stored.
    #[serde(rename = "createdOn", default, skip_serializing_if = "Option::is_none")]
    pub created_on: Option<String>,
    /// The file's modification time with this version.
    #[serde(
        rename = "modifiedOn",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub modified_on: Option<String>,
    /// The version the file's name serves now.
    #[serde(default)]
    pub current: bool,
}

/// Present after upload step 2: where step 3 sends the bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileExProperties {
    /// `/nodes/upload/{file_id}/{version_id}`
    #[serde(default)]
    pub upload_uri: String,
    #[serde(default, deserialize_with = "lenient_string")]
    pub version_id: Option<String>,
    /// Our extension: true when the server will refuse step 3 atomically if the step 2's
    /// `if_match`/`if_none_match` no longer holds. Absent from servers without the check (the
    /// client then compares the node itself, leaving a window: docs/design.md §5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conflict_check: Option<bool>,
}

/// A number, also when a server writes it as a string (`"size": "1024"`); null is none. Anything
/// else is an error, so garbage is still refused.
pub(crate) fn lenient_number<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: std::str::FromStr,
{
    use serde::de::Error as _;
    let text = match Option::<serde_json::Value>::deserialize(d)? {
        None | Some(serde_json::Value::Null) => return Ok(None),
        Some(serde_json::Value::Number(n)) => n.to_string(),
        Some(serde_json::Value::String(s)) => s.trim().to_string(),
        Some(other) => return Err(D::Error::custom(format!("expected a number, got {other}"))),
    };
    text.parse()
        .map(Some)
        .map_err(|_| D::Error::custom(format!("expected a number, got {text:?}")))
}

/// [`lenient_number`] for a field that must be there.
fn required_number<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: std::str::FromStr,
{
    lenient_number(d)?.ok_or_else(|| serde::de::Error::custom("expected a number, got null"))
}

/// [`lenient_string`] for a field that must be there.
fn required_string<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    lenient_string(d)?.ok_or_else(|| serde::de::Error::custom("expected an ID"))
}

/// IDs are opaque strings, but the reference types some as numbers: accept both.
fn lenient_string<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(match Option::<serde_json::Value>::deserialize(d)? {
        Some(serde_json::Value::String(s)) => Some(s),
        Some(serde_json::Value::Number(n)) => Some(n.to_string()),
        _ => None,
    })
}

impl Node {
    /// About the memory this node holds (itself, its strings and children): what a listing's
    /// bound counts (`backend::ListingLimits`).
    pub fn held_bytes(&self) -> usize {
        // A string's bytes and what the allocator keeps beside them.
        let string = |s: &String| {
            if s.capacity() == 0 {
                0
            } else {
                s.capacity() + 16
            }
        };
        let opt = |s: &Option<String>| s.as_ref().map_or(0, string);
        let ex = self.file_ex_properties.as_ref().map_or(0, |x| {
            std::mem::size_of::<FileExProperties>() + string(&x.upload_uri) + opt(&x.version_id)
        });
        std::mem::size_of::<Node>()
            + string(&self.name)
            + string(&self.uri)
            + [
                &self.id,
                &self.created_on,
                &self.modified_on,
                &self.md5_checksum,
                &self.link_uri,
                &self.preview_link_uri,
                &self.download_link_uri,
                &self.download_uri,
            ]
            .into_iter()
            .map(opt)
            .sum::<usize>()
            + ex
            + self.children.as_ref().map_or(0, |c| c.iter().map(Node::held_bytes).sum())
            // (Their strings counted as 64 bytes each: a rough bound is enough here.)
            + self.versions.as_ref().map_or(0, |v| v.len() * (std::mem::size_of::<Version>() + 64))
            + self.deleted.as_ref().map_or(0, |d| d.len() * (std::mem::size_of::<DeletedFile>() + 64))
    }

    /// The file ID: `id`, or else the value after `&id=` of one of the links (docs/design.md §2).
    pub fn file_id(&self) -> Option<String> {
        if let Some(id) = &self.id {
            return Some(id.clone());
        }
        [
            &self.link_uri,
            &self.preview_link_uri,
            &self.download_link_uri,
        ]
        .into_iter()
        .flatten()
        .find_map(|l| l.rsplit_once("&id=").map(|(_, id)| id.to_string()))
    }

    pub fn is_file(&self) -> bool {
        self.node_type.is_file()
    }

    /// Checks every ID this node and its children carry (`id` or the one after `&id=`, and the
    /// version ID of step 2) with [`validate_id`]: what a client reads from a server goes
    /// through here before it is used.
    pub fn check_ids(&self) -> Result<()> {
        let mut todo = vec![self];
        while let Some(n) = todo.pop() {
            if let Some(id) = n.file_id() {
                validate_id(&id)?;
            }
            if let Some(v) = n.version_id() {
                validate_id(&v)?;
            }
            for v in n.versions.iter().flatten() {
                validate_id(&v.version_id)?;
            }
            todo.extend(n.children.iter().flatten());
        }
        Ok(())
    }

    /// The document version ID of upload step 2's answer: `version_id`, or else the last
    /// segment of `upload_uri` (`/nodes/upload/{file_id}/{version_id}`).
    pub fn version_id(&self) -> Option<String> {
        let p = self.file_ex_properties.as_ref()?;
        p.version_id.clone().or_else(|| {
            p.upload_uri
                .rsplit('/')
                .next()
                .filter(|v| !v.is_empty())
                .map(str::to_string)
        })
    }

    pub fn modified_time(&self) -> Option<SystemTime> {
        self.modified_on.as_deref().and_then(parse_time)
    }

    pub fn created_time(&self) -> Option<SystemTime> {
        self.created_on.as_deref().and_then(parse_time)
    }
}

/// The links of a file object. Each ends in `&id=<id>` (docs/design.md §2). The three browser links are
/// pages of the server's web interface (`server::web`: a person opening one signs in with a
/// session cookie); `download_uri` is the API's download route (Authorization header).
pub fn file_links(node: &mut Node, id: &str) {
    let enc = encode_segment(id);
    node.link_uri = Some(format!("/web/file/{enc}?view=info&id={id}"));
    node.preview_link_uri = Some(format!("/web/preview/{enc}?view=preview&id={id}"));
    node.download_link_uri = Some(format!("/web/download/{enc}?download=1&id={id}"));
    node.download_uri = Some(format!("/files/id/Document/{enc}"));
}

thread_local! {
    static LINK_BASE: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f` (a serialization) with the web links of the nodes it writes made absolute against
/// `base` (`http(s)://host[:port]`, the server's for this request: `server::links`); a link
/// already absolute, or `base` None, stays as it is.
pub fn with_link_base<R>(base: Option<&str>, f: impl FnOnce() -> R) -> R {
    let before = LINK_BASE.with(|b| b.replace(base.map(str::to_string)));
    let r = f();
    LINK_BASE.with(|b| *b.borrow_mut() = before);
    r
}

fn absolute_link<S: serde::Serializer>(link: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    match link {
        Some(l) if l.starts_with('/') && !l.starts_with("//") => {
            LINK_BASE.with(|b| match &*b.borrow() {
                Some(base) => s.serialize_str(&format!("{base}{l}")),
                None => s.serialize_str(l),
            })
        }
        Some(l) => s.serialize_str(l),
        None => s.serialize_none(),
    }
}

// ----- request bodies -----

/// Upload step 1: `{"create_file": [{"name": "a.txt"}]}`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CreateFileRequest {
    pub create_file: Vec<NameEntry>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct NameEntry {
    #[serde(default)]
    pub name: Option<String>,
}

/// Upload step 2: `{"length": 123, "md5_checksum": "..."}`, with our optional file attributes
/// (`modifiedOn`, `mode`). Without `length`, the attributes alone update the file: no new
/// version, no bytes.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct VersionRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub length: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub md5_checksum: Option<String>,
    #[serde(
        rename = "modifiedOn",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub modified_on: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
    /// Our extension (the conflict check): the md5 (hex or base64) of the version this upload
    /// replaces. Step 2 and the commit of step 3 refuse it with 412 `version_conflict` when
    /// another version has become current meanwhile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub if_match: Option<String>,
    /// Our extension: `"*"`, the file must have no content yet (a new name), else 412
    /// `version_conflict` as for `if_match`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub if_none_match: Option<String>,
}

/// The media type of a batch upload's body ([`BatchFile`]).
pub const BATCH_TYPE: &str = "application/vnd.vaultfs.batch";

/// One file of our batch upload ([`EXT_BATCH_PUT`]). The request's body is the JSON array of
/// these on one line, a newline, then the files' bytes one after another, each exactly its
/// `length`. Each file is stored as a whole PUT would store it (made at `path` when absent,
/// or the file `id`), under step 2's terms: the md5 is required.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct BatchFile {
    /// The file's path, segment by segment (not percent-encoded).
    pub path: Vec<String>,
    /// The file's ID, where it has one: its bytes go to that file wherever it is now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(flatten)]
    pub terms: VersionRequest,
}

/// The answer of a batch upload: one envelope per file, in the request's order (each with its
/// own `status_code` when it failed).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BatchResults {
    pub results: Vec<super::Envelope<Node>>,
}

impl VersionRequest {
    /// The file attributes this step 2 gives (`modifiedOn`, `mode`); a time that is not RFC
    /// 3339 is `bad_parameter`.
    pub fn attrs(&self) -> Result<FileAttrs> {
        let modified = match &self.modified_on {
            Some(t) => Some(parse_time(t).ok_or_else(|| {
                super::Error::bad_request(
                    "bad_parameter",
                    format!("`modifiedOn`: `{t}` is not a time"),
                )
            })?),
            None => None,
        };
        Ok(FileAttrs {
            modified,
            mode: self.mode,
        })
    }

    /// The conflict check this step 2 asks for, from `if_match` / `if_none_match`.
    pub fn base(&self) -> Result<Base> {
        let bad = |what: &str| {
            super::Error::bad_request(
                "bad_parameter",
                format!("`{what}` must be an md5 (hex or base64), or `*` for `if_none_match`"),
            )
        };
        match (&self.if_match, &self.if_none_match) {
            (Some(_), Some(_)) => Err(super::Error::bad_request(
                "bad_parameter",
                "give `if_match` or `if_none_match`, not both",
            )),
            (Some(m), None) => super::checksum::md5_hex(m)
                .map(Base::Md5)
                .ok_or_else(|| bad("if_match")),
            (None, Some(star)) if star.trim() == "*" => Ok(Base::Absent),
            (None, Some(_)) => Err(bad("if_none_match")),
            (None, None) => Ok(Base::Any),
        }
    }

    /// Sets the fields that ask for `base`.
    pub fn set_base(&mut self, base: &Base) {
        (self.if_match, self.if_none_match) = match base {
            Base::Any => (None, None),
            Base::Absent => (None, Some("*".into())),
            Base::Md5(m) => (Some(m.clone()), None),
        };
    }
}

/// Our extension of DELETE (`Backend::delete_if`): delete the file only while its current
/// version has this md5 (hex or base64) ...
pub const DELETE_IF_MATCH: &str = "vaultfs-if-match";
/// ... or, with `*`, only while it has no version (or an empty one).
pub const DELETE_IF_NONE_MATCH: &str = "vaultfs-if-none-match";
/// Every answer of our server names in this header (a comma-separated list) the extensions a
/// client may count on; the public service sends none, and its client does without.
pub const EXTENSIONS: &str = "vaultfs-extensions";
/// ... a DELETE checks `vaultfs-if-match` / `vaultfs-if-none-match` itself (the client need not
/// look at the file first);
pub const EXT_DELETE_IF: &str = "delete-if";
/// ... a binary PUT stores a file's bytes in one request, with the terms of step 2 as headers
/// (`server::whole`).
pub const EXT_WHOLE_PUT: &str = "whole-put";
/// ... `POST /nodes/batch` stores many whole files in one request and one transaction
/// (`server::batch`, [`BatchFile`]).
pub const EXT_BATCH_PUT: &str = "batch-put";
/// What [`EXTENSIONS`] says on our server's answers.
pub const OUR_EXTENSIONS: &str = "delete-if, whole-put, batch-put";
/// A binary PUT's modification time (RFC 3339), as step 2's `modifiedOn` ...
pub const MODIFIED_ON: &str = "vaultfs-modified-on";
/// ... and its mode (the permission bits, decimal), as step 2's `mode`.
pub const MODE: &str = "vaultfs-mode";

impl Base {
    /// This condition as our header ([`DELETE_IF_MATCH`] or [`DELETE_IF_NONE_MATCH`]), for a
    /// DELETE or a whole PUT; none for [`Base::Any`].
    pub fn header(&self) -> Option<(&'static str, String)> {
        match self {
            Base::Any => None,
            Base::Absent => Some((DELETE_IF_NONE_MATCH, "*".into())),
            Base::Md5(m) => Some((DELETE_IF_MATCH, m.clone())),
        }
    }

    /// The condition of a DELETE from our headers ([`DELETE_IF_MATCH`],
    /// [`DELETE_IF_NONE_MATCH`]), read as step 2's `if_match` / `if_none_match` are.
    pub fn from_delete_headers(
        if_match: Option<&str>,
        if_none_match: Option<&str>,
    ) -> super::Result<Base> {
        VersionRequest {
            if_match: if_match.map(str::to_string),
            if_none_match: if_none_match.map(str::to_string),
            ..Default::default()
        }
        .base()
    }
}

/// What an upload expects to replace: the conflict check that keeps a later save from silently
/// erasing an earlier one by somebody else (a stale base is refused, the caller keeps its bytes).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub enum Base {
    /// No check: the upload replaces whatever is current (the interface's own rule).
    #[default]
    Any,
    /// The file must have no content yet: a name that was new to the writer.
    Absent,
    /// The current version must have this md5 (lower-case hex).
    Md5(String),
}

impl Base {
    /// Whether a file whose current content has `current` md5 (None: no version yet) satisfies
    /// it. No version and an empty one are alike (a file of step 1 shows the md5 of no bytes,
    /// and an edit over nothing loses nothing).
    pub fn holds(&self, current: Option<&str>) -> bool {
        let current = current.unwrap_or(super::checksum::EMPTY_MD5);
        match self {
            Base::Any => true,
            Base::Absent => current.eq_ignore_ascii_case(super::checksum::EMPTY_MD5),
            Base::Md5(m) => current.eq_ignore_ascii_case(m),
        }
    }

    /// The base as the versions table keeps it (`store::schema` V9): NULL, '' or the md5.
    pub fn column(&self) -> Option<&str> {
        match self {
            Base::Any => None,
            Base::Absent => Some(""),
            Base::Md5(m) => Some(m),
        }
    }

    /// [`Base::column`] read back.
    pub fn from_column(c: Option<String>) -> Base {
        match c {
            None => Base::Any,
            Some(m) if m.is_empty() => Base::Absent,
            Some(m) => Base::Md5(m),
        }
    }

    /// The error of an upload whose base no longer holds.
    pub fn conflict(&self, path: &str) -> super::Error {
        super::Error::new(
            super::ErrorKind::Precondition,
            "version_conflict",
            format!("{path} was changed by someone else since this edit began"),
        )
    }
}

/// Attributes a client sets on a file (times from `touch`, `cp -p`, `rsync -a`; `chmod +x`):
/// with a new version (step 2) or alone. `None` leaves one as it is (a new version without a
/// time is modified at its commit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FileAttrs {
    pub modified: Option<SystemTime>,
    /// The mode to keep (see [`WHOLE_MODE`]).
    pub mode: Option<u32>,
}

impl FileAttrs {
    pub fn is_empty(&self) -> bool {
        self.modified.is_none() && self.mode.is_none()
    }
}

/// The execute bits of a permission mode.
pub const EXEC_BITS: u32 = 0o111;

/// Marks a mode that carries all of a file's permission bits (`S_IFREG`, as in `st_mode`). A
/// mode without it carries its execute bits only: what stores kept before they kept the rest
/// (and what a server of that time still sends: 0644 plus those bits), read as 0644 plus them.
/// Clients that know only the execute bits read them from either.
pub const WHOLE_MODE: u32 = 0o100000;

/// A file's permission bits (of 0o777) from a mode as kept or sent (see [`WHOLE_MODE`]).
pub fn file_mode(mode: u32) -> u32 {
    if mode & WHOLE_MODE != 0 {
        mode & 0o777
    } else {
        0o644 | (mode & EXEC_BITS)
    }
}

/// Permission bits as kept and sent: all of them, marked as such.
pub fn whole_mode(perm: u32) -> u32 {
    WHOLE_MODE | (perm & 0o777)
}

/// A mode a client sent, as a store keeps it: whole, or (from a client that sends only what
/// its execute bits say) those bits alone.
pub fn kept_mode(mode: u32) -> u32 {
    if mode & WHOLE_MODE != 0 {
        whole_mode(mode)
    } else {
        mode & EXEC_BITS
    }
}

/// The object under `copy` or `move`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Transfer {
    #[serde(default)]
    pub dst_uri: Option<String>,
    #[serde(default)]
    pub replace: Option<String>,
}

/// `replace` of a copy or move, matched case-insensitively.
pub fn parse_replace(s: &str) -> Option<bool> {
    match s.to_ascii_lowercase().as_str() {
        "replace" => Some(true),
        "fail" => Some(false),
        _ => None,
    }
}

// ----- pin exchange -----

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PinEndRequest {
    #[serde(default)]
    pub client_id: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PinEndResponse {
    pub authorization_uri: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PinAuthRequest {
    #[serde(default)]
    pub user_email: Option<String>,
    #[serde(default)]
    pub pin_info: Option<PinInfo>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PinInfo {
    #[serde(default)]
    pub client_id: Option<String>,
    /// A number on the wire; a string of digits is accepted too.
    #[serde(
        default,
        deserialize_with = "lenient_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub pin: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PinAuthResponse {
    pub token: String,
    /// Seconds until the token expires.
    #[serde(deserialize_with = "required_number")]
    pub expires_in: u64,
    /// The user's ID (our server: the e-mail address).
    #[serde(
        default,
        deserialize_with = "lenient_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub id: Option<String>,
}

// ----- previews -----

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum PreviewStatus {
    Ready,
    InProgress,
    #[default]
    #[serde(other)]
    TypeNotSupported,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PreviewMeta {
    #[serde(default)]
    pub status: PreviewStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pdf_uri: Option<String>,
    #[serde(default)]
    pub pages: Vec<PreviewPage>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreviewPage {
    #[serde(deserialize_with = "required_number")]
    pub page_number: u32,
    pub page_uri: String,
    #[serde(deserialize_with = "required_number")]
    pub width: u32,
    #[serde(deserialize_with = "required_number")]
    pub height: u32,
}

/// `scale`, `max_width`, `max_height` of a page request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PageSize {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_width: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_height: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_reads_public_service_shapes() {
        let json = r#"{"name":"a.txt","uri":"/nodes/pth/A/V/a.txt","nodeType":"FileNodeType","size":3,
            "link_uri":"https://x/y?type=Document&id=4711","extra":{"k":1},"createdOn":"2024-01-02T03:04:05Z"}"#;
        let n: Node = serde_json::from_str(json).unwrap();
        assert_eq!(n.file_id().as_deref(), Some("4711"));
        assert!(n.is_file());
        assert!(n.created_time().is_some());
        // Sizes as strings, dates with an offset or in the Microsoft form.
        let n: Node = serde_json::from_str(
            r#"{"size":"1024","total_children":"3","modifiedOn":"2024-01-02T04:04:05+01:00",
                "createdOn":"/Date(1704164645000)/"}"#,
        )
        .unwrap();
        assert_eq!((n.size, n.total_children), (Some(1024), Some(3)));
        assert_eq!(n.modified_time(), n.created_time());
        assert!(n.modified_time().is_some());
        assert!(serde_json::from_str::<Node>(r#"{"size":"big"}"#).is_err());
        let n: Node = serde_json::from_str(r#"{"id": 12, "nodeType": "SomethingNew"}"#).unwrap();
        assert_eq!(n.id.as_deref(), Some("12"));
        assert_eq!(n.node_type, NodeType::Unknown);
    }

    #[test]
    fn hostile_ids_are_refused() {
        let ok: Node = serde_json::from_str(
            r#"{"id":"12","children":[{"name":"a","link_uri":"/x?y=1&id=13"}],
                "fileExProperties":{"upload_uri":"/nodes/upload/12/7"}}"#,
        )
        .unwrap();
        assert!(ok.check_ids().is_ok());
        for json in [
            r#"{"id":"../../../../tmp/x"}"#,
            r#"{"id":""}"#,
            r#"{"children":[{"children":[{"id":"a/b"}]}]}"#,
            r#"{"children":[{"link_uri":"/files?x=1&id=../../etc"}]}"#,
            r#"{"id":"1","fileExProperties":{"version_id":"1\u0000"}}"#,
        ] {
            let n: Node = serde_json::from_str(json).unwrap();
            assert_eq!(n.check_ids().unwrap_err().code, "bad_response", "{json}");
        }
    }
}
