//! WebDAV's locks, held by the store (`store::dav`, table `dav_locks`): every server of one
//! PostgreSQL sees the same locks, a lock is granted under the writers' lock (two servers cannot
//! both grant conflicting ones), and a lock is let go of when it expires (an expired one is no
//! longer read; the next lock taken deletes it). A lock without a timeout gets
//! [`DEFAULT_TIMEOUT`], so a client that went away never holds a file for good.
//!
//! The rules are dav-server's own in-memory lock system's (`MemLs`, which litmus's `locks`
//! suite passes), over the account's live locks read from the store: a lock conflicts with an
//! exclusive lock on the path or a deep one above it, and, when deep, with one below it.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dav_server::davpath::DavPath;
use dav_server::ls::{DavLock, DavLockSystem, LsFuture};
use futures_util::FutureExt;
use xmltree::Element;

use super::PREFIX;
use crate::store::Store;
use crate::store::dav::DavLockRow;

/// The timeout of a lock taken or refreshed without one: dav-server's own bound on what a
/// client may ask for an exclusive lock (`Timeout: Infinite` or longer is cut to 10 minutes; a
/// day for a shared one).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// The lock system over the store.
#[derive(Clone)]
pub struct StoreLs {
    store: Arc<Store>,
}

impl std::fmt::Debug for StoreLs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StoreLs")
    }
}

impl StoreLs {
    pub fn new(store: Arc<Store>) -> Box<StoreLs> {
        Box::new(StoreLs { store })
    }

    /// Runs a store call on a blocking thread; `None` when it failed (logged).
    async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Store) -> crate::api::Result<T> + Send + 'static,
    ) -> Option<T> {
        let store = self.store.clone();
        match tokio::task::spawn_blocking(move || f(&store)).await {
            Ok(Ok(v)) => Some(v),
            Ok(Err(e)) => {
                log::error!("webdav locks: {e}");
                None
            }
            Err(e) => {
                log::error!("webdav locks: task failed: {e}");
                None
            }
        }
    }

    async fn live(&self, account: String) -> Option<Vec<DavLockRow>> {
        self.run(move |s| s.dav_locks(&account)).await
    }
}

/// A path as the store keys locks: its node path below `/dav` (`caller::node_path`: each
/// segment in NFC, as the store takes paths, so a Mac's NFD name and a PC's NFC one, one file,
/// are one lock), percent-encoded as `NodePath::encoded` does (as dav-server spells paths:
/// every byte but letters, digits and `-._~`), without a trailing slash. A path that is no
/// node path (not UTF-8, a name the store refuses) is kept as spelled.
fn key(path: &DavPath) -> String {
    let encoded = match super::caller::node_path(path) {
        Ok(p) => p.encoded()[crate::api::path::NODES_PREFIX.len()..].to_string(),
        Err(_) => path.as_url_string(),
    };
    match encoded.trim_end_matches('/') {
        "" => "/".to_string(),
        t => t.to_string(),
    }
}

fn segments(key: &str) -> Vec<&str> {
    key.split('/').filter(|s| !s.is_empty()).collect()
}

/// The account a path is in (its first segment), by which locks are read.
fn account(key: &str) -> String {
    segments(key)
        .first()
        .copied()
        .unwrap_or_default()
        .to_string()
}

/// `a` is `b` or one of its ancestors.
fn covers(a: &str, b: &str) -> bool {
    let (a, b) = (segments(a), segments(b));
    b.starts_with(&a)
}

fn depth(key: &str) -> usize {
    segments(key).len()
}

/// What dav-server returns: the lock with its path under the prefix, its owner parsed.
fn to_dav(row: &DavLockRow) -> DavLock {
    let mut path = DavPath::new(&format!("{PREFIX}{}", row.path))
        .or_else(|_| DavPath::new(PREFIX))
        .expect("the prefix is a path");
    let _ = path.set_prefix(PREFIX);
    DavLock {
        token: row.token.clone(),
        path: Box::new(path),
        principal: row.principal.clone(),
        owner: row
            .owner
            .as_ref()
            .and_then(|x| Element::parse(x.as_bytes()).ok())
            .map(|mut o| {
                // As dav-server names it in its answers.
                o.prefix = Some("D".to_owned());
                Box::new(o)
            }),
        timeout_at: row
            .expires_on
            .map(|ns| UNIX_EPOCH + Duration::from_nanos(ns.max(0) as u64)),
        timeout: row
            .timeout_secs
            .map(|s| Duration::from_secs(s.max(0) as u64)),
        shared: row.shared,
        deep: row.deep,
    }
}

/// The owner element as XML that parses back: dav-server gives it the prefix `D`, which a
/// client that wrote `DAV:` as the default namespace never bound; then it is written without.
fn owner_xml(o: &Element) -> Option<String> {
    let write = |e: &Element| {
        let mut xml = Vec::new();
        e.write(&mut xml).ok()?;
        Element::parse(&xml[..]).ok()?;
        String::from_utf8(xml).ok()
    };
    write(o).or_else(|| {
        let mut bare = o.clone();
        bare.prefix = None;
        write(&bare)
    })
}

/// The timeout given, or the default; and when it ends (ns).
fn timing(timeout: Option<Duration>) -> (Option<i64>, Option<i64>) {
    let t = timeout.unwrap_or(DEFAULT_TIMEOUT);
    let until = SystemTime::now() + t;
    let ns = until
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .ok();
    (Some(t.as_secs() as i64), ns)
}

/// A lock on `path` or a deep one above it that `path` may not be touched under: an exclusive
/// one not held, or (unless `shared_ok`) a shared one when none is held (dav-server's
/// `check_locks_to_path`).
fn conflict_above<'a>(
    locks: &'a [DavLockRow],
    path: &str,
    principal: Option<&str>,
    ignore_principal: bool,
    tokens: &[String],
    shared_ok: bool,
) -> Option<&'a DavLockRow> {
    let mut along: Vec<&DavLockRow> = locks.iter().filter(|l| covers(&l.path, path)).collect();
    along.sort_by_key(|l| depth(&l.path));
    let target = depth(path);
    let mut holds = false;
    let mut first_shared = None;
    for l in along {
        if depth(&l.path) < target && !l.deep {
            continue;
        }
        if tokens.contains(&l.token) && (ignore_principal || principal == l.principal.as_deref()) {
            holds = true;
        } else {
            if !l.shared {
                return Some(l);
            }
            if !shared_ok {
                first_shared.get_or_insert(l);
            }
        }
    }
    if holds { None } else { first_shared }
}

/// A lock on `path` or below that a deep operation there conflicts with (dav-server's
/// `check_locks_from_path`).
fn conflict_below<'a>(
    locks: &'a [DavLockRow],
    path: &str,
    principal: Option<&str>,
    ignore_principal: bool,
    tokens: &[String],
    shared_ok: bool,
) -> Option<&'a DavLockRow> {
    locks.iter().find(|l| {
        covers(path, &l.path)
            && (!l.shared || !shared_ok)
            && (!tokens.contains(&l.token)
                || (!ignore_principal && principal != l.principal.as_deref()))
    })
}

/// The live lock `token` on `path` or above it.
fn find<'a>(locks: &'a [DavLockRow], path: &str, token: &str) -> Option<&'a DavLockRow> {
    locks
        .iter()
        .find(|l| l.token == token && covers(&l.path, path))
}

/// What is answered when the store could not be asked: a lock that conflicts (423), never a
/// write let through unchecked.
fn unknown(path: &DavPath) -> DavLock {
    DavLock {
        token: String::new(),
        path: Box::new(path.clone()),
        principal: None,
        owner: None,
        timeout_at: None,
        timeout: None,
        shared: false,
        deep: false,
    }
}

impl DavLockSystem for StoreLs {
    fn lock(
        &'_ self,
        path: &DavPath,
        principal: Option<&str>,
        owner: Option<&Element>,
        timeout: Option<Duration>,
        shared: bool,
        deep: bool,
    ) -> LsFuture<'_, Result<DavLock, DavLock>> {
        let k = key(path);
        let owner = owner.and_then(owner_xml);
        let (timeout_secs, expires_on) = timing(timeout);
        let row = DavLockRow {
            token: format!("urn:uuid:{:032x}", rand::random::<u128>()),
            account: account(&k),
            path: k.clone(),
            principal: principal.map(str::to_string),
            owner,
            shared,
            deep,
            timeout_secs,
            expires_on,
        };
        let fallback = unknown(path);
        async move {
            let got = self
                .run(move |s| {
                    s.dav_lock(row, |live| {
                        conflict_above(live, &k, None, true, &[], shared)
                            .or_else(|| {
                                deep.then(|| conflict_below(live, &k, None, true, &[], shared))
                                    .flatten()
                            })
                            .cloned()
                    })
                })
                .await;
            match got {
                Some(Ok(row)) => Ok(to_dav(&row)),
                Some(Err(other)) => Err(to_dav(&other)),
                None => Err(fallback),
            }
        }
        .boxed()
    }

    fn unlock(&'_ self, path: &DavPath, token: &str) -> LsFuture<'_, Result<(), ()>> {
        let (k, token) = (key(path), token.to_string());
        async move {
            let live = self.live(account(&k)).await.ok_or(())?;
            let found = find(&live, &k, &token).ok_or(())?.token.clone();
            match self.run(move |s| s.dav_unlock(&[found])).await {
                Some(n) if n > 0 => Ok(()),
                _ => Err(()),
            }
        }
        .boxed()
    }

    fn refresh(
        &'_ self,
        path: &DavPath,
        token: &str,
        timeout: Option<Duration>,
    ) -> LsFuture<'_, Result<DavLock, ()>> {
        let (k, token) = (key(path), token.to_string());
        async move {
            let live = self.live(account(&k)).await.ok_or(())?;
            let found = find(&live, &k, &token).ok_or(())?.token.clone();
            let (secs, until) = timing(timeout);
            match self
                .run(move |s| s.dav_refresh_lock(&found, secs, until))
                .await
            {
                Some(Some(row)) => Ok(to_dav(&row)),
                _ => Err(()),
            }
        }
        .boxed()
    }

    fn check(
        &'_ self,
        path: &DavPath,
        principal: Option<&str>,
        ignore_principal: bool,
        deep: bool,
        submitted_tokens: &[String],
    ) -> LsFuture<'_, Result<(), DavLock>> {
        let k = key(path);
        let principal = principal.map(str::to_string);
        let tokens = submitted_tokens.to_vec();
        let fallback = unknown(path);
        async move {
            let Some(live) = self.live(account(&k)).await else {
                return Err(fallback);
            };
            let p = principal.as_deref();
            let hit =
                conflict_above(&live, &k, p, ignore_principal, &tokens, false).or_else(|| {
                    deep.then(|| conflict_below(&live, &k, p, ignore_principal, &tokens, false))
                        .flatten()
                });
            match hit {
                Some(l) => Err(to_dav(l)),
                None => Ok(()),
            }
        }
        .boxed()
    }

    fn discover(&'_ self, path: &DavPath) -> LsFuture<'_, Vec<DavLock>> {
        let k = key(path);
        async move {
            let mut live = self.live(account(&k)).await.unwrap_or_default();
            live.retain(|l| covers(&l.path, &k));
            live.sort_by_key(|l| depth(&l.path));
            live.iter().map(to_dav).collect()
        }
        .boxed()
    }

    fn delete(&'_ self, path: &DavPath) -> LsFuture<'_, Result<(), ()>> {
        let k = key(path);
        async move {
            let live = self.live(account(&k)).await.ok_or(())?;
            let gone: Vec<String> = live
                .into_iter()
                .filter(|l| covers(&k, &l.path))
                .map(|l| l.token)
                .collect();
            if gone.is_empty() {
                return Ok(());
            }
            self.run(move |s| s.dav_unlock(&gone)).await.ok_or(())?;
            Ok(())
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock(token: &str, path: &str, shared: bool, deep: bool) -> DavLockRow {
        DavLockRow {
            token: token.into(),
            account: account(path),
            path: path.into(),
            principal: Some("a@b.c".into()),
            owner: None,
            shared,
            deep,
            timeout_secs: Some(60),
            expires_on: None,
        }
    }

    #[test]
    fn conflicts_as_dav_servers_own_lock_system() {
        let locks = vec![
            lock("t1", "/A/v/dir", false, true),
            lock("t2", "/A/v/other/file", true, false),
        ];
        // Under a deep exclusive lock: refused unless its token is given.
        let hit = conflict_above(&locks, "/A/v/dir/x", None, true, &[], false);
        assert_eq!(hit.map(|l| l.token.as_str()), Some("t1"));
        assert!(conflict_above(&locks, "/A/v/dir/x", None, true, &["t1".into()], false).is_none());
        // A shallow lock covers its own path only.
        assert!(conflict_above(&locks, "/A/v/other/file/x", None, true, &[], false).is_none());
        // A shared lock: another shared one may be taken, nothing else may write.
        assert!(conflict_above(&locks, "/A/v/other/file", None, true, &[], true).is_none());
        assert!(conflict_above(&locks, "/A/v/other/file", None, true, &[], false).is_some());
        // A deep operation above a lock conflicts with it.
        assert!(conflict_below(&locks, "/A/v", None, true, &[], false).is_some());
        assert!(conflict_below(&locks, "/A/w", None, true, &[], false).is_none());
        // The principal must be the lock's when it counts.
        assert!(
            conflict_above(
                &locks,
                "/A/v/dir",
                Some("x@y.z"),
                false,
                &["t1".into()],
                false
            )
            .is_some()
        );
        assert_eq!(account("/A/v/dir"), "A");
        assert!(covers("/", "/A") && covers("/A/v", "/A/v") && !covers("/A/v", "/A/vv"));
    }
}
