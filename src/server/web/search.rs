//! The search box of the web interface (issue 35, item 1): every listing page has one, which
//! searches under that account, vault or folder; `/web/search/{path}?q=` shows the files
//! found. It is the same backend call as `GET /search` and `vaultfs search` (the person's
//! account only, refused for another's folder as its listing is), with the same default
//! number of hits, so the three show the same files in the same order with the same line of
//! context.

use std::collections::HashMap;

use axum::extract::Query;
use axum::http::Uri;
use axum::response::Response;

use super::page::{escape, path_href};
use super::session::WebUser;
use super::web_path;
use crate::api::file_links;
use crate::api::path::NODES_PREFIX;
use crate::api::{Node, NodePath, SearchResults};
use crate::backend::Backend;
use crate::server::search::DEFAULT_LIMIT;
use crate::store::MAX_SEARCH_LIMIT;

/// The address of the search of everything under `path`.
pub fn search_href(path: &NodePath) -> String {
    if path.is_root() {
        "/web/search".to_string()
    } else {
        path_href("/web/search", path)
    }
}

/// The search box of the container at `path`, holding `query`.
pub fn form(path: &NodePath, query: &str) -> String {
    let within = match path.segments().last() {
        Some(name) => format!("Search the text of the files in {}", escape(name)),
        None => "Search the text of your files".to_string(),
    };
    format!(
        "<form class=\"search\" role=\"search\" method=\"get\" action=\"{action}\">\
         <label for=\"search-q\">{within}</label>\
         <input id=\"search-q\" type=\"search\" name=\"q\" value=\"{query}\" required>\
         <button type=\"submit\">Search</button></form>",
        action = escape(&search_href(path)),
        query = escape(query),
    )
}

/// GET `/web/search`: search every file the person may see.
pub async fn everywhere(user: WebUser, Query(q): Query<HashMap<String, String>>) -> Response {
    results(user, NodePath::root(), q).await
}

/// GET `/web/search/{path}`: search the files under an account, vault or folder.
pub async fn within(user: WebUser, uri: Uri, Query(q): Query<HashMap<String, String>>) -> Response {
    match web_path(&uri, "/web/search") {
        Ok(path) => results(user, path, q).await,
        Err(e) => user.error(&e),
    }
}

async fn results(user: WebUser, path: NodePath, q: HashMap<String, String>) -> Response {
    let query = q.get("q").map(|s| s.trim()).unwrap_or_default().to_string();
    let limit = q
        .get("limit")
        .and_then(|l| l.parse::<u64>().ok())
        .unwrap_or(DEFAULT_LIMIT)
        .clamp(1, MAX_SEARCH_LIMIT);
    let found = if query.is_empty() {
        None
    } else {
        match user.backend.search(&path, &query, limit).await {
            Ok(found) => Some(found),
            // Another account's folder is refused as its listing is.
            Err(e) => return user.error(&e),
        }
    };
    let title = match (path.is_root(), query.is_empty()) {
        (_, true) => "Search".to_string(),
        (true, false) => format!("Search: {query}"),
        (false, false) => format!("Search in {}: {query}", path.name().unwrap_or_default()),
    };
    let body = format!(
        "{}{}",
        form(&path, &query),
        found
            .map(|f| hits(&f, &path, &query, limit))
            .unwrap_or_default()
    );
    let trail = (!path.is_root()).then_some(&path);
    user.page(&title, trail, &body)
}

/// The files found, each a link to its page with its path and line of context, and a link to
/// more when there are more.
fn hits(found: &SearchResults, path: &NodePath, query: &str, limit: u64) -> String {
    // Fewer than asked for, and more: the search stopped at its time bound.
    let stopped = found.more && (found.hits.len() as u64) < limit;
    let stopped_note = "<p class=\"note\">The search stopped at its time limit: more files may \
                        match. Narrow it with more words or from a folder.</p>";
    if found.hits.is_empty() && stopped {
        return stopped_note.to_string();
    }
    if found.hits.is_empty() {
        return "<p class=\"empty\">No file found. A file stored a moment ago is found once \
                the server has read it, in idle time.</p>"
            .to_string();
    }
    let items: String = found
        .hits
        .iter()
        .map(|h| {
            let mut node = Node::default();
            file_links(&mut node, &h.id);
            let shown = h.uri.strip_prefix(NODES_PREFIX).unwrap_or(&h.uri);
            format!(
                "<li class=\"hit\" data-id=\"{id}\"><a href=\"{link}\">{shown}</a>\
                 <p class=\"context\">{context}</p></li>",
                id = escape(&h.id),
                link = escape(node.link_uri.as_deref().unwrap_or_default()),
                shown = escape(shown),
                context = escape(&h.context),
            )
        })
        .collect();
    let more = if stopped {
        stopped_note.to_string()
    } else if found.more && limit < MAX_SEARCH_LIMIT {
        format!(
            "<p class=\"more\"><a href=\"{}?q={}&amp;limit={}\">More files</a></p>",
            escape(&search_href(path)),
            escape(&crate::api::path::encode_segment(query)),
            (limit * 2).min(MAX_SEARCH_LIMIT)
        )
    } else if found.more {
        format!("<p class=\"note\">Only the first {limit} files are shown.</p>")
    } else {
        String::new()
    };
    format!(
        "<p class=\"note\">{n} file(s) found, best first.</p><ol class=\"hits\">{items}</ol>{more}",
        n = found.hits.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::SearchHit;

    /// Fewer hits than asked for, with `more`: the search stopped at its time bound, and the
    /// page says so rather than "no file found" or a link to more of the same.
    #[test]
    fn a_search_stopped_at_its_time_limit_says_so() {
        let vault = NodePath::from_segments(["Acme", "Vault"]).unwrap();
        let hit = SearchHit {
            id: "7".into(),
            uri: "/nodes/pth/Acme/Vault/a.txt".into(),
            context: "an okapi".into(),
        };
        let page = |hits: Vec<SearchHit>, more| hits_html(hits, more, &vault);
        let none = page(vec![], true);
        assert!(none.contains("stopped at its time limit"), "{none}");
        assert!(!none.contains("No file found"), "{none}");
        let some = page(vec![hit.clone()], true);
        assert!(some.contains("stopped at its time limit") && some.contains("a.txt"));
        assert!(!some.contains("More files"), "{some}");
        assert!(page(vec![], false).contains("No file found"));
        let full = hits(
            &SearchResults {
                hits: vec![hit; 2],
                more: true,
            },
            &vault,
            "okapi",
            2,
        );
        assert!(
            full.contains("More files") && !full.contains("time limit"),
            "{full}"
        );
    }

    fn hits_html(hits: Vec<SearchHit>, more: bool, path: &NodePath) -> String {
        super::hits(&SearchResults { hits, more }, path, "okapi", 50)
    }
}
