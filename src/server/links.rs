//! The web links the server sends (`link_uri`, `preview_link_uri`, `download_link_uri`) as
//! absolute addresses (issue 47, item 6): the store makes them relative (`/web/file/ID?...`),
//! and every JSON answer (`reply::json`) is written with this request's base in front of them:
//! `--public-url` when set (the name users reach the server by, behind a proxy); else the
//! request's own scheme and `Host` (a trusted proxy's `X-Forwarded-Proto` / `X-Forwarded-Host`
//! or `Forwarded`'s `proto=` / `host=`, when the connection comes from one); else, without a
//! sane host, they stay relative. A client's `Host` only shapes the answer to that client.

use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::Response;

use super::conn::Peer;
use super::proxy::{self, Cidr};

tokio::task_local! {
    static BASE: Option<String>;
}

/// What the base of a request's links is made from (the server's options).
#[derive(Debug, Clone)]
pub struct LinkBase {
    pub public_url: Option<String>,
    pub trusted_proxies: Vec<Cidr>,
}

/// The base of the links of the request being handled (None: outside one, or none known).
pub fn base() -> Option<String> {
    BASE.try_with(Clone::clone).ok().flatten()
}

/// Runs `f` with [`base`] saying `base`.
pub async fn scope<F: Future>(base: Option<String>, f: F) -> F::Output {
    BASE.scope(base, f).await
}

/// The middleware: the request's base, for the answer's links.
pub async fn absolute_links(
    State(opts): State<Arc<LinkBase>>,
    req: Request,
    next: Next,
) -> Response {
    let peer = req.extensions().get::<Peer>().copied();
    let from_proxy = peer.is_some_and(|p| {
        let ip: IpAddr = p.remote.ip().to_canonical();
        opts.trusted_proxies.iter().any(|c| c.contains(ip))
    });
    let authority = req.uri().authority().map(|a| a.as_str().to_string());
    let base = base_of(
        opts.public_url.as_deref(),
        req.headers(),
        from_proxy,
        authority,
    );
    scope(base, next.run(req)).await
}

/// The base for a request with `headers` (`from_proxy`: it came from a trusted proxy;
/// `authority`: its URI's, as HTTP/2 sends it instead of `Host`).
pub fn base_of(
    public_url: Option<&str>,
    headers: &HeaderMap,
    from_proxy: bool,
    authority: Option<String>,
) -> Option<String> {
    if let Some(u) = public_url {
        return Some(u.trim_end_matches('/').to_string());
    }
    let (mut scheme, mut host) = ("http".to_string(), None);
    if from_proxy {
        if let Some(p) = proxy::forwarded_proto(headers) {
            scheme = p;
        }
        host = proxy::last_hop(headers, "x-forwarded-host")
            .or_else(|| proxy::forwarded(headers, "host"));
    }
    let host = host
        .or_else(|| headers.get(header::HOST)?.to_str().ok().map(str::to_string))
        .or(authority)?;
    (matches!(scheme.as_str(), "http" | "https") && sane_host(&host))
        .then(|| format!("{scheme}://{}", host.to_ascii_lowercase()))
}

/// `name[:port]` or `[v6]:port`: letters, digits, `.`, `-`, `:` and brackets only, a host a URL
/// parses as it is (no user, no path), a numeric port.
fn sane_host(h: &str) -> bool {
    if h.is_empty()
        || h.len() > 262
        || !h
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
    {
        return false;
    }
    let Ok(url) = reqwest::Url::parse(&format!("http://{h}/")) else {
        return false;
    };
    url.host_str().is_some_and(|s| !s.is_empty())
        && url.username().is_empty()
        && url.path() == "/"
        && h.rsplit(']')
            .next()
            .and_then(|after| after.rsplit_once(':'))
            .is_none_or(|(_, port)| !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn the_base_is_the_public_url_else_a_sane_host() {
        let h = headers(&[("host", "vault.example:8080")]);
        assert_eq!(
            base_of(Some("https://files.example/"), &h, false, None).as_deref(),
            Some("https://files.example")
        );
        assert_eq!(
            base_of(None, &h, false, None).as_deref(),
            Some("http://vault.example:8080")
        );
        for bad in ["a b", "x/y", "u@h", "h:port", "h\u{1b}", "", "h:1:2"] {
            let h = HeaderMap::from_iter([(
                header::HOST,
                bad.parse()
                    .unwrap_or(axum::http::HeaderValue::from_static("a b")),
            )]);
            assert_eq!(base_of(None, &h, false, None), None, "{bad:?}");
        }
        assert_eq!(
            base_of(None, &headers(&[("host", "[::1]:80")]), false, None).as_deref(),
            Some("http://[::1]:80")
        );
        assert_eq!(base_of(None, &HeaderMap::new(), false, None), None);
    }

    #[test]
    fn only_a_trusted_proxy_names_the_scheme_and_host() {
        let h = headers(&[
            ("host", "10.0.0.5:8080"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "files.example"),
        ]);
        assert_eq!(
            base_of(None, &h, true, None).as_deref(),
            Some("https://files.example")
        );
        assert_eq!(
            base_of(None, &h, false, None).as_deref(),
            Some("http://10.0.0.5:8080")
        );
        let h = headers(&[
            ("host", "10.0.0.5"),
            (
                "forwarded",
                "for=1.2.3.4;proto=https;host=\"files.example\"",
            ),
        ]);
        assert_eq!(
            base_of(None, &h, true, None).as_deref(),
            Some("https://files.example")
        );
        let h = headers(&[("host", "h"), ("x-forwarded-proto", "javascript")]);
        assert_eq!(base_of(None, &h, true, None), None);
    }
}
