//! The pages of accounts, vaults and folders (sorted, paged, with breadcrumbs), and the forms
//! that change them: new folder, rename, delete (after a confirmation page). Each calls the
//! same backend call as the API route for it, limited to the person's account the same way.

use std::cmp::Ordering;
use std::collections::HashMap;

use axum::Form;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Uri};
use axum::response::Response;

use super::super::AppState;
use super::page::{browse_href, escape, path_href, see_other, size, time, time_seconds};
use super::session::WebUser;
use super::web_path;
use crate::api::{Error, Node, NodePath, NodeType};
use crate::backend::Backend;

/// Rows per page unless `per_page` says otherwise, and the most it may say.
const PER_PAGE: u64 = 100;
const MAX_PER_PAGE: u64 = 1000;
/// Folders up to this many entries are sorted as asked (all fetched at once); larger ones are
/// shown by name only, a page at a time from the store.
const SORTABLE: u64 = crate::server::nodes::MAX_PER_PAGE;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Column {
    Name,
    Size,
    Modified,
}

impl Column {
    fn parse(s: Option<&str>) -> Column {
        match s {
            Some("size") => Column::Size,
            Some("modified") => Column::Modified,
            _ => Column::Name,
        }
    }
    fn key(self) -> &'static str {
        match self {
            Column::Name => "name",
            Column::Size => "size",
            Column::Modified => "modified",
        }
    }
    fn label(self) -> &'static str {
        match self {
            Column::Name => "Name",
            Column::Size => "Size",
            Column::Modified => "Modified",
        }
    }
}

/// How a listing is shown: `sort`, `order`, `page` (from 1) and `per_page` of the query.
struct View {
    sort: Column,
    descending: bool,
    page: u64,
    per_page: u64,
}

impl View {
    fn parse(q: &HashMap<String, String>) -> View {
        let number = |k: &str| q.get(k).and_then(|v| v.parse::<u64>().ok());
        View {
            sort: Column::parse(q.get("sort").map(String::as_str)),
            descending: q.get("order").is_some_and(|o| o == "desc"),
            page: number("page").unwrap_or(1).max(1),
            per_page: number("per_page")
                .unwrap_or(PER_PAGE)
                .clamp(1, MAX_PER_PAGE),
        }
    }

    /// This listing's address with some of its settings changed.
    fn href(&self, base: &str, sort: Column, descending: bool, page: u64) -> String {
        let mut q = vec![format!("sort={}", sort.key())];
        if descending {
            q.push("order=desc".into());
        }
        if page > 1 {
            q.push(format!("page={page}"));
        }
        if self.per_page != PER_PAGE {
            q.push(format!("per_page={}", self.per_page));
        }
        format!("{base}?{}", q.join("&"))
    }
}

fn is_container(n: &Node) -> bool {
    !n.is_file()
}

/// Containers first, then by the column (names as a tie-break), reversed when descending.
fn compare(a: &Node, b: &Node, sort: Column) -> Ordering {
    let by = match sort {
        Column::Name => Ordering::Equal,
        Column::Size => a.size.unwrap_or(0).cmp(&b.size.unwrap_or(0)),
        Column::Modified => a.modified_time().cmp(&b.modified_time()),
    };
    by.then_with(|| a.name.cmp(&b.name))
}

/// One page of the children of `path` as `view` asks, the container itself, and whether the
/// sort asked for could be applied.
async fn page_of(
    user: &WebUser,
    path: &NodePath,
    view: &View,
) -> Result<(Node, Vec<Node>, bool), Error> {
    let mut node = user.backend.list(path, 0, SORTABLE).await?;
    let total = node.total_children.unwrap_or(0);
    let offset = (view.page - 1).saturating_mul(view.per_page);
    if total > SORTABLE {
        // Too many to sort here: the store's own order (by name), a page at a time.
        let page = user
            .backend
            .list(path, view.page - 1, view.per_page)
            .await?;
        return Ok((node, page.children.unwrap_or_default(), false));
    }
    let mut all = node.children.take().unwrap_or_default();
    all.sort_by(|a, b| {
        is_container(b).cmp(&is_container(a)).then_with(|| {
            let o = compare(a, b, view.sort);
            if view.descending { o.reverse() } else { o }
        })
    });
    let rows = all
        .into_iter()
        .skip(offset.min(usize::MAX as u64) as usize)
        .take(view.per_page as usize)
        .collect();
    Ok((node, rows, true))
}

/// The row of one child.
fn row(user: &WebUser, child: &Node) -> String {
    let Ok(path) = NodePath::parse_uri(&child.uri) else {
        return String::new();
    };
    let token = escape(&user.form_token);
    let (link, kind) = if child.is_file() {
        (child.link_uri.clone().unwrap_or_default(), "file")
    } else {
        (browse_href(&path), "folder")
    };
    let mut actions = String::new();
    if child.is_file() {
        for (label, href) in [
            ("Preview", &child.preview_link_uri),
            ("Download", &child.download_link_uri),
        ] {
            if let Some(h) = href {
                actions.push_str(&format!(
                    "<a href=\"{}\" aria-label=\"{label} {name}\">{label}</a> ",
                    escape(h),
                    name = escape(&child.name)
                ));
            }
        }
    }
    // Accounts and vaults come with the operator's accounts: not renamed or deleted here.
    if matches!(
        child.node_type,
        NodeType::FolderNodeType | NodeType::FileNodeType
    ) {
        actions.push_str(&format!(
            "<details class=\"rename\"><summary>Rename</summary>\
             <form method=\"post\" action=\"{action}\">\
             <input type=\"hidden\" name=\"csrf\" value=\"{token}\">\
             <label>New name for {name} <input name=\"name\" value=\"{name}\" required></label>\
             <button type=\"submit\">Rename</button></form></details> \
             <a href=\"{delete}\" aria-label=\"Delete {name}\">Delete</a>",
            action = escape(&path_href("/web/rename", &path)),
            delete = escape(&path_href("/web/delete", &path)),
            name = escape(&child.name),
        ));
    }
    format!(
        "<tr class=\"{kind}\"><td class=\"name\"><a href=\"{link}\">{name}</a></td>\
         <td class=\"size\">{size}</td><td class=\"modified\">{modified}</td>\
         <td class=\"actions\">{actions}</td></tr>",
        link = escape(&link),
        name = escape(&child.name),
        size = child.size.map(size).unwrap_or_default(),
        modified = time(child.modified_on.as_deref()),
    )
}

/// The upload and new-folder forms of a vault or folder.
fn forms(user: &WebUser, path: &NodePath) -> String {
    let token = escape(&user.form_token);
    format!(
        "<section class=\"tools\" aria-label=\"Add\">\
         <form class=\"upload\" data-action=\"{upload}\" data-token=\"{token}\">\
         <div class=\"drop\"><label for=\"files\">Upload files (or drop them here)</label>\
         <input id=\"files\" type=\"file\" name=\"files\" multiple></div>\
         <button type=\"submit\">Upload</button>\
         <noscript><p>Uploading from this page needs JavaScript.</p></noscript>\
         <ul class=\"progress\" aria-live=\"polite\"></ul></form>\
         <form class=\"folder\" method=\"post\" action=\"{folder}\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{token}\">\
         <label for=\"folder-name\">New folder</label>\
         <input id=\"folder-name\" name=\"name\" required>\
         <button type=\"submit\">Create</button></form></section>",
        upload = escape(&path_href("/web/upload", path)),
        folder = escape(&path_href("/web/folder", path)),
    )
}

/// The page of the container at `path` (a file's path goes to the file's page).
async fn listing(user: WebUser, path: NodePath, q: HashMap<String, String>) -> Response {
    let view = View::parse(&q);
    let live = super::live::marker(&user, &path).await;
    let (node, rows, sorted) = match page_of(&user, &path, &view).await {
        Ok(found) => found,
        Err(e) => return user.error(&e),
    };
    if node.is_file() {
        return see_other(node.link_uri.as_deref().unwrap_or("/web/"));
    }
    let base = browse_href(&path);
    let total = node.total_children.unwrap_or(0);
    let pages = total.div_ceil(view.per_page).max(1);
    let head: String = [Column::Name, Column::Size, Column::Modified]
        .into_iter()
        .map(|c| {
            let current = sorted && c == view.sort;
            let aria = match (current, view.descending) {
                (false, _) => String::new(),
                (true, false) => " aria-sort=\"ascending\"".into(),
                (true, true) => " aria-sort=\"descending\"".into(),
            };
            let arrow = match (current, view.descending) {
                (false, _) => "",
                (true, false) => " ▲",
                (true, true) => " ▼",
            };
            // Sorting is offered only where it can be done (see `SORTABLE`).
            let label = if sorted || c == Column::Name {
                format!(
                    "<a href=\"{}\">{}{arrow}</a>",
                    escape(&view.href(&base, c, current && !view.descending, 1)),
                    c.label()
                )
            } else {
                c.label().to_string()
            };
            format!("<th scope=\"col\" class=\"{}\"{aria}>{label}</th>", c.key())
        })
        .collect();
    let body_rows: String = rows.iter().map(|c| row(&user, c)).collect();
    let empty = if rows.is_empty() {
        "<p class=\"empty\">Nothing here yet.</p>"
    } else {
        ""
    };
    let mut nav = String::new();
    if pages > 1 {
        let link = |p: u64, text: &str, rel: &str| {
            format!(
                "<a href=\"{}\" rel=\"{rel}\">{text}</a>",
                escape(&view.href(&base, view.sort, view.descending, p))
            )
        };
        nav.push_str("<nav class=\"pager\" aria-label=\"Pages of this folder\">");
        if view.page > 1 {
            nav.push_str(&link(view.page - 1, "← Previous", "prev"));
        }
        nav.push_str(&format!(
            " <span>Page {} of {pages} ({total} entries)</span> ",
            view.page
        ));
        if view.page < pages {
            nav.push_str(&link(view.page + 1, "Next →", "next"));
        }
        nav.push_str("</nav>");
    }
    let note = if sorted {
        ""
    } else {
        "<p class=\"note\">This folder is too large to sort here: it is shown by name.</p>"
    };
    let tools = match node.node_type {
        NodeType::VaultNodeType | NodeType::FolderNodeType => format!(
            "{}<p class=\"deleted-link\"><a href=\"{}\">Deleted files</a></p>",
            forms(&user, &path),
            escape(&path_href("/web/deleted", &path))
        ),
        _ => String::new(),
    };
    let title = if path.is_root() {
        "All accounts".to_string()
    } else {
        node.name.clone()
    };
    let search = super::search::form(&path, "");
    let body = format!(
        "{search}{tools}{note}<div class=\"table\"><table><thead><tr>{head}\
         <th scope=\"col\" class=\"actions\"><span class=\"visually-hidden\">Actions</span></th>\
         </tr></thead><tbody>{body_rows}</tbody></table></div>{empty}{nav}{live}"
    );
    let trail = path.parent().map(|_| path.clone());
    user.page(&title, trail.as_ref(), &body)
}

/// GET `/web/`: the accounts the person may see.
pub async fn root(user: WebUser, Query(q): Query<HashMap<String, String>>) -> Response {
    listing(user, NodePath::root(), q).await
}

/// GET `/web/browse/{path}`: an account, vault or folder.
pub async fn folder(user: WebUser, uri: Uri, Query(q): Query<HashMap<String, String>>) -> Response {
    match web_path(&uri, "/web/browse") {
        Ok(path) => listing(user, path, q).await,
        Err(e) => user.error(&e),
    }
}

/// The node path of a form's address after `prefix`, once the form is known to be this
/// person's: the refusal or the error page otherwise.
fn checked(
    state: &AppState,
    user: &WebUser,
    headers: &HeaderMap,
    f: &HashMap<String, String>,
    uri: &Uri,
    prefix: &str,
) -> Result<NodePath, Box<Response>> {
    if let Some(refusal) = user.refuse_form(state, headers, f.get("csrf").map(String::as_str)) {
        return Err(Box::new(refusal));
    }
    web_path(uri, prefix).map_err(|e| Box::new(user.error(&e)))
}

/// The name field of a form, trimmed.
fn name_field(f: &HashMap<String, String>) -> String {
    f.get("name")
        .map(|n| n.trim().to_string())
        .unwrap_or_default()
}

/// POST `/web/folder/{parent}`: a new folder named `name` in it.
pub async fn new_folder(
    State(state): State<AppState>,
    user: WebUser,
    uri: Uri,
    headers: HeaderMap,
    Form(f): Form<HashMap<String, String>>,
) -> Response {
    let parent = match checked(&state, &user, &headers, &f, &uri, "/web/folder") {
        Ok(p) => p,
        Err(refusal) => return *refusal,
    };
    let made = match parent.child(&name_field(&f)) {
        Ok(path) => user.backend.create_folder(&path).await,
        Err(e) => Err(e),
    };
    match made {
        Ok(_) => see_other(&browse_href(&parent)),
        Err(e) => user.error(&e),
    }
}

/// POST `/web/rename/{path}`: renames the file or folder to `name`, in the same folder (a name
/// taken is refused, not replaced).
pub async fn rename(
    State(state): State<AppState>,
    user: WebUser,
    uri: Uri,
    headers: HeaderMap,
    Form(f): Form<HashMap<String, String>>,
) -> Response {
    let src = match checked(&state, &user, &headers, &f, &uri, "/web/rename") {
        Ok(p) => p,
        Err(refusal) => return *refusal,
    };
    let Some(parent) = src.parent() else {
        return user.error(&Error::forbidden("the root cannot be renamed"));
    };
    let moved = match parent.child(&name_field(&f)) {
        Ok(dst) => user.backend.rename(&src, &dst, false).await,
        Err(e) => Err(e),
    };
    match moved {
        Ok(node) if node.is_file() => see_other(node.link_uri.as_deref().unwrap_or("/web/")),
        Ok(_) => see_other(&browse_href(&parent)),
        Err(e) => user.error(&e),
    }
}

/// GET `/web/delete/{path}`: asks before deleting.
pub async fn confirm_delete(user: WebUser, uri: Uri) -> Response {
    let path = match web_path(&uri, "/web/delete") {
        Ok(p) => p,
        Err(e) => return user.error(&e),
    };
    let node = match user.backend.node(&path).await {
        Ok(n) => n,
        Err(e) => return user.error(&e),
    };
    let retention = &user.backend.store().config().retention;
    let what = match (node.is_file(), retention.age) {
        (true, Some(age)) if retention.count != Some(0) => format!(
            "This file and its versions can be restored from the folder's deleted files for {} \
             days.",
            age.as_secs().div_ceil(24 * 3600)
        ),
        (false, Some(age)) if retention.count != Some(0) => format!(
            "This folder, with everything in it, can be restored from the deleted files of the \
             folder it is in for {} days.",
            age.as_secs().div_ceil(24 * 3600)
        ),
        (true, _) => "This file and its versions are deleted. This cannot be undone.".into(),
        (false, _) => "This folder is deleted with everything in it. This cannot be undone.".into(),
    };
    let back = path.parent().map(|p| browse_href(&p)).unwrap_or_default();
    let body = format!(
        "<p>Delete <strong>{name}</strong>? {what}</p>\
         <form method=\"post\" action=\"{action}\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{token}\">\
         <button type=\"submit\" class=\"danger\">Delete</button> \
         <a href=\"{back}\">Cancel</a></form>",
        name = escape(&node.name),
        action = escape(&path_href("/web/delete", &path)),
        token = escape(&user.form_token),
        back = escape(&back),
    );
    user.page(
        &format!("Delete {}?", node.name),
        path.parent().as_ref(),
        &body,
    )
}

/// POST `/web/delete/{path}`: deletes the file, or the folder with everything in it.
pub async fn delete(
    State(state): State<AppState>,
    user: WebUser,
    uri: Uri,
    headers: HeaderMap,
    Form(f): Form<HashMap<String, String>>,
) -> Response {
    let path = match checked(&state, &user, &headers, &f, &uri, "/web/delete") {
        Ok(p) => p,
        Err(refusal) => return *refusal,
    };
    match user.backend.delete(&path).await {
        Ok(()) => see_other(&path.parent().map(|p| browse_href(&p)).unwrap_or_default()),
        Err(e) => user.error(&e),
    }
}

/// GET `/web/deleted/{path}`: the files and folders deleted from a vault or folder and kept
/// restorable, each with a restore form (a folder comes back with its tree).
pub async fn deleted(user: WebUser, uri: Uri) -> Response {
    let path = match web_path(&uri, "/web/deleted") {
        Ok(p) => p,
        Err(e) => return user.error(&e),
    };
    let files = match user.backend.deleted_files(&path).await {
        Ok(f) => f,
        Err(e) => return user.error(&e),
    };
    let token = escape(&user.form_token);
    let rows: String = files
        .iter()
        .map(|f| {
            format!(
                "<tr class=\"deleted{kind}\" data-id=\"{id}\"><td class=\"name\">{name}{slash}</td>\
                 <td class=\"size\">{size}</td><td class=\"modified\">{when}</td>\
                 <td class=\"actions\">{download}<form class=\"undelete\" method=\"post\" action=\"/web/undelete/{id_seg}\">\
                 <input type=\"hidden\" name=\"csrf\" value=\"{token}\">\
                 <button type=\"submit\" aria-label=\"Restore {name}\">Restore</button></form></td></tr>",
                id = escape(&f.id),
                id_seg = crate::api::path::encode_segment(&f.id),
                name = escape(&f.name),
                kind = if f.folder { " folder" } else { "" },
                slash = if f.folder { "/" } else { "" },
                size = if f.folder { String::new() } else { size(f.size) },
                when = time_seconds(Some(&f.deleted_on)),
                download = if f.version_id.is_empty() {
                    String::new()
                } else {
                    format!(
                        "<a href=\"/web/download/{}/version/{}\" download>Download</a> ",
                        crate::api::path::encode_segment(&f.id),
                        crate::api::path::encode_segment(&f.version_id)
                    )
                },
            )
        })
        .collect();
    let retention = &user.backend.store().config().retention;
    let kept = match retention.age {
        Some(age) if retention.count != Some(0) => format!(
            "Deleted files and folders are kept for {} days, files with their versions; a restored \
             file or folder goes back to this folder under its name (or, when that is taken, with \
             \u{201c}restored\u{201d} and the time added), a folder with what was removed with it.",
            age.as_secs().div_ceil(24 * 3600)
        ),
        _ => "This server keeps no deleted files.".to_string(),
    };
    let body = if files.is_empty() {
        format!("<p class=\"note\">{kept}</p><p class=\"empty\">No deleted files here.</p>")
    } else {
        format!(
            "<p class=\"note\">{kept}</p><div class=\"table\"><table><thead><tr>\
             <th scope=\"col\" class=\"name\">Name</th><th scope=\"col\" class=\"size\">Size</th>\
             <th scope=\"col\" class=\"modified\">Deleted</th><th scope=\"col\" class=\"actions\">\
             <span class=\"visually-hidden\">Actions</span></th></tr></thead><tbody>{rows}</tbody>\
             </table></div>"
        )
    };
    let body = format!(
        "<p><a href=\"{back}\">Back to the folder</a></p>{body}",
        back = escape(&browse_href(&path))
    );
    let title = format!("Deleted from {}", path.name().unwrap_or(""));
    user.page(&title, Some(&path), &body)
}

/// POST `/web/undelete/{id}`: brings the deleted file back into its folder; on to the folder.
pub async fn undelete(
    State(state): State<AppState>,
    user: WebUser,
    axum::extract::Path(id): axum::extract::Path<String>,
    headers: HeaderMap,
    Form(f): Form<HashMap<String, String>>,
) -> Response {
    if let Some(refusal) = user.refuse_form(&state, &headers, f.get("csrf").map(String::as_str)) {
        return refusal;
    }
    match user.backend.restore_deleted(&id).await {
        Ok(node) => match NodePath::parse_uri(&node.uri).ok().and_then(|p| p.parent()) {
            Some(folder) => see_other(&browse_href(&folder)),
            None => see_other("/web/"),
        },
        Err(e) => user.error(&e),
    }
}
