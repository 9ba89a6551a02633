//! HTML for people: escaping, the security headers every page is sent with (the authorization
//! page's too), the layout of the web interface's pages and its error pages.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};

use crate::api::path::NODES_PREFIX;
use crate::api::{Error, ErrorKind, NodePath};

/// Text as HTML (element content and quoted attribute values): names are user input.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The authorization page: no script, style only inline, the form posted only here.
pub const PIN_PAGE_POLICY: &str = "default-src 'none'; style-src 'unsafe-inline'; \
     form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// The web interface: its own stylesheet, script and images only (nothing fetched from
/// elsewhere, no inline script a hostile name could smuggle in), forms and uploads only here.
pub const WEB_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; \
     base-uri 'none'";

/// A page with the headers every page gets: the policy, never framed (against clickjacking),
/// never cached (it may show a pin or someone's files), no address leaked to other sites.
/// `same-origin`, not `no-referrer`: under `no-referrer` a browser sends `Origin: null` with a
/// form post, and the origin check of the forms would refuse the page's own form.
pub fn respond(status: StatusCode, policy: &'static str, body: String) -> Response {
    let headers = [
        (header::CONTENT_SECURITY_POLICY, policy),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::CACHE_CONTROL, "no-store"),
        (header::REFERRER_POLICY, "same-origin"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    ];
    (status, headers, Html(body)).into_response()
}

/// The headers of what is no page (a download, an image, the stylesheet): never sniffed into
/// something else, cached as `cache` says.
pub fn not_a_page(resp: &mut Response, cache: &'static str) {
    let h = resp.headers_mut();
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
}

/// The percent-encoded segments of a node path after `prefix` (`/web/browse`, ...): `prefix`
/// alone for the root.
pub fn path_href(prefix: &str, path: &NodePath) -> String {
    format!("{prefix}{}", &path.encoded()[NODES_PREFIX.len()..])
}

/// The address of the page of a container (the root: `/web/`).
pub fn browse_href(path: &NodePath) -> String {
    if path.is_root() {
        "/web/".to_string()
    } else {
        path_href("/web/browse", path)
    }
}

/// Who is signed in, and the value their forms carry (see `session`).
pub struct Viewer<'a> {
    pub email: &'a str,
    pub form_token: &'a str,
}

/// A page of the web interface: header (for a signed-in viewer: who, their app passwords, sign
/// out), breadcrumbs to `trail` when given, then `body`.
pub fn layout(
    title: &str,
    viewer: Option<&Viewer>,
    trail: Option<&NodePath>,
    body: &str,
) -> String {
    let user = viewer
        .map(|v| {
            format!(
                "<div class=\"account\"><span class=\"who\">{email}</span>\
                 <a class=\"app-passwords\" href=\"/web/app-passwords\">App passwords</a>\
                 <form class=\"signout\" method=\"post\" action=\"/web/signout\">\
                 <input type=\"hidden\" name=\"csrf\" value=\"{token}\">\
                 <button type=\"submit\">Sign out</button></form></div>",
                email = escape(v.email),
                token = escape(v.form_token),
            )
        })
        .unwrap_or_default();
    let crumbs = trail.map(breadcrumbs).unwrap_or_default();
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title} · vaultfs</title><link rel=\"stylesheet\" href=\"/web/static/style.css\">\
         <script src=\"/web/static/app.js\" defer></script></head>\
         <body><header><a class=\"home\" href=\"/web/\">vaultfs</a>{user}</header>\
         <main id=\"main\">{crumbs}<h1>{title}</h1>{body}</main></body></html>\n",
        title = escape(title),
    )
}

/// Links to every container above and including `path`, the last one marked as current.
fn breadcrumbs(path: &NodePath) -> String {
    let mut items = vec![format!("<li><a href=\"/web/\">All accounts</a></li>")];
    let segments = path.segments();
    for i in 0..segments.len() {
        let Ok(up) = NodePath::from_segments(segments[..=i].iter().cloned()) else {
            break;
        };
        let current = if i + 1 == segments.len() {
            " aria-current=\"page\""
        } else {
            ""
        };
        items.push(format!(
            "<li><a href=\"{}\"{current}>{}</a></li>",
            escape(&browse_href(&up)),
            escape(segments[i])
        ));
    }
    format!(
        "<nav aria-label=\"Breadcrumb\"><ol class=\"crumbs\">{}</ol></nav>",
        items.concat()
    )
}

/// A page saying what went wrong, with the status of the error: outside the account (or, for a
/// link by ID, not there: see the module of `documents`) 403, not found 404, and so on.
pub fn error_page(err: &Error, viewer: Option<&Viewer>) -> Response {
    let status = StatusCode::from_u16(err.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let (title, text) = match err.kind {
        ErrorKind::Forbidden => (
            "Not available to you",
            "This is not in your account, or it is no longer there. Ask whoever sent you the \
             link to share it with your account."
                .to_string(),
        ),
        ErrorKind::NotFound => ("Not found", "There is nothing at this address.".to_string()),
        ErrorKind::Server => {
            log::error!("{} {}", super::super::request_id::request_id(), err.message);
            (
                "Something went wrong",
                format!(
                    "The server could not do this. Its log has the details under {}.",
                    super::super::request_id::request_id()
                ),
            )
        }
        _ => ("That did not work", err.message.clone()),
    };
    let body = format!(
        "<p class=\"error\" role=\"alert\">{}</p><p><a href=\"/web/\">Back to your files</a></p>",
        escape(&text)
    );
    respond(status, WEB_POLICY, layout(title, viewer, None, &body))
}

/// 303 to `location` (after a form, or to the sign-in page).
pub fn see_other(location: &str) -> Response {
    let mut resp = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = HeaderValue::from_str(location) {
        resp.headers_mut().insert(header::LOCATION, v);
    }
    resp
}

/// A size for people: bytes up to 1 KiB, then KiB, MiB, GiB with one decimal.
pub fn size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// An RFC 3339 time of the wire as `YYYY-MM-DD HH:MM` (UTC), the full time in `datetime`.
pub fn time(rfc3339: Option<&str>) -> String {
    time_to(rfc3339, 16)
}

/// The same to the second (versions saved a minute apart or less).
pub fn time_seconds(rfc3339: Option<&str>) -> String {
    time_to(rfc3339, 19)
}

fn time_to(rfc3339: Option<&str>, len: usize) -> String {
    let Some(t) = rfc3339 else {
        return String::new();
    };
    let short = t
        .get(..len)
        .map(|s| s.replace('T', " "))
        .unwrap_or_default();
    format!(
        "<time datetime=\"{}\">{} UTC</time>",
        escape(t),
        escape(&short)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_text_stays_text() {
        assert_eq!(
            escape("<script>alert('x')</script>&\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;"
        );
    }

    #[test]
    fn sizes() {
        assert_eq!(size(0), "0 B");
        assert_eq!(size(1023), "1023 B");
        assert_eq!(size(1536), "1.5 KiB");
        assert_eq!(size(5 * 1024 * 1024), "5.0 MiB");
    }

    #[test]
    fn breadcrumbs_encode_and_escape() {
        let p = NodePath::from_segments(["Acme", "My First Vault", "<b>&"]).unwrap();
        let html = breadcrumbs(&p);
        assert!(html.contains("href=\"/web/browse/Acme/My%20First%20Vault/%3Cb%3E%26\""));
        assert!(html.contains("&lt;b&gt;&amp;"));
        assert!(!html.contains("<b>"));
    }
}
