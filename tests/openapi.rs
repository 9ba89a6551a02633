//! `GET /openapi.json`: served without a token, and it cannot drift from the server. The routes
//! it lists are exactly the routes the router answers (every documented operation reaches a
//! handler, every other method on a documented path is 405, and the router is built only from
//! documented handlers), and its schemas have exactly the fields of the wire types.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::TestServer;
use reqwest::Method;
use serde_json::{Value, json};
use vaultfs::api::{
    Change, ChangeKind, ChangesPage, CreateFileRequest, ErrorObject, FileExProperties, NameEntry,
    Node, NodeType, PinAuthRequest, PinAuthResponse, PinEndRequest, PinEndResponse, PinInfo,
    PreviewMeta, PreviewPage, PreviewStatus, Transfer, Version, VersionRequest,
};

const METHODS: [&str; 6] = ["GET", "PUT", "POST", "DELETE", "PATCH", "OPTIONS"];

fn doc() -> Value {
    serde_json::to_value(vaultfs::server::openapi()).unwrap()
}

/// (path, method) of every documented operation.
fn operations(doc: &Value) -> BTreeSet<(String, String)> {
    let mut ops = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            if METHODS.iter().any(|m| m.eq_ignore_ascii_case(method)) {
                ops.insert((path.clone(), method.to_uppercase()));
            }
        }
    }
    ops
}

/// A request path for a path template: each `{param}` becomes a plain value.
fn instantiate(template: &str) -> String {
    let mut out = String::new();
    let mut rest = template;
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        let end = start + rest[start..].find('}').unwrap();
        out.push_str(match &rest[start + 1..end] {
            "path" => "Acme",
            "page" => "1",
            _ => "12345",
        });
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn the_document_is_served_without_a_token() {
    let s = TestServer::start().await;
    let resp = reqwest::get(s.url("/openapi.json")).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["content-type"].to_str().unwrap(),
        "application/json"
    );
    let served: Value = resp.json().await.unwrap();
    assert_eq!(served, doc(), "the served document is the generated one");
    assert_eq!(served["openapi"], "3.1.0");
    assert_eq!(served["info"]["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(
        served["components"]["securitySchemes"]["basic"]["scheme"],
        "basic"
    );
}

/// Every documented operation reaches a handler (not the fallback, not 405), and every method a
/// documented path does not list is 405: the router has no route the document does not show.
#[tokio::test(flavor = "multi_thread")]
async fn documented_routes_are_exactly_the_routes_served() {
    let s = TestServer::start().await;
    let doc = doc();
    let ops = operations(&doc);
    let http = reqwest::Client::new();
    let paths: BTreeSet<&String> = ops.iter().map(|(p, _)| p).collect();
    for path in paths {
        let url = s.url(&instantiate(path));
        for method in METHODS {
            let resp = http
                .request(Method::from_bytes(method.as_bytes()).unwrap(), &url)
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            let body = resp.text().await.unwrap();
            let code = serde_json::from_str::<Value>(&body)
                .ok()
                .and_then(|v| v["error"]["error_name"].as_str().map(str::to_string));
            let documented = ops.contains(&(path.clone(), method.to_string()));
            if documented {
                assert!(
                    status != 405 && code.as_deref() != Some("unknown_route"),
                    "{method} {path} is documented but not routed: {status} {body}"
                );
            } else {
                assert_eq!(
                    (status, code.as_deref()),
                    (405, Some("method_not_allowed")),
                    "{method} {path} answers but is not documented: {body}"
                );
            }
        }
    }
    // A path the document does not have is the fallback's.
    let resp = http.get(s.url("/nodes/other")).send().await.unwrap();
    assert_eq!(resp.status(), 404);
}

/// The router is built only from `routes!` of documented handlers, one operation per handler.
#[test]
fn the_router_is_built_only_from_documented_handlers() {
    let src =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/server/mod.rs")).unwrap();
    let start = src
        .find("fn routes()")
        .expect("fn routes() in src/server/mod.rs");
    let body = &src[start..start + src[start..].find("\n}\n").unwrap()];
    for undocumented in [
        ".route(",
        ".route_service(",
        ".nest(",
        ".nest_service(",
        ".merge(",
    ] {
        assert!(
            !body.contains(undocumented),
            "routes() registers a route with `{undocumented}`, which the document does not see"
        );
    }
    assert!(
        !src[start + body.len()..].contains(".route("),
        "a route is registered outside routes()"
    );
    let mut handlers = Vec::new();
    for group in body.split("routes!(").skip(1) {
        let inner = &group[..group.find(')').unwrap()];
        handlers.extend(
            inner
                .split(',')
                .map(str::trim)
                .filter(|h| !h.is_empty())
                .map(str::to_string),
        );
    }
    let doc = doc();
    let ops = operations(&doc);
    assert_eq!(
        handlers.len(),
        ops.len(),
        "handlers {handlers:?} vs operations {ops:?}"
    );
    let ids: BTreeSet<String> = doc["paths"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|item| item.as_object().unwrap().values())
        .filter_map(|op| op["operationId"].as_str().map(str::to_string))
        .collect();
    assert_eq!(ids.len(), ops.len(), "operation IDs are unique");
}

/// Every failure an operation documents is the error envelope, and so are its schema's fields.
#[test]
fn every_documented_failure_is_the_error_envelope() {
    let doc = doc();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            for (status, resp) in op["responses"].as_object().unwrap() {
                let status: u16 = status.parse().unwrap();
                let content = resp["content"].as_object().unwrap();
                if status < 400 {
                    continue;
                }
                for (ctype, media) in content {
                    if ctype == "text/html" {
                        assert_eq!(path, "/pin/authorize", "only the page answers HTML");
                        continue;
                    }
                    assert_eq!(ctype, "application/json", "{method} {path} {status}");
                    assert_eq!(
                        media["schema"]["$ref"], "#/components/schemas/ErrorEnvelope",
                        "{method} {path} {status}"
                    );
                }
            }
            let secured = op["security"]
                .as_array()
                .is_some_and(|s| s.iter().any(|r| r.get("basic").is_some()));
            let public = path.starts_with("/pin/") || path == "/openapi.json" || path == "/healthz";
            assert_eq!(secured, !public, "{method} {path}: security");
            if secured {
                assert!(
                    op["responses"]["401"].is_object(),
                    "{method} {path} documents no 401"
                );
            }
        }
    }
}

/// The property names of a schema, following `$ref`s and `allOf`.
fn properties(doc: &Value, name: &str) -> BTreeSet<String> {
    let schema = &doc["components"]["schemas"][name];
    assert!(schema.is_object(), "no schema {name}");
    schema["properties"]
        .as_object()
        .unwrap_or_else(|| panic!("{name} has no properties"))
        .keys()
        .cloned()
        .collect()
}

fn keys(v: impl serde::Serialize) -> BTreeSet<String> {
    serde_json::to_value(v)
        .unwrap()
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect()
}

/// The schemas have exactly the fields the wire types serialize (with every optional field set).
#[test]
fn schemas_have_the_fields_of_the_wire_types() {
    let doc = doc();
    let s = || Some("x".to_string());
    let node = Node {
        name: "a".into(),
        uri: "/nodes/pth/a".into(),
        id: s(),
        node_type: NodeType::FileNodeType,
        created_on: s(),
        modified_on: s(),
        size: Some(1),
        md5_checksum: s(),
        mode: Some(0o644),
        total_children: Some(1),
        children: Some(vec![]),
        link_uri: s(),
        preview_link_uri: s(),
        download_link_uri: s(),
        download_uri: s(),
        file_ex_properties: Some(FileExProperties {
            upload_uri: "u".into(),
            version_id: s(),
            conflict_check: Some(true),
        }),
        versions: Some(vec![]),
        deleted: Some(vec![]),
        locks: Some(vec![]),
    };
    let mut expect: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    expect.insert("Node", keys(&node));
    expect.insert("FileExProperties", keys(node.file_ex_properties.unwrap()));
    expect.insert(
        "PreviewMeta",
        keys(PreviewMeta {
            status: PreviewStatus::Ready,
            pdf_uri: s(),
            pages: vec![],
        }),
    );
    expect.insert("PreviewPage", keys(PreviewPage::default()));
    expect.insert("PinEndResponse", keys(PinEndResponse::default()));
    expect.insert(
        "PinAuthResponse",
        keys(PinAuthResponse {
            id: s(),
            ..Default::default()
        }),
    );
    expect.insert(
        "VersionRequest",
        keys(VersionRequest {
            length: Some(1),
            md5_checksum: s(),
            modified_on: s(),
            mode: Some(0o755),
            if_match: s(),
            if_none_match: s(),
        }),
    );
    expect.insert(
        "Version",
        keys(Version {
            md5_checksum: s(),
            created_on: s(),
            modified_on: s(),
            ..Default::default()
        }),
    );
    expect.insert(
        "DeletedFile",
        keys(vaultfs::api::DeletedFile {
            md5_checksum: s(),
            modified_on: s(),
            folder: true,
            ..Default::default()
        }),
    );
    expect.insert(
        "Lock",
        keys(vaultfs::api::Lock {
            by: s(),
            owner: s(),
            expires_on: s(),
            ..Default::default()
        }),
    );
    expect.insert("Transfer", keys(Transfer::default()));
    expect.insert("PinEndRequest", keys(PinEndRequest::default()));
    expect.insert("PinAuthRequest", keys(PinAuthRequest::default()));
    expect.insert(
        "PinInfo",
        keys(PinInfo {
            client_id: s(),
            pin: s(),
        }),
    );
    expect.insert("NameEntry", keys(NameEntry::default()));
    expect.insert("CreateFile", keys(CreateFileRequest::default()));
    let change = Change {
        cursor: 1,
        kind: ChangeKind::Moved,
        node_type: NodeType::FileNodeType,
        id: s(),
        uri: "/nodes/pth/a".into(),
        from_uri: s(),
        at: "x".into(),
        md5: s(),
    };
    expect.insert("Change", keys(&change));
    expect.insert(
        "ChangesPage",
        keys(ChangesPage {
            changes: vec![change],
            ..Default::default()
        }),
    );
    for (name, fields) in &expect {
        assert_eq!(&properties(&doc, name), fields, "schema {name}");
    }
    // The error object: success alone, or every failure field.
    let failure = ErrorObject {
        success: false,
        error_code: Some(vaultfs::api::envelope::WireCode::Number(-1)),
        error_name: s(),
        error_text: s(),
        instance_guid: s(),
        status_code: Some(400),
    };
    assert_eq!(properties(&doc, "Failure"), keys(&failure));
    assert_eq!(
        properties(&doc, "Success"),
        keys(ErrorObject {
            success: true,
            ..Default::default()
        })
    );
    // Enumerations: every known value.
    let values = |name: &str| -> BTreeSet<String> {
        doc["components"]["schemas"][name]["enum"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect()
    };
    let node_types = [
        NodeType::AccountNodeType,
        NodeType::VaultNodeType,
        NodeType::FolderNodeType,
        NodeType::FileNodeType,
    ];
    assert_eq!(
        values("NodeType"),
        node_types
            .iter()
            .map(|t| json!(t).as_str().unwrap().to_string())
            .collect()
    );
    let kinds = [
        ChangeKind::Created,
        ChangeKind::Version,
        ChangeKind::Attributes,
        ChangeKind::Deleted,
        ChangeKind::Moved,
        ChangeKind::Copied,
    ];
    assert_eq!(
        values("ChangeKind"),
        kinds
            .iter()
            .map(|t| json!(t).as_str().unwrap().to_string())
            .collect()
    );
    let statuses = [
        PreviewStatus::Ready,
        PreviewStatus::InProgress,
        PreviewStatus::TypeNotSupported,
    ];
    assert_eq!(
        values("PreviewStatus"),
        statuses
            .iter()
            .map(|t| json!(t).as_str().unwrap().to_string())
            .collect()
    );
}

/// `docs/openapi.json` is the document the server serves, so a reader of the repository has the
/// interface without running anything. `VAULTFS_BLESS=1 cargo test --test openapi` writes it
/// anew after a change to the routes or the wire types.
#[test]
fn the_checked_in_document_is_the_served_one() {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/openapi.json");
    let served = serde_json::to_string_pretty(&doc()).unwrap() + "\n";
    if std::env::var_os("VAULTFS_BLESS").is_some() {
        std::fs::write(&file, &served).unwrap();
    }
    let kept = std::fs::read_to_string(&file).unwrap_or_default();
    assert!(
        kept == served,
        "docs/openapi.json differs from the served document: run \
         `VAULTFS_BLESS=1 cargo test --test openapi` and commit it"
    );
}
