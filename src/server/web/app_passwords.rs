//! The signed-in person's own app passwords (issue 50, item 2): the passwords, one per device,
//! that WebDAV clients (Finder, Explorer, davfs2, rclone) sign in to `/dav/` with, besides the
//! operator's `vaultfs user app-password add/list/revoke`.
//!
//! - GET `/web/app-passwords`: the person's app passwords (device, created, last used), each
//!   with a revoke form, and the form that adds one.
//! - POST `/web/app-passwords`: adds one; the password is shown once, in the page answering the
//!   post (never in an address, a redirect or a cookie; pages are `no-store`), with the WebDAV
//!   address of the person's account and the user name to type.
//! - POST `/web/app-passwords/revoke`: revokes the one named by the form's `name` field (names
//!   are any text, so not in the path), then back to the list.
//!
//! Both posts pass the checks of every form (`WebUser::refuse_form`); a person reaches only their
//! own app passwords, by their session's e-mail. The store's calls block (SQLite, PostgreSQL):
//! they run on blocking threads, as the backend's do.

use std::collections::HashMap;

use axum::Form;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;

use super::super::AppState;
use super::super::links;
use super::super::pin::blocking;
use super::page::{WEB_POLICY, escape, layout, respond, see_other, time};
use super::session::WebUser;
use crate::api::path::encode_segment;
use crate::api::time::ns_to_time;
use crate::api::{Error, ErrorKind, NodePath, format_time};
use crate::backend::Backend;
use crate::store::auth::{APP_PASSWORD_USE_RECORDED, AppPassword};

/// The address of the page (and of the add form).
pub const PAGE: &str = "/web/app-passwords";
const REVOKE: &str = "/web/app-passwords/revoke";

/// What the page says above the list, after a post.
enum Notice {
    /// The app password just made, shown this once.
    Added { name: String, password: String },
    /// Why a post changed nothing.
    Failed(String),
}

/// The WebDAV address of the person's account (`/dav/Acme/`), absolute when the request's base
/// is known (`--public-url`, else its `Host`, as the links of files are); `/dav/` should the
/// account not be found.
async fn dav_address(user: &WebUser) -> String {
    let account = user
        .backend
        .list(&NodePath::root(), 0, 1)
        .await
        .ok()
        .and_then(|root| root.children)
        .and_then(|c| c.into_iter().next())
        .map(|a| format!("{}/", encode_segment(&a.name)))
        .unwrap_or_default();
    format!("{}/dav/{account}", links::base().unwrap_or_default())
}

/// An instant of the store (nanoseconds) as the pages show times.
fn when(ns: i64) -> String {
    time(Some(&format_time(ns_to_time(ns))))
}

/// The row of one app password, with its revoke form.
fn row(p: &AppPassword, token: &str) -> String {
    format!(
        "<tr class=\"app-password\"><td class=\"name\">{name}</td>\
         <td class=\"modified\">{created}</td><td class=\"modified used\">{used}</td>\
         <td class=\"actions\"><form class=\"revoke\" method=\"post\" action=\"{REVOKE}\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{token}\">\
         <input type=\"hidden\" name=\"name\" value=\"{name}\">\
         <button type=\"submit\" class=\"danger\" aria-label=\"Revoke {name}\">Revoke</button>\
         </form></td></tr>",
        name = escape(&p.name),
        created = when(p.created_on),
        used = p.last_used_on.map_or_else(|| "never".to_string(), when),
        token = escape(token),
    )
}

/// The page: `notice` first, then the list and the add form (the device name typed kept in it
/// when adding failed).
async fn page(
    state: &AppState,
    user: &WebUser,
    status: StatusCode,
    notice: Option<Notice>,
    typed: &str,
) -> Response {
    let email = user.email.clone();
    let store = state.store.clone();
    let list = match blocking(move || store.list_app_passwords(&email)).await {
        Ok(l) => l,
        Err(e) => return user.error(&e),
    };
    let token = escape(&user.form_token);
    let dav = dav_address(user).await;
    let off = if state.options.webdav {
        ""
    } else {
        "<p class=\"error\" role=\"alert\">WebDAV is turned off on this server: app passwords \
         open nothing until the operator turns it on.</p>"
    };
    let notice = match notice {
        Some(Notice::Added { name, password }) => format!(
            "<section class=\"new-password\" aria-labelledby=\"new-password\">\
             <h2 id=\"new-password\">App password for {name}</h2>\
             <p>Type these into the WebDAV client of {name}. <strong>The password is shown only \
             now:</strong> copy it before leaving this page (if it is lost, revoke it and add \
             another).</p>\
             <dl class=\"facts\"><dt>Server address</dt><dd><code class=\"dav-url\">{dav}</code></dd>\
             <dt>User name</dt><dd><code class=\"user-name\">{email}</code></dd>\
             <dt>Password</dt><dd><code class=\"app-password\">{password}</code></dd></dl>\
             </section>",
            name = escape(&name),
            dav = escape(&dav),
            email = escape(&user.email),
            password = escape(&password),
        ),
        Some(Notice::Failed(why)) => {
            format!("<p class=\"error\" role=\"alert\">{}</p>", escape(&why))
        }
        None => String::new(),
    };
    let table = if list.is_empty() {
        "<p class=\"empty\">No app passwords yet.</p>".to_string()
    } else {
        format!(
            "<div class=\"table\"><table><thead><tr>\
             <th scope=\"col\" class=\"name\">Device</th>\
             <th scope=\"col\" class=\"modified\">Created</th>\
             <th scope=\"col\" class=\"modified\">Last used</th>\
             <th scope=\"col\" class=\"actions\"><span class=\"visually-hidden\">Actions</span></th>\
             </tr></thead><tbody>{}</tbody></table></div>",
            list.iter()
                .map(|p| row(p, &user.form_token))
                .collect::<String>()
        )
    };
    let body = format!(
        "{off}{notice}<p class=\"note\">WebDAV clients (Finder, Windows Explorer, GNOME Files, \
         rclone, davfs2) sign in with your e-mail address and an app password, one per device: \
         revoking one signs that device out and no other. Your account is at \
         <code>{dav}</code> (a vault: its name after it). Last used is updated at most every \
         {minutes} minutes.</p>\
         <section class=\"tools\" aria-label=\"Add\">\
         <form class=\"add-app-password\" method=\"post\" action=\"{PAGE}\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{token}\">\
         <label for=\"device-name\">New app password for the device</label>\
         <input id=\"device-name\" name=\"name\" value=\"{typed}\" maxlength=\"100\" \
         placeholder=\"Anna's Mac\" required>\
         <button type=\"submit\">Add</button></form></section>{table}",
        dav = escape(&dav),
        minutes = APP_PASSWORD_USE_RECORDED.as_secs() / 60,
        typed = escape(typed),
    );
    respond(
        status,
        WEB_POLICY,
        layout("App passwords", Some(&user.viewer()), None, &body),
    )
}

/// GET `/web/app-passwords`.
pub async fn list(State(state): State<AppState>, user: WebUser) -> Response {
    page(&state, &user, StatusCode::OK, None, "").await
}

/// The device name field of a form, as typed.
fn name_field(f: &HashMap<String, String>) -> String {
    f.get("name").cloned().unwrap_or_default()
}

/// The status and the words of a refusal of the store (a name that will not do, one taken,
/// none such), or `None` for a failure that is no fault of the form's.
fn refused(e: &Error, name: &str) -> Option<(StatusCode, String)> {
    let status = StatusCode::from_u16(e.status()).ok()?;
    let why = match (e.kind, &*e.code) {
        (ErrorKind::BadRequest, "bad_name") => {
            "A device name is 1 to 100 characters, without control characters (line breaks, \
             tabs). Nothing was added."
                .to_string()
        }
        (ErrorKind::Conflict, _) => format!(
            "You have an app password named \u{201c}{}\u{201d} already: choose another name, or \
             revoke that one first. Nothing was added.",
            name.trim()
        ),
        (ErrorKind::NotFound, _) => format!(
            "You have no app password named \u{201c}{}\u{201d} (revoked already?).",
            name.trim()
        ),
        (ErrorKind::BadRequest, _) => e.message.clone(),
        _ => return None,
    };
    Some((status, why))
}

/// POST `/web/app-passwords`: a new app password for the device `name`, shown once.
pub async fn add(
    State(state): State<AppState>,
    user: WebUser,
    headers: HeaderMap,
    Form(f): Form<HashMap<String, String>>,
) -> Response {
    if let Some(refusal) = user.refuse_form(&state, &headers, f.get("csrf").map(String::as_str)) {
        return refusal;
    }
    let name = name_field(&f);
    let (email, n, store) = (user.email.clone(), name.clone(), state.store.clone());
    match blocking(move || store.add_app_password(&email, &n)).await {
        Ok(password) => {
            log::info!(
                "{} added the app password {:?} on the web page",
                user.email,
                name.trim()
            );
            let added = Notice::Added {
                name: name.trim().to_string(),
                password,
            };
            page(&state, &user, StatusCode::OK, Some(added), "").await
        }
        Err(e) => match refused(&e, &name) {
            Some((status, why)) => {
                page(&state, &user, status, Some(Notice::Failed(why)), &name).await
            }
            None => user.error(&e),
        },
    }
}

/// POST `/web/app-passwords/revoke`: revokes the app password `name`; back to the list.
pub async fn revoke(
    State(state): State<AppState>,
    user: WebUser,
    headers: HeaderMap,
    Form(f): Form<HashMap<String, String>>,
) -> Response {
    if let Some(refusal) = user.refuse_form(&state, &headers, f.get("csrf").map(String::as_str)) {
        return refusal;
    }
    let name = name_field(&f);
    let (email, n, store) = (user.email.clone(), name.clone(), state.store.clone());
    match blocking(move || store.revoke_app_password(&email, &n)).await {
        Ok(()) => {
            log::info!(
                "{} revoked the app password {:?} on the web page",
                user.email,
                name.trim()
            );
            see_other(PAGE)
        }
        Err(e) => match refused(&e, &name) {
            Some((status, why)) => page(&state, &user, status, Some(Notice::Failed(why)), "").await,
            None => user.error(&e),
        },
    }
}
