//! The three upload steps: the file created (step 1), a pending version opened (step 2), and the
//! bytes committed (step 3), in group commits: step 3s that arrive while one commits are
//! committed together, one savepoint each.

use std::sync::{Arc, Mutex};

use super::limits::{check_held, check_quota};
use super::resolve::{
    Folders, VersionRow, file_and_path, file_path_version, find_child, find_child_and_held,
    require_folder, row, split,
};
use super::retention::prune_versions;
use super::{NodeKind, NodeRow, insert_node, touch};
use crate::api::{
    Base, ChangeKind, Error, FileAttrs, FileExProperties, Node, NodePath, Result, kept_mode,
};
use crate::store::blobs::{BlobWriter, StagedBlob};
use crate::store::changes::{Limits, NewChange, record};
use crate::store::db::{Conn as Connection, OptionalExtension, params};
use crate::store::previews::{format_kinds, want_judged};
use crate::store::{Scope, Store, now_ns, time_to_ns};
use crate::sync::relock;

/// What upload step 3 needs to know before it reads the body.
#[derive(Debug, Clone)]
pub struct PendingUpload {
    pub length: u64,
    pub md5: Option<String>,
    pub committed: bool,
}

/// Upload step 1 inside the caller's transaction: the file at `path`, created empty (its
/// folder's time moved) unless it exists, the folder looked up in (and remembered by)
/// `folders`; a folder of that name is a conflict. A new file is logged (`store::changes`)
/// with the log's bounds `log`.
pub(in crate::store) fn create_file_row_in(
    tx: &Connection,
    scope: Scope,
    path: &NodePath,
    now: i64,
    folders: &mut Folders,
    log: Limits,
) -> Result<NodeRow> {
    let (folder, name) = split(path)?;
    let name = &crate::api::path::new_name(name)?;
    let (parent, stored) = folders.resolve(tx, scope, &folder)?;
    require_folder(&parent, &folder)?;
    match find_child(tx, parent.id, name)? {
        Some(existing) if existing.is_file() => Ok(existing),
        Some(_) => Err(is_a_folder(path)),
        None => {
            let row = insert_file(tx, &parent, &stored, name, now, log)?;
            touch(tx, Some(parent.id), now)?;
            Ok(row)
        }
    }
}

fn is_a_folder(path: &NodePath) -> Error {
    Error::conflict("exists", format!("{path} is a folder"))
}

/// A new empty file `name` in `parent` (whose path as stored is `stored`), logged; the
/// caller moves the folder's time.
fn insert_file(
    tx: &Connection,
    parent: &NodeRow,
    stored: &NodePath,
    name: &str,
    now: i64,
    log: Limits,
) -> Result<NodeRow> {
    let id = insert_node(tx, parent, NodeKind::File, name, now)?;
    // The row as inserted (read back, it would be a round trip more on PostgreSQL).
    let row = NodeRow {
        id,
        parent_id: Some(parent.id),
        account_id: parent.account_id,
        kind: NodeKind::File,
        name: name.to_string(),
        created_on: now,
        modified_on: now,
        size: None,
        md5: None,
        exec: 0,
    };
    let path = stored.child(name)?;
    record(tx, NewChange::new(&row, ChangeKind::Created, &path), log)?;
    Ok(row)
}

/// The terms of a pending version (step 2): its length, md5 (normalized), attributes and base.
struct Pending<'a> {
    length: u64,
    md5: Option<&'a str>,
    attrs: FileAttrs,
    base: &'a Base,
}

impl Store {
    /// Upload step 1: the file `name` in `folder`, created empty unless it exists.
    pub fn create_file(&self, scope: Scope, folder: &NodePath, name: &str) -> Result<Node> {
        let (_, mut files) = self.create_files(scope, folder, std::slice::from_ref(&name))?;
        files.pop().expect("one result per name")
    }

    /// Upload step 1 for the names of one request, in one transaction: the folder (its time
    /// and `total_children` after the request) and, for each name in order, the file, created
    /// empty unless it exists, or the error of that name alone (a folder of that name). A bad
    /// name, a missing folder or the quota fails the whole request, nothing created.
    pub fn create_files<S: AsRef<str>>(
        &self,
        scope: Scope,
        folder: &NodePath,
        names: &[S],
    ) -> Result<(Node, Vec<Result<Node>>)> {
        let names = names
            .iter()
            .map(|n| {
                let name = crate::api::path::new_name(n.as_ref())?;
                folder.child(&name)?.check_depth()?;
                Ok(name)
            })
            .collect::<Result<Vec<_>>>()?;
        let conn = self.conn()?;
        // The account's writers' lock: its names and change log, not another account's.
        let tx = conn.transaction_for(scope.writers())?;
        let (mut parent, stored) = Folders::default().resolve(&tx, scope, folder)?;
        require_folder(&parent, folder)?;
        // The first name's child read with what the account holds (one round trip less).
        let mut held = (0, 0);
        let found = names
            .iter()
            .enumerate()
            .map(|(i, n)| {
                if i > 0 {
                    return find_child(&tx, parent.id, n);
                }
                let (child, h) = find_child_and_held(&tx, parent.id, parent.account_id, n)?;
                held = h;
                Ok(child)
            })
            .collect::<Result<Vec<_>>>()?;
        let new: std::collections::HashSet<&str> = names
            .iter()
            .zip(&found)
            .filter(|(_, f)| f.is_none())
            .map(|(n, _)| n.as_str())
            .collect();
        check_held(&self.config, scope, held, new.len() as u64, 0)?;
        let now = now_ns();
        let mut made: std::collections::HashMap<&str, NodeRow> = Default::default();
        let mut files = Vec::with_capacity(names.len());
        for (name, found) in names.iter().zip(found) {
            let path = folder.child(name)?;
            let row = match found {
                Some(existing) if existing.is_file() => existing,
                Some(_) => {
                    files.push(Err(is_a_folder(&path)));
                    continue;
                }
                None => match made.get(name.as_str()) {
                    Some(row) => row.clone(),
                    None => {
                        let row =
                            insert_file(&tx, &parent, &stored, name, now, self.change_limits())?;
                        made.insert(name, row.clone());
                        row
                    }
                },
            };
            files.push(Ok(row.to_api(&path)));
        }
        if !made.is_empty() {
            touch(&tx, Some(parent.id), now)?;
            parent.modified_on = now;
        }
        // The folder as the interface answers step 1: with its count of children.
        let total: i64 = tx
            .prepare_cached("SELECT count(*) FROM nodes WHERE parent_id = ?1")?
            .query_row([parent.id], |r| r.get(0))?;
        tx.commit()?;
        if !made.is_empty() {
            self.changed(parent.account_id);
        }
        let mut node = parent.to_api(folder);
        node.total_children = Some(total as u64);
        Ok((node, files))
    }

    /// Upload step 2: opens a pending version of `length` bytes (and the md5, if given), with
    /// the attributes the file takes when it is committed.
    pub fn begin_version(
        &self,
        scope: Scope,
        file_id: &str,
        length: u64,
        md5: Option<&str>,
        attrs: FileAttrs,
        base: &Base,
    ) -> Result<Node> {
        let md5 = md5.map(normalize_md5).transpose()?;
        self.check_file_size(length)?;
        let conn = self.conn()?;
        // Without the writers' lock: a pending version changes nothing anyone sees (no change
        // is logged, no name taken, no byte placed), and step 3 checks again, under the lock,
        // what is checked here. For the same reason no transaction on PostgreSQL (its BEGIN and
        // COMMIT would be two round trips of five): each statement is atomic alone. SQLite's
        // (its write lock, taken in memory) keeps the reads and the insert together.
        let tx = (!conn.is_pg())
            .then(|| conn.unordered_transaction())
            .transpose()?;
        let c: &Connection = tx.as_deref().unwrap_or(&conn);
        let (file, path) = file_and_path(c, scope, file_id)?;
        let pending = Pending {
            length,
            md5: md5.as_deref(),
            attrs,
            base,
        };
        let node = self.insert_pending(c, scope, &file, &path, pending)?;
        if let Some(tx) = tx {
            tx.commit()?;
        }
        Ok(node)
    }

    /// Upload steps 1 and 2 in one transaction (our whole PUT by path): the file at `path`,
    /// made empty when absent, and a pending version of it. A condition on the bytes of a file
    /// that is not there is 404, and makes nothing. The pending version's node, and whether the
    /// file was made. (Step 1 alone, then step 2, were two transactions and a look-up more a
    /// file: creating 10,000 small files through a loopback server took a fifth longer.)
    pub fn begin_version_at(
        &self,
        scope: Scope,
        path: &NodePath,
        length: u64,
        md5: Option<&str>,
        attrs: FileAttrs,
        base: &Base,
    ) -> Result<(Node, bool)> {
        let md5 = md5.map(normalize_md5).transpose()?;
        self.check_file_size(length)?;
        let (folder, name) = split(path)?;
        let name = crate::api::path::new_name(name)?;
        path.check_depth()?;
        let conn = self.conn()?;
        // The account's writers' lock: the file may be made (its name, the change log).
        let tx = conn.transaction_for(scope.writers())?;
        let (parent, stored) = Folders::default().resolve(&tx, scope, &folder)?;
        require_folder(&parent, &folder)?;
        let (found, held) = find_child_and_held(&tx, parent.id, parent.account_id, &name)?;
        let (file, made) = match found {
            Some(existing) if existing.is_file() => (existing, false),
            Some(_) => return Err(is_a_folder(path)),
            None if matches!(base, Base::Md5(_)) => {
                return Err(Error::not_found(format!("no file at {path}")));
            }
            None => {
                check_held(&self.config, scope, held, 1, 0)?;
                let now = now_ns();
                let row = insert_file(&tx, &parent, &stored, &name, now, self.change_limits())?;
                touch(&tx, Some(parent.id), now)?;
                (row, true)
            }
        };
        let pending = Pending {
            length,
            md5: md5.as_deref(),
            attrs,
            base,
        };
        let node = self.insert_pending(&tx, scope, &file, &stored.child(&file.name)?, pending)?;
        tx.commit()?;
        if made {
            self.changed(parent.account_id);
        }
        Ok((node, made))
    }

    /// Step 2's version row for `file` (at `path`), pending: refused when `base` fails already
    /// (checked again, atomically, at the commit) or the quota would be passed (versions are
    /// kept: each counts, the announced length now).
    fn insert_pending(
        &self,
        c: &Connection,
        scope: Scope,
        file: &NodeRow,
        path: &NodePath,
        p: Pending<'_>,
    ) -> Result<Node> {
        if !p.base.holds(file.md5.as_deref()) {
            return Err(p.base.conflict(&path.to_string()));
        }
        check_quota(c, &self.config, scope, 0, p.length)?;
        let vid: i64 = c.query_row(
            "INSERT INTO versions (file_id, length, md5, committed, created_on, modified_on, exec, base) VALUES (?1, ?2, ?3, 0, ?4, ?5, ?6, ?7) RETURNING id",
            params![file.id, p.length as i64, p.md5, now_ns(), p.attrs.modified.map(time_to_ns), p.attrs.mode.map(kept_mode), p.base.column()],
            |r| r.get(0),
        )
        .map_err(|e| {
            if e.is_missing_reference() {
                Error::not_found(format!("{path} was deleted meanwhile"))
            } else {
                e.into()
            }
        })?;
        let mut node = file.to_api(path);
        node.file_ex_properties = Some(FileExProperties {
            upload_uri: format!("/nodes/upload/{}/{vid}", file.id),
            version_id: Some(vid.to_string()),
            conflict_check: (*p.base != Base::Any).then_some(true),
        });
        Ok(node)
    }

    /// Sets a file's attributes without a new version (our step 2 without `length`).
    pub fn set_attrs(&self, scope: Scope, file_id: &str, attrs: FileAttrs) -> Result<Node> {
        let conn = self.conn()?;
        let tx = conn.transaction_for(scope.writers())?;
        let (file, path) = file_and_path(&tx, scope, file_id)?;
        tx.execute(
            "UPDATE nodes SET modified_on = coalesce(?2, modified_on), exec = coalesce(?3, exec) WHERE id = ?1",
            params![file.id, attrs.modified.map(time_to_ns), attrs.mode.map(kept_mode)],
        )?;
        let row = row(&tx, file.id)?;
        self.log_change(&tx, NewChange::new(&row, ChangeKind::Attributes, &path))?;
        tx.commit()?;
        self.changed(row.account_id);
        Ok(row.to_api(&path))
    }

    /// Upload step 3, before the body: the version's announced length and md5.
    pub fn pending_upload(
        &self,
        scope: Scope,
        file_id: &str,
        version_id: &str,
    ) -> Result<PendingUpload> {
        // One statement: the file of the caller's account, and its version. Whether the file
        // is still attached (not in a deleted tree) is for the commit, which reads it all again.
        let no_file = || Error::not_found(format!("no file with ID {file_id}"));
        let fid: i64 = file_id.parse().map_err(|_| no_file())?;
        let vid: i64 = version_id.parse().unwrap_or(-1);
        let account = match scope {
            Scope::Account(a) => Some(a),
            Scope::All => None,
        };
        let found: Option<(Option<i64>, Option<String>, Option<i64>)> = self
            .conn()?
            .prepare_cached(
                "SELECT v.length, v.md5, v.committed FROM nodes n
                 LEFT JOIN versions v ON v.id = ?2 AND v.file_id = n.id
                 WHERE n.id = ?1 AND n.kind = ?3 AND (CAST(?4 AS BIGINT) IS NULL OR n.account_id = ?4)",
            )?
            .query_row(params![fid, vid, NodeKind::File as i64, account], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .optional()?;
        match found.ok_or_else(no_file)? {
            (Some(length), md5, Some(committed)) => Ok(PendingUpload {
                length: length as u64,
                md5,
                committed: committed != 0,
            }),
            _ => Err(version_not_found(version_id)),
        }
    }

    /// A staging file for upload bytes, hashed as it is written.
    pub fn blob_writer(&self) -> std::io::Result<BlobWriter> {
        self.blobs.writer()
    }

    /// Upload step 3, after the body: checks length and md5 against step 2, stores the bytes and
    /// makes the version current, atomically. On any error the file keeps its content.
    /// Repeating a step 3 that already succeeded with the same bytes succeeds again (so a client
    /// may retry it safely).
    ///
    /// Group commit: each step 3 must be durable before it returns (the client drops its copy),
    /// and a durable transaction costs a directory fsync and a WAL fsync under the store's lock.
    /// Uploads that arrive while one commits queue up, and the next to get the lock commits
    /// them all in one transaction (see `commit_batch`: one failing fails alone).
    pub fn commit_upload(
        &self,
        scope: Scope,
        file_id: &str,
        version_id: &str,
        staged: StagedBlob,
    ) -> Result<Node> {
        self.commit_or_back(scope, file_id, version_id, staged)
            .map_err(|(e, _)| e)
    }

    /// [`Store::commit_upload`], with the bytes back when another version is current than the
    /// base (412): the caller may store them elsewhere (WebDAV's conflict copy, `store::seen`).
    pub(in crate::store) fn commit_or_back(
        &self,
        scope: Scope,
        file_id: &str,
        version_id: &str,
        mut staged: StagedBlob,
    ) -> std::result::Result<Node, super::staged::Refused> {
        self.note_write_activity();
        // Held in the database too, for the other servers of a shared store (`hold_blob`);
        // let go of by the group commit that takes it (or here, on an error before).
        let hold = self.hold_blob(&staged.sha256).map_err(|e| (e, None))?;
        let kinds = match self.ready_to_commit(&mut staged) {
            Ok(kinds) => kinds,
            Err(e) => {
                self.release_blobs(hold.as_deref());
                return Err((e, None));
            }
        };
        let me = Arc::new(PendingCommit {
            scope,
            file_id: file_id.to_string(),
            version_id: version_id.to_string(),
            hold,
            kinds,
            staged: Mutex::new(Some(staged)),
            result: Mutex::new(None),
        });
        // One queue per writers' lock: on PostgreSQL each account's batches commit beside
        // other accounts' (each under its account's lock), on SQLite all are one queue (one
        // write lock: one batch, one fsync, is the cheapest).
        let writers = if self.db.is_pg() {
            scope.writers()
        } else {
            crate::store::db::Writers::Store
        };
        relock(&self.commits)
            .entry(writers)
            .or_default()
            .push(me.clone());
        // One batch of a queue at a time in this process; results are set before the turn is
        // passed on, so a batch that took ours is finished when we get the turn.
        let turn = self.commit_turn(writers);
        let held = relock(&turn);
        // The bytes of a refused base are back in `me.staged` (`commit_batch`).
        let back = |r: Result<Node>| r.map_err(|e| (e, relock(&me.staged).take().map(Box::new)));
        if let Some(done) = relock(&me.result).take() {
            drop(held);
            self.done_with_turn(writers, turn);
            return back(done);
        }
        let batch = relock(&self.commits).remove(&writers).unwrap_or_default();
        let outcome = match self.conn() {
            Ok(conn) => self.commit_batch(&conn, writers, &batch),
            Err(e) => {
                // Each of the batch is told (ours included), as a failed commit tells them.
                for p in &batch {
                    *relock(&p.result) = Some(Err(e.clone()));
                }
                Vec::new()
            }
        };
        drop(held);
        self.done_with_turn(writers, turn);
        self.release_blobs(batch.iter().filter_map(|p| p.hold.as_deref()));
        for (render, name, sha) in outcome {
            if let Some(kind) = render {
                self.previews.enqueue(&sha, kind, &name);
            }
        }
        self.search.wake();
        let r = relock(&me.result).take();
        back(r.unwrap_or_else(|| Err(Error::internal("upload commit lost its result"))))
    }

    /// The turn of the group commits of `writers`' queue (see [`Store::commit_upload`]).
    fn commit_turn(&self, writers: crate::store::db::Writers) -> Arc<Mutex<()>> {
        relock(&self.commit_turns)
            .entry(writers)
            .or_default()
            .clone()
    }

    /// After `turn` was let go of: its entry dropped when nobody else holds or waits for it
    /// (the map's and ours are all), so that accounts come and go without a trace.
    fn done_with_turn(&self, writers: crate::store::db::Writers, turn: Arc<Mutex<()>>) {
        let mut turns = relock(&self.commit_turns);
        if Arc::strong_count(&turn) == 2 {
            turns.remove(&writers);
        }
    }

    /// Before the commit: the bytes into the bucket, if any (see `Blobs::store_ahead`), and
    /// their kinds of document, judged from the staged file (in the commit, for new bytes, it
    /// would be read back from where they are kept: a bucket).
    fn ready_to_commit(&self, staged: &mut StagedBlob) -> Result<crate::preview::Kinds> {
        self.blobs.store_ahead(staged, |hash| {
            Ok(self
                .conn()?
                .prepare_cached("SELECT 1 FROM blobs WHERE hash = ?1")?
                .exists([hash])?)
        })?;
        Ok(crate::store::previews::judge_file(&std::fs::File::open(
            &staged.path,
        )?)?)
    }

    /// Commits the queued step 3s in one durable transaction and gives each its result. Returns
    /// the previews to queue (after the lock is released).
    ///
    /// No savepoints (two round trips an upload on PostgreSQL, under the writers' lock): an
    /// upload's checks only read ([`Store::check_one`]), so one refused has written nothing and
    /// fails alone; should a write fail (the database's error, which on PostgreSQL ends the
    /// transaction), the batch is rolled back and its uploads committed again one by one, each
    /// in a transaction of its own.
    fn commit_batch(
        &self,
        conn: &Connection,
        writers: crate::store::db::Writers,
        batch: &[Arc<PendingCommit>],
    ) -> Vec<(Option<crate::preview::PreviewKind>, String, String)> {
        let mut staged: Vec<Option<StagedBlob>> =
            batch.iter().map(|p| relock(&p.staged).take()).collect();
        let mut results: Vec<Result<Committed>> = Vec::new();
        let committed = (|| -> Result<()> {
            // Durable before it returns: the clients will drop their copies of these bytes.
            let durable = crate::store::schema::Durable::new(conn)?;
            let together = self.commit_together(conn, writers, batch, &mut staged, &mut results);
            if let Err(e) = together {
                if batch.len() == 1 {
                    return Err(e);
                }
                log::warn!(
                    "a group commit of {} uploads failed ({e}): one by one",
                    batch.len()
                );
                results.clear();
                for (p, staged) in batch.iter().zip(&mut staged) {
                    let mut alone = Vec::new();
                    let r = self.commit_together(
                        conn,
                        writers,
                        std::slice::from_ref(p),
                        std::slice::from_mut(staged),
                        &mut alone,
                    );
                    results.push(match r {
                        Ok(()) => alone.pop().unwrap_or_else(|| {
                            Err(Error::internal("upload commit lost its result"))
                        }),
                        Err(e) => Err(e),
                    });
                }
            }
            durable.done()?;
            for (p, r) in batch.iter().zip(&results) {
                if r.is_ok() {
                    self.feed.wake(p.scope);
                }
            }
            self.forget_blobs(conn, results.iter().flatten().flat_map(|c| &c.freed));
            Ok(())
        })();
        let mut previews = Vec::new();
        for (i, p) in batch.iter().enumerate() {
            let r = match (&committed, results.get(i)) {
                (Err(e), _) => Err(e.clone()),
                (Ok(()), Some(Ok(c))) => {
                    previews.push((c.render, c.name.clone(), c.sha.clone()));
                    Ok(c.node.clone())
                }
                (Ok(()), Some(Err(e))) => Err(e.clone()),
                (Ok(()), None) => Err(Error::internal("upload commit lost its result")),
            };
            if matches!(&r, Err(e) if e.kind == crate::api::ErrorKind::Precondition) {
                *relock(&p.staged) = staged[i].take();
            }
            *relock(&p.result) = Some(r);
        }
        previews
    }

    /// The uploads of `batch` in one transaction, committed unless a write fails (`Err`: rolled
    /// back). A refused upload (its checks failed) has its error in `results` and written
    /// nothing.
    fn commit_together(
        &self,
        conn: &Connection,
        writers: crate::store::db::Writers,
        batch: &[Arc<PendingCommit>],
        staged: &mut [Option<StagedBlob>],
        results: &mut Vec<Result<Committed>>,
    ) -> Result<()> {
        let tx = conn.transaction_for(writers)?;
        for (p, staged) in batch.iter().zip(staged.iter_mut()) {
            let Some(staged) = staged else {
                results.push(Err(Error::internal("upload committed twice")));
                continue;
            };
            match self.check_one(&tx, p, staged) {
                Ok(checked) => results.push(Ok(self.write_one(&tx, p, staged, checked)?)),
                Err(e) => results.push(Err(e)),
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// One step 3's checks inside the group's transaction, reads only: the file, its path and
    /// the version.
    fn check_one(
        &self,
        tx: &Connection,
        p: &PendingCommit,
        staged: &StagedBlob,
    ) -> Result<(NodeRow, NodePath, VersionRow)> {
        // One statement for the file, its path, the version and the quota's count.
        let (file, path, beside) = file_path_version(tx, p.scope, &p.file_id, &p.version_id)?;
        let v = beside
            .version
            .ok_or_else(|| version_not_found(&p.version_id))?;
        if v.committed {
            if v.blob.as_deref() != Some(staged.sha256.as_str()) {
                return Err(Error::conflict(
                    "version_committed",
                    "this version was already uploaded with other bytes",
                ));
            }
        } else {
            // The conflict check of step 2, again where nothing can come in between.
            if !v.base.holds(file.md5.as_deref()) {
                return Err(v.base.conflict(&path.to_string()));
            }
            check_upload(v.length, v.md5.as_deref(), staged)?;
            // Again at commit: versions announced together could pass the check of step 2.
            check_held(&self.config, p.scope, beside.held, 0, v.length)?;
        }
        Ok((file, path, v))
    }

    /// One step 3's writes, after [`Store::check_one`]: the node, whether its preview is to be
    /// made, its name and blob hash.
    fn write_one(
        &self,
        tx: &Connection,
        p: &PendingCommit,
        staged: &mut StagedBlob,
        (file, path, v): (NodeRow, NodePath, VersionRow),
    ) -> Result<Committed> {
        let row = if v.committed {
            file.clone()
        } else {
            let now = now_ns();
            // The file as it is now, made here rather than read back (a round trip more on
            // PostgreSQL): the version's bytes, and the attributes step 2 gave it.
            let row = NodeRow {
                modified_on: v.modified_on.unwrap_or(now),
                exec: v.exec.unwrap_or(file.exec),
                size: Some(staged.len),
                md5: Some(staged.md5.clone()),
                ..file.clone()
            };
            // The bytes recorded unless known, the version committed, the file pointed at it.
            // On PostgreSQL in one statement, where three were three round trips under the
            // writers' lock; SQLite (in memory, and without writes inside WITH) takes three.
            // There the blob's lock first (the insert reads from it): blobs are shared by
            // accounts, whose writers run side by side, and a version of another account may
            // be letting go of these bytes now (`free_blobs` takes the same lock): either it
            // comes first and the row is recorded again here (the bytes placed again), or it
            // comes after and sees this version.
            let values = params![
                staged.sha256,
                staged.len as i64,
                staged.md5,
                format_kinds(&p.kinds),
                now,
                v.id,
                row.modified_on,
                row.exec as i64,
                file.id
            ];
            let new = if tx.is_pg() {
                tx.prepare_cached(&format!(
                    "WITH l AS (SELECT {} AS l),
                          b AS (INSERT INTO blobs (hash, size, md5, kinds)
                                SELECT ?1, ?2, ?3, ?4 FROM l
                                ON CONFLICT (hash) DO NOTHING RETURNING 1),
                          v AS (UPDATE versions SET blob = ?1, md5 = ?3, committed = 1,
                                committed_on = ?5 WHERE id = ?6),
                          n AS (UPDATE nodes SET current_version = ?6, modified_on = ?7,
                                exec = ?8 WHERE id = ?9)
                     SELECT count(*) FROM b",
                    crate::store::db::blob_lock(1)
                ))?
                .query_row(values, |r| r.get::<_, i64>(0))?
                    == 1
            } else {
                let new = tx.execute(
                    "INSERT INTO blobs (hash, size, md5, kinds) VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT (hash) DO NOTHING",
                    &values[..4],
                )? == 1;
                tx.execute(
                    "UPDATE versions SET blob = ?1, md5 = ?2, committed = 1, committed_on = ?3 WHERE id = ?4",
                    &[values[0], values[2], values[4], values[5]][..],
                )?;
                tx.execute(
                    "UPDATE nodes SET current_version = ?1, modified_on = ?2, exec = ?3 WHERE id = ?4",
                    &values[5..],
                )?;
                new
            };
            // New bytes are given their name, inside the transaction all the same.
            if new {
                self.blobs.commit(staged)?;
            }
            row
        };
        // Its preview is wanted from now on (InProgress until rendered), unless these bytes
        // have one already.
        let render = want_judged(tx, &staged.sha256, &file.name, &p.kinds)?;
        // A file with no version before this one has none to let go.
        let freed = if file.size.is_some() {
            prune_versions(tx, file.id, &self.config.retention)?
        } else {
            Vec::new()
        };
        if !v.committed {
            self.log_change(tx, NewChange::new(&row, ChangeKind::Version, &path))?;
        }
        Ok(Committed {
            node: row.to_api(&path),
            render,
            name: file.name,
            sha: staged.sha256.clone(),
            freed,
        })
    }
}

/// The md5 of step 2 as hex, from hex or base64 (the public service's clients send base64).
fn normalize_md5(md5: &str) -> Result<String> {
    crate::api::checksum::md5_hex(md5).ok_or_else(|| {
        Error::bad_request(
            "bad_checksum",
            "md5_checksum must be an md5: 32 hexadecimal digits or 24 characters of base64",
        )
    })
}

fn version_not_found(version_id: &str) -> Error {
    Error::new(
        crate::api::ErrorKind::NotFound,
        "version_not_found",
        format!("no pending version {version_id} for this file"),
    )
}

/// The checks of step 3 against step 2, in one place.
pub fn check_upload(length: u64, md5: Option<&str>, staged: &StagedBlob) -> Result<()> {
    if staged.len != length {
        return Err(length_mismatch(length, staged.len));
    }
    if let Some(m) = md5 {
        if m != staged.md5 {
            return Err(Error::bad_request(
                "checksum_mismatch",
                format!("the bytes have md5 {}, step 2 announced {m}", staged.md5),
            ));
        }
    }
    Ok(())
}

pub fn length_mismatch(expected: u64, got: u64) -> Error {
    Error::bad_request(
        "length_mismatch",
        format!("step 2 announced {expected} bytes, {got} were sent"),
    )
}

/// A version made current: the file, whether its preview is to be made, its name, the blob's
/// hash, and the blobs the earlier versions it dropped no longer need.
pub(in crate::store) struct Committed {
    pub node: Node,
    pub render: Option<crate::preview::PreviewKind>,
    pub name: String,
    pub sha: String,
    pub freed: Vec<String>,
}

/// A step 3 waiting for the next group commit (see `Store::commit_upload`).
pub(in crate::store) struct PendingCommit {
    scope: Scope,
    file_id: String,
    version_id: String,
    /// Its hold on the bytes (`Store::hold_blob`), let go of after the commit.
    hold: Option<String>,
    /// The bytes' kinds of document (`previews::judge_file`).
    kinds: crate::preview::Kinds,
    staged: Mutex<Option<StagedBlob>>,
    result: Mutex<Option<Result<Node>>>,
}
