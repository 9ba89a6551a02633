//! The extensions of `vaultfs serve` and what a server without them answers (404): the change
//! feed (`GET /changes`, a long poll; the caller falls back to polling), the search, the
//! account's usage.

use std::time::Duration;

use super::RemoteBackend;
use super::transport::{Req, required};
use crate::api::{ChangesPage, Result};

/// Kept under the client's read timeout, which a long poll's silence must not reach.
const MARGIN: Duration = Duration::from_secs(5);

impl RemoteBackend {
    /// See [`crate::backend::Backend::changes`]. `wait` is cut to the client's idle timeout
    /// less a margin (25 s by default): a server holds the request that long without a byte.
    pub(super) async fn feed(
        &self,
        cursor: Option<u64>,
        wait: Duration,
    ) -> Result<Option<ChangesPage>> {
        let c = &self.inner.config;
        let wait = wait.min(c.idle_timeout.saturating_sub(MARGIN));
        let mut path = format!("/changes?wait={}", wait.as_secs());
        if let Some(cursor) = cursor {
            path.push_str(&format!("&cursor={cursor}"));
        }
        let req = Req {
            waits: true,
            ..Req::get(path)
        };
        let what = req.what();
        let limit = wait + c.total_timeout;
        let call = async {
            let resp = self.send(&req).await?;
            if resp.status() == reqwest::StatusCode::NOT_FOUND {
                // No such route: a server without the feed (the public service, an older
                // vaultfs). Its body says nothing more.
                return Ok(None);
            }
            let page: ChangesPage = required(self.envelope(resp).await?, &what)?;
            Ok(Some(page))
        };
        tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
            Err(super::transport::network(format!(
                "{what}: no answer from {} within {limit:?}",
                self.inner.base
            )))
        })
    }
}

impl RemoteBackend {
    /// See [`crate::backend::Backend::usage`]: `GET /usage`; `None` from a server without it.
    pub(super) async fn account_usage(&self) -> Result<Option<crate::api::Usage>> {
        let req = Req::get("/usage".to_string());
        let what = req.what();
        let resp = self.send(&req).await?;
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        required(self.envelope(resp).await?, &what).map(Some)
    }

    /// See [`crate::backend::Backend::search`]: `GET /search` of `vaultfs serve`; a server
    /// without it (the public service) answers 404, told as [`crate::backend::no_search`].
    pub(super) async fn find(
        &self,
        dir: &crate::api::NodePath,
        query: &str,
        limit: u64,
    ) -> Result<crate::api::SearchResults> {
        let enc = |s: &str| {
            percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
        };
        let at_root = format!("/search?q={}&limit={limit}", enc(query));
        let mut path = at_root.clone();
        if !dir.is_root() {
            path.push_str(&format!("&path={}", enc(&dir.uri())));
        }
        let req = Req::get(path);
        let what = req.what();
        let resp = self.send(&req).await?;
        let no_route = resp.status() == reqwest::StatusCode::NOT_FOUND;
        match self.envelope(resp).await {
            Ok(found) => required(found, &what),
            // A folder not found is `not_found`; any other 404 is a server without the route.
            Err(e) if no_route && (dir.is_root() || e.code != "not_found") => {
                Err(crate::backend::no_search())
            }
            // A server without the route may say `not_found` too (the public service's error
            // codes map so): asked at the root, where no folder can be missing, it still
            // answers 404.
            Err(e) if no_route => {
                let resp = self.send(&Req::get(at_root)).await?;
                if resp.status() == reqwest::StatusCode::NOT_FOUND {
                    Err(crate::backend::no_search())
                } else {
                    Err(e)
                }
            }
            Err(e) => Err(e),
        }
    }
}
