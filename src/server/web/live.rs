//! A folder's page follows the change feed (issue 32, item 3): the page carries the feed's
//! cursor from before its listing was read, and its script long-polls `/web/changes/{folder}`
//! (the session's account, as every page) and reloads the page when a change touches what it
//! shows: an entry of the folder, the folder itself or one above it, or a reset. A reload
//! waits while an upload runs or a form field holds text.

use std::collections::HashMap;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::Uri;
use axum::response::{IntoResponse, Response};

use super::super::AppState;
use super::super::conn::Stopping;
use super::super::reply::{ApiError, ok};
use super::page::{escape, path_href};
use super::session::WebUser;
use super::web_path;
use crate::api::{Change, Error, NodePath};

/// How long a page's poll waits for a change.
const WAIT: Duration = Duration::from_secs(25);

/// The element that tells the page's script where and from which cursor to follow `path`
/// (nothing for the accounts' page, or when the cursor cannot be read: the page is still
/// shown). Read before the listing, so that no change falls between the two.
pub(super) async fn marker(user: &WebUser, path: &NodePath) -> String {
    if path.is_root() {
        return String::new();
    }
    match user.backend.changes_page(None, Duration::ZERO, 1).await {
        Ok(page) => format!(
            "<div id=\"live\" hidden data-changes=\"{}\" data-cursor=\"{}\"></div>",
            escape(&path_href("/web/changes", path)),
            page.cursor
        ),
        Err(e) => {
            log::debug!("no change cursor for the page of {path}: {e}");
            String::new()
        }
    }
}

/// Whether `c` changes what the page of `folder` shows.
fn touches(folder: &NodePath, c: &Change) -> bool {
    [Some(&c.uri), c.from_uri.as_ref()]
        .into_iter()
        .flatten()
        .filter_map(|uri| NodePath::parse_uri(uri).ok())
        .any(|p| p.parent().as_ref() == Some(folder) || p.contains(folder))
}

/// GET `/web/changes/{folder}?cursor=N`: waits up to 25 s for changes of the account after
/// `cursor`; answers `{"cursor", "changed"}` (changed: the page of `folder` is to be read
/// again). Counted among the person's long polls (`--max-waits-per-user`).
pub async fn changes(
    State(state): State<AppState>,
    user: WebUser,
    stopping: Stopping,
    uri: Uri,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let answer = async {
        let folder = web_path(&uri, "/web/changes")?;
        let cursor = super::super::nodes::number(&q, "cursor")?
            .ok_or_else(|| Error::bad_request("missing_parameter", "`cursor` is needed"))?;
        let _slot = state.limits.wait(user.user_id)?;
        let page = tokio::select! {
            page = user.backend.changes_page(Some(cursor), WAIT, 1000) => page?,
            () = stopping.stopped() => Default::default(),
        };
        let changed = page.reset || page.changes.iter().any(|c| touches(&folder, c));
        let cursor = if page.reset || !page.changes.is_empty() {
            page.cursor
        } else {
            cursor
        };
        Ok::<_, Error>(ok(
            serde_json::json!({ "cursor": cursor, "changed": changed }),
        ))
    };
    answer.await.unwrap_or_else(|e| ApiError(e).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ChangeKind, NodeType};

    #[test]
    fn a_page_is_touched_by_its_entries_and_what_holds_it() {
        let p = |s: &str| NodePath::parse_uri(&format!("/nodes/pth{s}")).unwrap();
        let folder = p("/A/V/docs");
        let change = |uri: &str, from: Option<&str>| Change {
            cursor: 1,
            kind: ChangeKind::Moved,
            node_type: NodeType::FileNodeType,
            id: None,
            uri: p(uri).uri(),
            from_uri: from.map(|f| p(f).uri()),
            at: String::new(),
            md5: None,
        };
        assert!(touches(&folder, &change("/A/V/docs/a.txt", None)));
        assert!(touches(
            &folder,
            &change("/A/V/x.txt", Some("/A/V/docs/x.txt"))
        ));
        assert!(touches(&folder, &change("/A/V/docs", None)));
        assert!(touches(&folder, &change("/A/V2", Some("/A/V"))));
        assert!(!touches(&folder, &change("/A/V/docs/sub/deep.txt", None)));
        assert!(!touches(&folder, &change("/A/V/other.txt", None)));
    }
}
