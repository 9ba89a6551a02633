//! The OpenAPI 3.1 document of the server, served at `GET /openapi.json`.
//!
//! Every route is registered through utoipa-axum's `routes!` from the handler's own
//! `#[utoipa::path]` attribute (method, path, parameters, body, responses), so the routes the
//! server answers and the routes the document lists come from one place. The schemas below
//! describe the wire types of `crate::api` as they are serialized; `tests/openapi.rs` checks that
//! their fields are exactly the wire types' fields, and schemathesis (`tests/schema.rs`) checks the
//! server's real answers against them.

#![allow(dead_code)] // the types below exist for their schemas only

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;
use utoipa::openapi::OpenApi;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};

use super::AppState;

/// Name of the security scheme of the authenticated routes.
pub const BASIC: &str = "basic";

/// The document before the routes are added: what this is, and its version (the crate's).
pub(super) fn base() -> OpenApi {
    use utoipa::openapi::{InfoBuilder, LicenseBuilder, OpenApiBuilder};
    OpenApiBuilder::new()
        .info(
            InfoBuilder::new()
                .title("vaultfs")
                .version(env!("CARGO_PKG_VERSION"))
                .license(Some(
                    LicenseBuilder::new()
                        .name("MIT")
                        .identifier(Some("MIT"))
                        .build(),
                ))
                .build(),
        )
        .build()
}

/// The document, finished: security scheme, descriptions, and the wildcard route of axum
/// (`/nodes/pth/{*path}`) written as OpenAPI's path template (`/nodes/pth/{path}`).
pub(super) fn finish(mut doc: OpenApi) -> OpenApi {
    doc.info.description = Some(
        "The storage interface served by `vaultfs serve` (the decisions of docs/design.md \
         §2 over the interface it names). Every JSON answer is an envelope `{\"error\": {...}, \
         \"message\": ...}`; `error.success` says whether the call succeeded. Failures carry \
         `error_code` (an integer: the public service's documented codes where it has one), \
         `error_name` (snake_case), `error_text`, `instance_guid` and `status_code` (equal to \
         the HTTP status) and no `message`. Besides the statuses listed per operation, any route answers 405 \
         `method_not_allowed` to a method it does not have, any other path is 404 \
         `unknown_route`, and a JSON body over the configured limit (64 KiB) is 413 \
         `body_too_large`, all in the same envelope. The web interface's pages for people \
         (`/web/...`, where the files' browser links lead: HTML, with a session cookie) are \
         not part of this interface and not listed here."
            .to_string(),
    );
    let paths = std::mem::take(&mut doc.paths.paths);
    doc.paths.paths = paths
        .into_iter()
        .map(|(path, item)| (openapi_path(&path), item))
        .collect();
    doc.components
        .get_or_insert_with(Default::default)
        .security_schemes
        .insert(
            BASIC.to_string(),
            SecurityScheme::Http(
                Http::builder()
                    .scheme(HttpAuthScheme::Basic)
                    .description(Some(
                        "`Authorization: Basic base64(user_email \":\" delegation_token)`; the \
                         token comes from `POST /pin/auth`",
                    ))
                    .build(),
            ),
        );
    doc
}

/// An axum route path as an OpenAPI path template: `{*rest}` becomes `{rest}`.
pub fn openapi_path(axum_path: &str) -> String {
    axum_path.replace("{*", "{")
}

/// `GET /openapi.json`, serialized once when the router is built.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "meta",
    operation_id = "openapi",
    summary = "This document",
    security(()),
    responses((status = 200, description = "The OpenAPI 3.1 document of this server", content_type = "application/json", body = Object)),
)]
pub async fn document(State(state): State<AppState>) -> Response {
    let mut resp = state.openapi.as_ref().clone().into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// The serialized document, shared by the requests.
pub(super) type Document = Arc<String>;

// ----- the envelope -----

/// `error` of a successful answer.
#[derive(Serialize, ToSchema)]
pub struct Success {
    /// Always true here.
    #[schema(value_type = bool, example = true)]
    pub success: bool,
}

/// `error` of a failed answer.
#[derive(Serialize, ToSchema)]
pub struct Failure {
    /// Always false here.
    #[schema(example = false)]
    pub success: bool,
    /// An integer, as the public service documents: -520093684 not found, -1593835519
    /// authorization (log in again), -1593835510 already exists, -2147467259 malformed or
    /// missing request body parameter; any other error is -100000 minus its HTTP status.
    #[schema(example = -520093684)]
    pub error_code: i64,
    /// The error's snake_case name, e.g. `not_found`, `bad_path`, `invalid_token`, `exists`.
    #[schema(example = "not_found")]
    pub error_name: String,
    /// A sentence for people.
    pub error_text: String,
    /// The request's id, also in the server's log line for it.
    pub instance_guid: String,
    /// The HTTP status of the answer.
    #[schema(minimum = 400, maximum = 599)]
    pub status_code: u16,
}

/// Every failure: the error object and no `message`.
#[derive(Serialize, ToSchema)]
pub struct ErrorEnvelope {
    pub error: Failure,
}

/// The default success object (`DELETE`): `{"error": {"success": true}}`.
#[derive(Serialize, ToSchema)]
pub struct SuccessEnvelope {
    pub error: Success,
}

/// A node in the success envelope.
#[derive(Serialize, ToSchema)]
pub struct NodeEnvelope {
    pub error: Success,
    pub message: Node,
}

/// One file's result in a batch (`POST /nodes/batch`): the file with its new version, or why
/// it was not stored (`error.status_code`).
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub enum BatchResult {
    Stored(Box<NodeEnvelope>),
    Refused(ErrorEnvelope),
}

/// The results of a batch, one per file in the request's order.
#[derive(Serialize, ToSchema)]
pub struct BatchResults {
    pub results: Vec<BatchResult>,
}

/// A batch's results in the success envelope.
#[derive(Serialize, ToSchema)]
pub struct BatchEnvelope {
    pub error: Success,
    pub message: BatchResults,
}

/// Preview metadata in the success envelope.
#[derive(Serialize, ToSchema)]
pub struct PreviewEnvelope {
    pub error: Success,
    pub message: PreviewMeta,
}

/// The answer of `POST /pin/end`.
#[derive(Serialize, ToSchema)]
pub struct PinEndEnvelope {
    pub error: Success,
    pub message: PinEndResponse,
}

/// The answer of `POST /pin/auth`.
#[derive(Serialize, ToSchema)]
pub struct PinAuthEnvelope {
    pub error: Success,
    pub message: PinAuthResponse,
}

/// An answer of the change feed in the success envelope.
#[derive(Serialize, ToSchema)]
pub struct ChangesEnvelope {
    pub error: Success,
    pub message: ChangesPage,
}

// ----- the change feed (crate::api::ChangesPage, as serialized) -----

/// What happened to a node.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    Created,
    Version,
    Attributes,
    Deleted,
    Moved,
    Copied,
}

/// One change of the caller's account.
#[derive(Serialize, ToSchema)]
pub struct Change {
    /// The cursor just past this change.
    #[schema(minimum = 0)]
    pub cursor: u64,
    /// `created` (a file by upload step 1, or a folder), `version` (upload step 3 made new
    /// bytes current), `attributes` (time or mode set), `deleted` (with everything under it),
    /// `moved` (from `from_uri`, with everything under it), `copied` (from `from_uri`).
    pub kind: ChangeKind,
    /// `FileNodeType` or `FolderNodeType`.
    #[serde(rename = "nodeType")]
    pub node_type: NodeType,
    /// Files: the file ID.
    pub id: Option<String>,
    /// The decoded path after the change (a delete's: where it was), `/nodes/pth/...`.
    pub uri: String,
    /// Moves: the path before; copies: the source.
    pub from_uri: Option<String>,
    /// When it happened (RFC 3339, UTC).
    #[schema(format = DateTime)]
    pub at: String,
    /// Versions: the md5 (hex) of the file's current bytes when the feed was read (not when
    /// the change was made); absent once the file is gone.
    pub md5: Option<String>,
}

/// A page of the change feed.
#[derive(Serialize, ToSchema)]
pub struct ChangesPage {
    /// The cursor to ask with next.
    #[schema(minimum = 0)]
    pub cursor: u64,
    /// The cursor asked with is too old (or not of this server): changes may have been missed.
    /// Drop what is cached, list again, then follow from `cursor`.
    pub reset: bool,
    /// More changes are waiting past this page: ask again at once.
    pub more: bool,
    /// Oldest first.
    pub changes: Vec<Change>,
}

/// An answer of the search in the success envelope.
#[derive(Serialize, ToSchema)]
pub struct SearchEnvelope {
    pub error: Success,
    pub message: SearchResults,
}

/// An account's use and quota in the success envelope.
#[derive(Serialize, ToSchema)]
pub struct UsageEnvelope {
    pub error: Success,
    pub message: Usage,
}

/// What an account holds and may hold.
#[derive(Serialize, ToSchema)]
pub struct Usage {
    /// Bytes held: every version kept, of deleted files kept restorable too.
    #[schema(minimum = 0)]
    pub bytes: u64,
    /// The quota of bytes; absent where there is none.
    #[schema(minimum = 0)]
    pub max_bytes: Option<u64>,
    /// Files and folders held.
    #[schema(minimum = 0)]
    pub nodes: u64,
    /// The quota of files and folders; absent where there is none.
    #[schema(minimum = 0)]
    pub max_nodes: Option<u64>,
}

/// A file found by the search.
#[derive(Serialize, ToSchema)]
pub struct SearchHit {
    /// The file ID.
    pub id: String,
    /// The decoded path of the file now (`/nodes/pth/...`).
    pub uri: String,
    /// A line of context around the first words found.
    pub context: String,
}

/// The files found, best first.
#[derive(Serialize, ToSchema)]
pub struct SearchResults {
    pub hits: Vec<SearchHit>,
    /// More files matched than `limit`, or may have: the search ran out of its time (2 s)
    /// before it had read them all (the hits are then the ones found in it).
    pub more: bool,
}

// ----- nodes (crate::api::Node and friends, as serialized) -----

/// The wire names of `crate::api::NodeType`.
#[allow(clippy::enum_variant_names)]
#[derive(Serialize, ToSchema)]
pub enum NodeType {
    AccountNodeType,
    VaultNodeType,
    FolderNodeType,
    FileNodeType,
}

/// An account, vault, folder or file. Containers listed with `children=1` carry
/// `total_children` and `children`; files carry their ID, size, checksum and links.
#[derive(Serialize, ToSchema)]
pub struct Node {
    pub name: String,
    /// The decoded path, e.g. `/nodes/pth/Acme/My First Vault/a.txt`.
    pub uri: String,
    /// Files: the opaque file (document) ID, decimal digits.
    pub id: Option<String>,
    #[serde(rename = "nodeType")]
    pub node_type: NodeType,
    /// RFC 3339, UTC.
    #[serde(rename = "createdOn")]
    #[schema(format = DateTime)]
    pub created_on: Option<String>,
    /// RFC 3339, UTC.
    #[serde(rename = "modifiedOn")]
    #[schema(format = DateTime)]
    pub modified_on: Option<String>,
    /// Files: bytes.
    #[schema(minimum = 0)]
    pub size: Option<u64>,
    /// Files: md5 of the content, hex.
    pub md5_checksum: Option<String>,
    /// Files (an extension of ours): the mode as in `st_mode`, 0o100000 plus the nine
    /// permission bits (33188 for 0644, 33060 for 0444). Absent from servers that keep no
    /// modes.
    #[schema(minimum = 0, maximum = 33279)]
    pub mode: Option<u32>,
    /// Containers listed with `children=1`: how many children there are in all pages.
    #[schema(minimum = 0)]
    pub total_children: Option<u64>,
    /// Containers listed with `children=1`: this page of children (upload step 1: the new file).
    #[schema(no_recursion)]
    pub children: Option<Vec<Node>>,
    /// Files: the file's page of the web interface; ends in `&id=<id>`. Absolute: from the
    /// server's public URL, else the request's `Host` (relative without a usable one).
    pub link_uri: Option<String>,
    /// Files: the file's preview page, as `link_uri`; ends in `&id=<id>`.
    pub preview_link_uri: Option<String>,
    /// Files: the file's download from the web interface, as `link_uri`; ends in `&id=<id>`.
    pub download_link_uri: Option<String>,
    /// Files: `/files/id/Document/<id>`.
    pub download_uri: Option<String>,
    /// After upload step 2: where step 3 sends the bytes.
    #[serde(rename = "fileExProperties")]
    pub file_ex_properties: Option<FileExProperties>,
    /// Files asked for with `vprop=1` (an extension of ours in shape): the versions kept,
    /// newest first.
    pub versions: Option<Vec<Version>>,
    /// Vaults and folders asked for with `deleted=1` (our extension): the files deleted from
    /// it and kept restorable, most recently deleted first.
    pub deleted: Option<Vec<DeletedFile>>,
    /// Asked for with `locks=1` (our extension): the WebDAV locks that hold the node.
    pub locks: Option<Vec<Lock>>,
}

/// A WebDAV client's lock on a node (our extension). Only WebDAV clients are held back by it.
#[derive(Serialize, ToSchema)]
pub struct Lock {
    /// The node it was taken on, as a `uri`: this one, or a folder above it (for its whole
    /// tree).
    pub on: String,
    /// Whom the client signed in as.
    pub by: Option<String>,
    /// What the client says of its owner (the text of WebDAV's `owner` element).
    pub owner: Option<String>,
    /// Shared locks may be held by several clients at once; an exclusive one by one.
    pub shared: bool,
    /// When it ends unless the client renews it (RFC 3339); absent: when the client lets go.
    #[serde(rename = "expiresOn")]
    pub expires_on: Option<String>,
}

/// A file deleted from a folder and kept restorable (our extension).
#[derive(Serialize, ToSchema)]
pub struct DeletedFile {
    /// For `POST /files/id/Document/{id}/restore`.
    pub id: String,
    /// Present and true for a deleted folder, restored with its tree and the entries removed
    /// with it.
    pub folder: Option<bool>,
    /// Its name in the folder when it was deleted.
    pub name: String,
    /// Its last version's size.
    #[schema(minimum = 0)]
    pub size: u64,
    /// Its last version's md5, hex.
    pub md5_checksum: Option<String>,
    /// Its modification time (RFC 3339, UTC).
    #[serde(rename = "modifiedOn")]
    #[schema(format = DateTime)]
    pub modified_on: Option<String>,
    /// When it was deleted (RFC 3339, UTC); it is kept for the server's retention age.
    #[serde(rename = "deletedOn")]
    #[schema(format = DateTime)]
    pub deleted_on: String,
    /// Versions kept, its last one included.
    #[schema(minimum = 0)]
    pub versions: u64,
    /// Its last version: `/files/id/Document/{id}/version/{version_id}` reads it.
    pub version_id: String,
}

/// One kept version of a file.
#[derive(Serialize, ToSchema)]
pub struct Version {
    /// For `/files/id/Document/{id}/version/{version_id}`.
    pub version_id: String,
    #[schema(minimum = 0)]
    pub size: u64,
    /// md5 of that version's content, hex.
    pub md5_checksum: Option<String>,
    /// When it was stored (RFC 3339, UTC).
    #[serde(rename = "createdOn")]
    #[schema(format = DateTime)]
    pub created_on: Option<String>,
    /// The file's modification time with this version (RFC 3339, UTC).
    #[serde(rename = "modifiedOn")]
    #[schema(format = DateTime)]
    pub modified_on: Option<String>,
    /// The version the file serves now.
    pub current: bool,
}

#[derive(Serialize, ToSchema)]
pub struct FileExProperties {
    /// `/nodes/upload/{file_id}/{version_id}`
    pub upload_uri: String,
    pub version_id: Option<String>,
    /// An extension of ours: true when step 2 carried `if_match`/`if_none_match`, which step 3
    /// checks again as it commits.
    pub conflict_check: Option<bool>,
}

// ----- previews -----

#[derive(Serialize, ToSchema)]
pub enum PreviewStatus {
    Ready,
    InProgress,
    TypeNotSupported,
}

#[derive(Serialize, ToSchema)]
pub struct PreviewMeta {
    pub status: PreviewStatus,
    /// `Ready`: the whole document as PDF.
    pub pdf_uri: Option<String>,
    pub pages: Vec<PreviewPage>,
}

#[derive(Serialize, ToSchema)]
pub struct PreviewPage {
    #[schema(minimum = 1)]
    pub page_number: u32,
    pub page_uri: String,
    /// Pixels at 100%.
    pub width: u32,
    /// Pixels at 100%.
    pub height: u32,
}

// ----- pin exchange -----

#[derive(Serialize, ToSchema)]
pub struct PinEndResponse {
    /// The page where the user signs in and is shown the pin.
    pub authorization_uri: String,
}

#[derive(Serialize, ToSchema)]
pub struct PinAuthResponse {
    /// The delegation token (for `Authorization: Basic base64(email:token)`).
    pub token: String,
    /// Seconds until the token expires.
    pub expires_in: u64,
    /// The user's e-mail address.
    pub id: String,
}

// ----- request bodies -----

/// `{}`: create a folder at this path.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewFolder {}

/// Upload step 1: create files (or get existing ones) in this folder.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateFile {
    #[schema(min_items = 1)]
    pub create_file: Vec<NameEntry>,
}

#[derive(Serialize, ToSchema)]
pub struct NameEntry {
    /// A file name: not empty, not `.`/`..`, no `/` or NUL, at most 255 bytes.
    #[schema(example = "report.pdf")]
    pub name: String,
}

/// `PUT` on a node path: `{}` creates a folder there; `create_file` is upload step 1.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub enum PutNodeBody {
    NewFolder(NewFolder),
    CreateFile(CreateFile),
}

/// `POST` on a node path: exactly one key, `copy` or `move`.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub enum TransferBody {
    Copy(CopyBody),
    Move(MoveBody),
}

#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CopyBody {
    pub copy: Transfer,
}

#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MoveBody {
    #[serde(rename = "move")]
    pub move_: Transfer,
}

#[derive(Serialize, ToSchema)]
pub struct Transfer {
    /// The decoded destination path with its name, beginning with `/nodes/pth`.
    #[schema(example = "/nodes/pth/Acme/My First Vault/copy.txt")]
    pub dst_uri: String,
    /// `Fail` or `Replace`, in any letter case.
    #[schema(example = "Replace")]
    pub replace: String,
}

/// Upload step 2, or (without `length`) an update of the file's attributes alone.
#[derive(Serialize, ToSchema)]
pub struct VersionRequest {
    /// Exact size in bytes of what step 3 sends. Without it, `modifiedOn` or `mode` must be
    /// given: they are set on the file at once, with no new version.
    #[schema(minimum = 0)]
    pub length: Option<u64>,
    /// md5 of what step 3 sends, in base64 (as the public service documents) or hex; when
    /// given, step 3 checks it.
    pub md5_checksum: Option<String>,
    /// An extension of ours: the file's modification time (RFC 3339, any offset; before 1970
    /// and after 2038 too), set when the version is committed (or at once, without `length`).
    /// Without it a new version's time is that of its commit.
    #[serde(rename = "modifiedOn")]
    #[schema(format = DateTime)]
    pub modified_on: Option<String>,
    /// An extension of ours: the file's mode. With 0o100000 (as in `st_mode`) its nine
    /// permission bits are kept whole; without, only its execute bits (0o111). Without it the
    /// file keeps its bits.
    #[schema(minimum = 0, maximum = 33279)]
    pub mode: Option<u32>,
    /// An extension of ours, the conflict check: the md5 (hex or base64) of the version this
    /// upload replaces. Refused with 412 `version_conflict` here, and again atomically when step
    /// 3 commits, when another version is current by then. Only with `length`.
    pub if_match: Option<String>,
    /// An extension of ours: `*`, the file must have no content yet (a new name; an empty file
    /// counts as none), else 412 `version_conflict` as for `if_match`. Only with `length`.
    #[schema(pattern = r"^\*$")]
    pub if_none_match: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct PinEndRequest {
    #[schema(example = "vaultfs")]
    pub client_id: String,
}

#[derive(Serialize, ToSchema)]
pub struct PinAuthRequest {
    #[schema(example = "alice@example.com")]
    pub user_email: String,
    pub pin_info: PinInfo,
}

#[derive(Serialize, ToSchema)]
pub struct PinInfo {
    #[schema(example = "vaultfs")]
    pub client_id: String,
    /// The 8-digit pin shown on the authorization page (a string of digits is accepted too).
    #[schema(value_type = u64, example = 12345678)]
    pub pin: u64,
}

/// The sign-in form of the authorization page.
#[derive(Serialize, ToSchema)]
pub struct SignInForm {
    pub client_id: String,
    pub email: String,
    pub password: String,
}

/// The terms of a file sent in one request (our binary PUT, `server::whole`), as headers.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)] // a schema: read from the headers by `server::whole`
pub struct WholeTerms {
    /// Binary body: the bytes' md5 (base64 or hex); other bytes are refused
    /// (`checksum_mismatch`).
    #[param(rename = "Content-MD5")]
    content_md5: Option<String>,
    /// Binary body: store only while the file's current version has this md5, else 412
    /// `version_conflict`.
    #[param(rename = "vaultfs-if-match")]
    if_match: Option<String>,
    /// Binary body: `*`, store only while the file holds no version (or an empty one).
    #[param(rename = "vaultfs-if-none-match")]
    if_none_match: Option<String>,
    /// Binary body: the version's modification time (RFC 3339), as step 2's `modifiedOn`.
    #[param(rename = "vaultfs-modified-on")]
    modified_on: Option<String>,
    /// Binary body: the file's permission bits, as step 2's `mode`.
    #[param(rename = "vaultfs-mode")]
    mode: Option<u32>,
}
