//! The store as dav-server's file system: each call one call of the local backend scoped to the
//! caller's account, as the API's handlers make them (`server/nodes.rs`), so WebDAV and the API
//! cannot drift: a PUT is the three upload steps, a DELETE the API's delete, MOVE and COPY the
//! interface's move and copy.
//!
//! dav-server walks trees itself (a DELETE of a folder removes each file, then each folder; an
//! overwriting COPY or MOVE deletes the destination first; a COPY of a folder copies file by
//! file). Our store does each of those in one transaction, with the semantics of the interface
//! (a file moved or copied over a file becomes its new version, keeping its ID and history;
//! a folder copied is one change of the feed), so the walk is cut short where the request says
//! what it is ([`super::Request`]): the folder being deleted lists as empty and goes whole, the
//! file about to be replaced is not deleted but replaced by the store's own move or copy, a
//! folder copied whole lists as empty to the walk that would copy it again.
//!
//! Beside it: who calls and how errors map (`caller.rs`), a node's metadata (`meta.rs`), the
//! files opened for reading and writing (`handles.rs`).

use dav_server::davpath::DavPath;
use dav_server::fs::{
    DavDirEntry, DavFile, DavMetaData, DavProp, FsError, FsFuture, FsStream, GuardedFileSystem,
    OpenOptions, ReadDirMeta,
};
use futures_util::{FutureExt, StreamExt};

use super::caller::{DavCaller, fs_error};
use super::handles::{Reader, Writer};
use super::meta::{Meta, entries};
use crate::api::{Base, ErrorKind, NodePath};
use crate::backend::local::LocalBackend;
use crate::backend::{Backend, LIST_PAGE};
use crate::store::dav::DeadProp;
use axum::http::StatusCode;

/// The file system: stateless, everything it needs comes with each call's [`DavCaller`].
#[derive(Clone, Default)]
pub struct StoreFs;

impl GuardedFileSystem<DavCaller> for StoreFs {
    fn open<'a>(
        &'a self,
        path: &'a DavPath,
        options: OpenOptions,
        c: &'a DavCaller,
    ) -> FsFuture<'a, Box<dyn DavFile>> {
        async move {
            let p = c.path(path)?;
            if !options.write {
                let node = c.node(&p).await?;
                if !node.is_file() {
                    return Err(FsError::Forbidden);
                }
                return Ok(Box::new(Reader::new(c, &node)?) as Box<dyn DavFile>);
            }
            let existing = match c.backend.node(&p).await {
                Ok(n) => Some(n),
                Err(e) if e.kind == ErrorKind::NotFound => None,
                Err(e) => return Err(c.failed(e)),
            };
            if existing.is_none() {
                // A new file in a folder that is not there: 409 (RFC 4918 9.7.1, dav-server's
                // answer to NotFound here), as clients expect to make the folder then; not a 404
                // from the store once the body was read.
                let parent = p.parent().ok_or(FsError::Forbidden)?;
                match c.backend.node(&parent).await {
                    Ok(n) if !n.is_file() => {}
                    Ok(_) => return Err(FsError::NotFound),
                    Err(e) if e.kind == ErrorKind::NotFound => return Err(FsError::NotFound),
                    Err(e) => return Err(c.failed(e)),
                }
            }
            match &existing {
                Some(n) if !n.is_file() => return Err(FsError::Forbidden),
                Some(_) if options.create_new => return Err(FsError::Exists),
                None if !options.create && !options.create_new => return Err(FsError::NotFound),
                _ => {}
            }
            if options.append {
                // Writes at a file's end (PATCH): the store keeps whole versions only.
                return Err(FsError::NotImplemented);
            }
            if !options.truncate {
                // A LOCK of a name: the file, made empty (no version) when new, its bytes
                // untouched. (Writes into a file's middle, Content-Range, are refused: the
                // handle writes nothing.)
                let node = match existing {
                    Some(n) => n,
                    None => {
                        let (Some(folder), Some(name)) = (p.parent(), p.name()) else {
                            return Err(FsError::Forbidden);
                        };
                        c.backend
                            .create_file(&folder, name)
                            .await
                            .map_err(|e| c.failed(e))?
                    }
                };
                return Ok(Box::new(Reader::new(c, &node)?) as Box<dyn DavFile>);
            }
            let max = c.backend.store().config().max_file_size;
            if options.size.is_some_and(|n| n > max) {
                return Err(FsError::TooLarge);
            }
            // The account's room: a body that cannot fit is refused before it is read where its
            // length is announced, and once it outgrows the room where it is not (chunked);
            // the commit checks again, against what was stored meanwhile.
            let usage = c.backend.usage().await.map_err(|e| c.failed(e))?;
            let room = usage.and_then(|u| u.max_bytes.map(|m| m.saturating_sub(u.bytes)));
            if let Some(n) = options.size
                && room.is_some_and(|r| n > r)
            {
                return Err(c.failed(super::handles::over_quota(n)));
            }
            let mut base = c.request.base.clone();
            if options.create_new {
                base = Base::Absent;
            }
            // Without preconditions: the store keeps both over a version never shown.
            let keep_both = c.request.unconditional && base == Base::Any;
            let writer = c.backend.staging_writer().await.map_err(|e| c.failed(e))?;
            let f: Box<dyn DavFile> = Box::new(
                Writer::new(c, p, base, keep_both, options.size, max, writer).within(room),
            );
            Ok(f)
        }
        .boxed()
    }

    fn read_dir<'a>(
        &'a self,
        path: &'a DavPath,
        _meta: ReadDirMeta,
        c: &'a DavCaller,
    ) -> FsFuture<'a, FsStream<Box<dyn DavDirEntry>>> {
        async move {
            let p = c.path(path)?;
            if c.request.walk_cut_short(&p) {
                let none: FsStream<Box<dyn DavDirEntry>> = Box::pin(futures_util::stream::empty());
                return Ok(none);
            }
            c.listing(&p).await;
            // The first page now (a missing folder is an error of the call, not of the
            // stream); the others as the answer is written, so a folder of a million names
            // holds one page in memory, not all.
            let first = c
                .backend
                .list(&p, 0, LIST_PAGE)
                .await
                .map_err(|e| c.failed(e))?;
            if first.is_file() {
                return Err(FsError::Forbidden);
            }
            let total = first.total_children.unwrap_or(0);
            let pages = Pages {
                backend: c.backend.clone(),
                path: p,
                next: 1,
                // Pages after the first that the count calls for, and one more (names made
                // meanwhile); never more.
                left: total.div_ceil(LIST_PAGE),
                last_full: first.children.as_ref().map_or(0, Vec::len) as u64 == LIST_PAGE,
            };
            let first = futures_util::stream::iter(entries(first.children.unwrap_or_default()));
            let rest = futures_util::stream::unfold(pages, |mut pages| async move {
                if pages.left == 0 || !pages.last_full {
                    return None;
                }
                pages.left -= 1;
                let listed = pages.backend.list(&pages.path, pages.next, LIST_PAGE).await;
                pages.next += 1;
                let batch = match listed {
                    Ok(node) => {
                        let children = node.children.unwrap_or_default();
                        pages.last_full = children.len() as u64 == LIST_PAGE;
                        entries(children)
                    }
                    Err(e) => {
                        pages.last_full = false;
                        vec![Err(fs_error(&e))]
                    }
                };
                Some((futures_util::stream::iter(batch), pages))
            })
            .flatten();
            let s: FsStream<Box<dyn DavDirEntry>> = Box::pin(first.chain(rest));
            Ok(s)
        }
        .boxed()
    }

    fn metadata<'a>(
        &'a self,
        path: &'a DavPath,
        c: &'a DavCaller,
    ) -> FsFuture<'a, Box<dyn DavMetaData>> {
        async move {
            let p = c.path(path)?;
            let node = c.node(&p).await?;
            c.shown(&node).await;
            let m: Box<dyn DavMetaData> = Box::new(Meta::of(&node));
            Ok(m)
        }
        .boxed()
    }

    fn create_dir<'a>(&'a self, path: &'a DavPath, c: &'a DavCaller) -> FsFuture<'a, ()> {
        async move {
            let p = c.path(path)?;
            // A COPY of a folder, to infinite depth: the store copies the tree at once (one
            // transaction, its quota checked for all of it), and the walk stops there.
            if let Some(src) = c.request.whole_tree_copy(&p) {
                c.backend
                    .copy(&src, &p, false)
                    .await
                    .map_err(|e| c.failed(e))?;
                c.request
                    .copied
                    .store(true, std::sync::atomic::Ordering::Release);
                return Ok(());
            }
            match c.backend.create_folder(&p).await {
                Ok(_) => Ok(()),
                // MKCOL where the parent is missing is 409 (RFC 4918 9.3.1): dav-server's answer
                // to NotFound (Exists is 405, "already there", after which rclone never makes the
                // parent and every PUT below fails).
                Err(e) if e.kind == ErrorKind::NotFound => Err(FsError::NotFound),
                Err(e) => Err(c.failed(e)),
            }
        }
        .boxed()
    }

    fn remove_dir<'a>(&'a self, path: &'a DavPath, c: &'a DavCaller) -> FsFuture<'a, ()> {
        async move {
            let p = c.path(path)?;
            if !c.request.walk_cut_short(&p) {
                // A folder dav-server believes empty: it must be (a DELETE of Depth 0).
                let listed = c.backend.list(&p, 0, 1).await.map_err(|e| c.failed(e))?;
                if listed.total_children.unwrap_or(0) > 0 {
                    return Err(FsError::Exists);
                }
            }
            c.backend.delete(&p).await.map_err(|e| c.failed(e))
        }
        .boxed()
    }

    fn remove_file<'a>(&'a self, path: &'a DavPath, c: &'a DavCaller) -> FsFuture<'a, ()> {
        async move {
            let p = c.path(path)?;
            // The file an overwriting MOVE or COPY of a file replaces: the store's own move or
            // copy replaces it (a new version of it), so it is not deleted first.
            if c.request.replaces(&p) {
                let src = c.request.path.clone().ok_or(FsError::NotFound)?;
                if c.node(&src).await?.is_file() {
                    return Ok(());
                }
            }
            // A DELETE with `If-Match`: checked again by the store inside the delete.
            if c.request.is("DELETE") && c.request.path.as_ref() == Some(&p) {
                return c
                    .backend
                    .delete_if(&p, &c.request.base)
                    .await
                    .map_err(|e| c.failed(e));
            }
            c.backend.delete(&p).await.map_err(|e| c.failed(e))
        }
        .boxed()
    }

    fn rename<'a>(
        &'a self,
        from: &'a DavPath,
        to: &'a DavPath,
        c: &'a DavCaller,
    ) -> FsFuture<'a, ()> {
        async move {
            let (src, dst) = (c.path(from)?, c.path(to)?);
            c.backend
                .rename(&src, &dst, c.request.overwrite)
                .await
                .map(drop)
                .map_err(|e| c.failed(e))
        }
        .boxed()
    }

    fn copy<'a>(
        &'a self,
        from: &'a DavPath,
        to: &'a DavPath,
        c: &'a DavCaller,
    ) -> FsFuture<'a, ()> {
        async move {
            let (src, dst) = (c.path(from)?, c.path(to)?);
            // The store's copy carries the dead properties of every node it copies.
            c.backend
                .copy(&src, &dst, c.request.overwrite)
                .await
                .map(drop)
                .map_err(|e| c.failed(e))
        }
        .boxed()
    }

    fn have_props<'a>(
        &'a self,
        _path: &'a DavPath,
        _c: &'a DavCaller,
    ) -> std::pin::Pin<Box<dyn Future<Output = bool> + Send + 'a>> {
        Box::pin(std::future::ready(true))
    }

    fn patch_props<'a>(
        &'a self,
        path: &'a DavPath,
        patch: Vec<(bool, DavProp)>,
        c: &'a DavCaller,
    ) -> FsFuture<'a, Vec<(StatusCode, DavProp)>> {
        async move {
            let p = c.path(path)?;
            let dead = patch
                .iter()
                .map(|(set, prop)| (*set, dead_prop(prop)))
                .collect();
            c.backend
                .patch_dead_props(&p, dead)
                .await
                .map_err(|e| c.failed(e))?;
            Ok(patch
                .into_iter()
                .map(|(_, mut prop)| {
                    prop.xml = None;
                    (StatusCode::OK, prop)
                })
                .collect())
        }
        .boxed()
    }

    fn get_props<'a>(
        &'a self,
        path: &'a DavPath,
        do_content: bool,
        c: &'a DavCaller,
    ) -> FsFuture<'a, Vec<DavProp>> {
        async move {
            let p = c.path(path)?;
            let props = c.backend.dead_props(&p).await.map_err(|e| c.failed(e))?;
            Ok(props.into_iter().map(|d| dav_prop(d, do_content)).collect())
        }
        .boxed()
    }

    fn get_prop<'a>(
        &'a self,
        path: &'a DavPath,
        prop: DavProp,
        c: &'a DavCaller,
    ) -> FsFuture<'a, Vec<u8>> {
        async move {
            let p = c.path(path)?;
            let want = dead_prop(&prop);
            let props = c.backend.dead_props(&p).await.map_err(|e| c.failed(e))?;
            props
                .into_iter()
                .find(|d| d.namespace == want.namespace && d.name == want.name)
                .and_then(|d| d.xml)
                .ok_or(FsError::NotFound)
        }
        .boxed()
    }

    fn get_quota<'a>(&'a self, c: &'a DavCaller) -> FsFuture<'a, (u64, Option<u64>)> {
        async move {
            match c.backend.usage().await.map_err(|e| c.failed(e))? {
                Some(u) => Ok((u.bytes, u.max_bytes)),
                None => Err(FsError::NotImplemented),
            }
        }
        .boxed()
    }
}

/// The pages of a listing still to fetch, as dav-server reads the entries.
struct Pages {
    backend: LocalBackend,
    path: NodePath,
    next: u64,
    left: u64,
    /// The page before was full: there may be more.
    last_full: bool,
}

/// dav-server's property as the store keeps it.
fn dead_prop(p: &DavProp) -> DeadProp {
    DeadProp {
        namespace: p.namespace.clone().unwrap_or_default(),
        name: p.name.clone(),
        prefix: p.prefix.clone(),
        xml: p.xml.clone(),
    }
}

/// The store's property for dav-server, its value only when asked for.
fn dav_prop(d: DeadProp, content: bool) -> DavProp {
    DavProp {
        name: d.name,
        prefix: d.prefix,
        namespace: (!d.namespace.is_empty()).then_some(d.namespace),
        xml: if content { d.xml } else { None },
    }
}
