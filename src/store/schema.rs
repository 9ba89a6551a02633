//! The metadata database: one SQLite file in WAL mode. Every change to the tree is one
//! transaction, so a crash at any point leaves the tree as it was before or after that change.

use rusqlite::Connection;

/// Bumped when the schema changes; `migrate` brings older databases forward.
pub(crate) const VERSION: i64 = 16;

const V1: &str = "
CREATE TABLE nodes (
    -- AUTOINCREMENT: an ID is never reused, so an ID a client kept (an upload journal, a cache)
    -- can never point at a different file later.
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    parent_id   INTEGER REFERENCES nodes(id) ON DELETE CASCADE,
    account_id  INTEGER NOT NULL,
    kind        INTEGER NOT NULL,      -- 0 account, 1 vault, 2 folder, 3 file
    name        TEXT NOT NULL,
    created_on  INTEGER NOT NULL,      -- nanoseconds since the epoch
    modified_on INTEGER NOT NULL,
    current_version INTEGER            -- files: the version whose bytes are served
);
CREATE UNIQUE INDEX nodes_by_parent ON nodes(parent_id, name) WHERE parent_id IS NOT NULL;
CREATE UNIQUE INDEX accounts_by_name ON nodes(name) WHERE parent_id IS NULL;

CREATE TABLE versions (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    file_id      INTEGER NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
    length       INTEGER NOT NULL,     -- announced in upload step 2
    md5          TEXT,                 -- announced (pending) or actual (committed), hex
    blob         TEXT,                 -- sha256 of the bytes, once committed
    committed    INTEGER NOT NULL DEFAULT 0,
    created_on   INTEGER NOT NULL,
    committed_on INTEGER
);
CREATE INDEX versions_by_file ON versions(file_id);
CREATE INDEX versions_by_blob ON versions(blob) WHERE blob IS NOT NULL;

-- Content-addressed bytes on disk, shared by every version (and copy) with the same content.
CREATE TABLE blobs (
    hash TEXT PRIMARY KEY,             -- sha256, hex; file blobs/<hash[0..2]>/<hash>
    size INTEGER NOT NULL,
    md5  TEXT NOT NULL
);

CREATE TABLE users (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    email         TEXT NOT NULL UNIQUE COLLATE NOCASE,
    account_id    INTEGER NOT NULL REFERENCES nodes(id),
    password_hash TEXT NOT NULL,       -- argon2id PHC string
    created_on    INTEGER NOT NULL
);

CREATE TABLE clients (
    client_id  TEXT PRIMARY KEY,
    created_on INTEGER NOT NULL
);

-- One pin per (user, client), shown again on later visits of the authorization page, so it is
-- kept as it is; the lockout on failed exchanges is what protects it.
CREATE TABLE pins (
    user_id    INTEGER NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    client_id  TEXT NOT NULL REFERENCES clients(client_id) ON DELETE CASCADE,
    pin        TEXT NOT NULL,
    created_on INTEGER NOT NULL,
    PRIMARY KEY (user_id, client_id)
);

-- Delegation tokens, stored only as their sha256.
CREATE TABLE tokens (
    hash       BLOB PRIMARY KEY,
    user_id    INTEGER NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    client_id  TEXT NOT NULL,
    created_on INTEGER NOT NULL,
    expires_on INTEGER NOT NULL,
    revoked    INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX tokens_by_user ON tokens(user_id);

CREATE TABLE auth_failures (
    user_id INTEGER NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    kind    TEXT NOT NULL,             -- 'pin' or 'password'
    at      INTEGER NOT NULL
);
CREATE INDEX auth_failures_by_user ON auth_failures(user_id, kind, at);
";

/// Previews (page images and a PDF) are derived from a blob's bytes, so they are keyed by the blob:
/// copies and identical versions share them, a new version gets its own. The files live in
/// `previews/<hash[0..2]>/<hash>/`; deleting the blob's row deletes the preview's (trigger), and
/// the store removes the files with the blob's.
const V2: &str = "
CREATE TABLE previews (
    blob       TEXT PRIMARY KEY,       -- sha256 of the bytes previewed
    status     INTEGER NOT NULL,       -- 0 in progress, 1 ready, 2 type not supported
    pages      TEXT,                   -- ready: JSON [[width, height], ...] in pixels at 100%
    own_pdf    INTEGER NOT NULL DEFAULT 0, -- 1: document.pdf was made; 0: the blob is the PDF
    name       TEXT NOT NULL,          -- a name the bytes had (a hint to their type)
    reason     TEXT,                   -- not supported: why (for the operator)
    updated_on INTEGER NOT NULL
);
CREATE INDEX previews_in_progress ON previews(status) WHERE status = 0;
CREATE TRIGGER blobs_drop_preview AFTER DELETE ON blobs
BEGIN
    DELETE FROM previews WHERE blob = OLD.hash;
END;
";

/// Pins become a keyed hash with an expiry (earlier pins, kept as they were, are dropped: their
/// users sign in again); failed attempts are counted per e-mail as typed and source address,
/// not per user, so unknown e-mails are answered as known ones and nobody can lock out others.
const V3: &str = "
DROP TABLE pins;
CREATE TABLE pins (
    user_id    INTEGER NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    client_id  TEXT NOT NULL REFERENCES clients(client_id) ON DELETE CASCADE,
    hash       BLOB NOT NULL,          -- HMAC-SHA256 under the key in pin.key
    created_on INTEGER NOT NULL,
    expires_on INTEGER NOT NULL,       -- unused until then; used once
    PRIMARY KEY (user_id, client_id)
);
DROP TABLE auth_failures;
CREATE TABLE auth_attempts (
    email  TEXT NOT NULL,              -- lower-cased, whether a user has it or not
    source TEXT NOT NULL,              -- the client's address ('' when not known)
    kind   TEXT NOT NULL,              -- 'pin' or 'password'
    at     INTEGER NOT NULL
);
CREATE INDEX auth_attempts_by_pair ON auth_attempts(email, source, kind, at);
";

/// What each account holds (nodes, and bytes of committed versions, old ones included), kept by
/// triggers so that a quota check is one row read, whatever path changed the tree. A node's
/// bytes leave with it (before its versions are cascaded away, when it can no longer be found).
const V4: &str = "
CREATE TABLE usage (
    account_id INTEGER PRIMARY KEY,
    nodes      INTEGER NOT NULL DEFAULT 0,
    bytes      INTEGER NOT NULL DEFAULT 0
);
INSERT INTO usage (account_id, nodes) SELECT account_id, count(*) FROM nodes GROUP BY account_id;
UPDATE usage SET bytes = (SELECT coalesce(sum(v.length), 0) FROM versions v
    JOIN nodes n ON n.id = v.file_id WHERE v.committed = 1 AND n.account_id = usage.account_id);
CREATE TRIGGER usage_node_added AFTER INSERT ON nodes BEGIN
    INSERT INTO usage (account_id, nodes) VALUES (NEW.account_id, 1)
        ON CONFLICT (account_id) DO UPDATE SET nodes = nodes + 1;
END;
CREATE TRIGGER usage_node_removed BEFORE DELETE ON nodes BEGIN
    UPDATE usage SET nodes = nodes - 1, bytes = bytes - (SELECT coalesce(sum(length), 0)
        FROM versions WHERE file_id = OLD.id AND committed = 1)
    WHERE account_id = OLD.account_id;
END;
CREATE TRIGGER usage_node_moved AFTER UPDATE OF account_id ON nodes
WHEN OLD.account_id <> NEW.account_id BEGIN
    UPDATE usage SET nodes = nodes - 1, bytes = bytes - (SELECT coalesce(sum(length), 0)
        FROM versions WHERE file_id = OLD.id AND committed = 1)
    WHERE account_id = OLD.account_id;
    INSERT INTO usage (account_id, nodes, bytes) VALUES (NEW.account_id, 1,
        (SELECT coalesce(sum(length), 0) FROM versions WHERE file_id = NEW.id AND committed = 1))
        ON CONFLICT (account_id) DO UPDATE SET nodes = nodes + 1, bytes = bytes + excluded.bytes;
END;
CREATE TRIGGER usage_version_added AFTER INSERT ON versions WHEN NEW.committed = 1 BEGIN
    UPDATE usage SET bytes = bytes + NEW.length
    WHERE account_id = (SELECT account_id FROM nodes WHERE id = NEW.file_id);
END;
CREATE TRIGGER usage_version_committed AFTER UPDATE OF committed ON versions
WHEN NEW.committed = 1 AND OLD.committed = 0 BEGIN
    UPDATE usage SET bytes = bytes + NEW.length
    WHERE account_id = (SELECT account_id FROM nodes WHERE id = NEW.file_id);
END;
CREATE TRIGGER usage_version_removed AFTER DELETE ON versions WHEN OLD.committed = 1 BEGIN
    UPDATE usage SET bytes = bytes - OLD.length
    WHERE account_id = (SELECT account_id FROM nodes WHERE id = OLD.file_id);
END;
";

/// Previews are made once per content, but what an account is told of one is its own
/// (issue 19, item 8): `render_ns` is how long a preview took to make, and `preview_access`
/// when each account may see it ready: an account that asks for a preview made before it was
/// interested waits as long as making it took, so "ready at once" does not tell that another
/// account holds the same bytes. A preview made again (after eviction) starts afresh.
const V5: &str = "
ALTER TABLE previews ADD COLUMN render_ns INTEGER NOT NULL DEFAULT 0;
CREATE TABLE preview_access (
    account_id INTEGER NOT NULL,
    blob       TEXT NOT NULL,
    ready_on   INTEGER NOT NULL,       -- ns; 0: as the preview is
    PRIMARY KEY (account_id, blob)
);
CREATE TRIGGER previews_drop_access AFTER DELETE ON previews BEGIN
    DELETE FROM preview_access WHERE blob = OLD.blob;
END;
";

/// Attributes a client sets on a file (issue 22): its modification time (`nodes.modified_on`,
/// which a commit sets to the version's time when step 2 gave one) and the execute bits a
/// chmod gave it. A pending version keeps what step 2 said until it is committed.
const V6: &str = "
ALTER TABLE nodes ADD COLUMN exec INTEGER NOT NULL DEFAULT 0;   -- files: mode & 0o111
ALTER TABLE versions ADD COLUMN modified_on INTEGER;  -- ns, signed; NULL: the commit's time
ALTER TABLE versions ADD COLUMN exec INTEGER;         -- NULL: the file's bits as they are
";

/// A preview is of some bytes rendered as one kind (issue 19, item 8): the same bytes under
/// two names can be two kinds (a log full of control characters is text as `a.log`, no preview
/// as `a.bin`), and each name gets the preview its own type implies; identical (bytes, kind)
/// pairs still share one. `blobs.kinds` is the kind of the bytes for each class of name
/// (`crate::preview::kinds`, three letters; NULL until first judged). Earlier rows get the kind
/// `''` here and their real one when the store opens (`Store::migrate_preview_kinds`, which
/// reads the bytes with the name they were rendered by, and moves their files from
/// `previews/<hash>/` to `previews/<hash>/<kind>/`).
const V7: &str = "
ALTER TABLE blobs ADD COLUMN kinds TEXT;
DROP TRIGGER blobs_drop_preview;
DROP TRIGGER previews_drop_access;
CREATE TABLE previews_v7 (
    blob       TEXT NOT NULL,          -- sha256 of the bytes previewed
    kind       TEXT NOT NULL,          -- pdf, image or text ('': from before kinds, not known yet)
    status     INTEGER NOT NULL,       -- 0 in progress, 1 ready, 2 not supported
    pages      TEXT,
    own_pdf    INTEGER NOT NULL DEFAULT 0,
    name       TEXT NOT NULL,          -- a name the bytes had under this kind (for the logs)
    reason     TEXT,
    updated_on INTEGER NOT NULL,
    render_ns  INTEGER NOT NULL DEFAULT 0,
    bytes      INTEGER NOT NULL DEFAULT 0,
    used_on    INTEGER NOT NULL DEFAULT 0,
    requested  INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (blob, kind)
);
INSERT INTO previews_v7 (blob, kind, status, pages, own_pdf, name, reason, updated_on, render_ns,
        bytes, used_on, requested)
    SELECT blob, '', status, pages, own_pdf, name, reason, updated_on, render_ns, bytes, used_on,
        requested FROM previews;
DROP TABLE previews;
ALTER TABLE previews_v7 RENAME TO previews;
CREATE INDEX previews_in_progress ON previews(status) WHERE status = 0;
CREATE TABLE preview_access_v7 (
    account_id INTEGER NOT NULL,
    blob       TEXT NOT NULL,
    kind       TEXT NOT NULL,
    ready_on   INTEGER NOT NULL,
    PRIMARY KEY (account_id, blob, kind)
);
INSERT INTO preview_access_v7 SELECT account_id, blob, '', ready_on FROM preview_access;
DROP TABLE preview_access;
ALTER TABLE preview_access_v7 RENAME TO preview_access;
CREATE TRIGGER blobs_drop_preview AFTER DELETE ON blobs BEGIN
    DELETE FROM previews WHERE blob = OLD.hash;
END;
CREATE TRIGGER previews_drop_access AFTER DELETE ON previews BEGIN
    DELETE FROM preview_access WHERE blob = OLD.blob AND kind = OLD.kind;
END;
";

/// Deletes of large trees are bounded per transaction (issue 19, item 12, `store::purge`): the
/// request's transaction detaches the tree (its top gets no parent and the name `/<id>`) and
/// lists it here; a thread deletes it in chunks, and a restart resumes what is listed.
const V8: &str = "
CREATE TABLE trash (
    node_id     INTEGER PRIMARY KEY,   -- a detached top: parent_id NULL, not an account
    account_id  INTEGER NOT NULL,
    detached_on INTEGER NOT NULL
);
";

/// The conflict check (issue 32): what a pending version expects to replace, from step 2's
/// `if_match`/`if_none_match`, checked again when step 3 commits. NULL: no check; '': the
/// file must have no content; else the md5 (hex) the current version must have.
const V9: &str = "
ALTER TABLE versions ADD COLUMN base TEXT;
";

/// The change log of each account (issue 32, item 3; `store::changes` says why the store
/// writes it, not triggers): one row per change, its ID the feed's cursor, with the paths the
/// node had; the highest ID pruned of each account is its floor (a cursor below it: reset).
const V10: &str = "
CREATE TABLE changes (
    id         INTEGER PRIMARY KEY AUTOINCREMENT, -- the cursor; never reused
    account_id INTEGER NOT NULL,
    at         INTEGER NOT NULL,       -- ns
    kind       INTEGER NOT NULL,       -- 0 created, 1 version, 2 attributes, 3 deleted, 4 moved, 5 copied
    node_id    INTEGER NOT NULL,
    folder     INTEGER NOT NULL,       -- 1 folder, 0 file
    path       TEXT NOT NULL,          -- segments joined by '/', after the change
    from_path  TEXT                    -- moved: where it was; copied: the source
);
CREATE INDEX changes_by_account ON changes(account_id, id);
CREATE TABLE change_floors (
    account_id INTEGER PRIMARY KEY,
    floor      INTEGER NOT NULL
);
";

/// Deleted files kept restorable (issue 32, item 4; `store::nodes::restore`): a file deleted
/// while the retention rule has an age bound is detached (no parent, the name `/<id>`, as the
/// trash's trees are: no path or ID reaches it) with its versions, and listed here with the
/// folder and name it had, until restored or older than the bound. Its bytes still count in
/// the account's usage. `folder_id` has no key: the folder may be deleted first (its deleted
/// files then go with it, or with the next pruning). Versions by age: the pass that applies the
/// age bound to files no write touches (`store::expire`) finds the old ones without a scan.
const V11: &str = "
CREATE TABLE deleted (
    node_id    INTEGER PRIMARY KEY REFERENCES nodes(id) ON DELETE CASCADE,
    account_id INTEGER NOT NULL,
    folder_id  INTEGER NOT NULL,       -- the folder it was deleted from
    name       TEXT NOT NULL,          -- its name there
    deleted_on INTEGER NOT NULL        -- ns
);
CREATE INDEX deleted_by_folder ON deleted(folder_id, deleted_on);
CREATE INDEX deleted_by_age ON deleted(deleted_on);
CREATE INDEX versions_by_age ON versions(created_on);
";

/// Full-text search (issue 35, `store::search`): the text of each blob the indexer could read,
/// keyed by the bytes like previews (copies share it, a new version gets its own), in FTS5.
/// Which files match, and their paths, come from the tree at query time: a delete, a move or
/// a new version needs no change here, and a blob's text goes with the blob (trigger).
const V12: &str = "
CREATE TABLE search_docs (
    id     INTEGER PRIMARY KEY AUTOINCREMENT, -- the rowid of its text in search_text
    blob   TEXT NOT NULL UNIQUE,   -- sha256 of the bytes
    status INTEGER NOT NULL        -- 1 text indexed, 2 nothing to index (reason in the log)
);
CREATE VIRTUAL TABLE search_text USING fts5(body, tokenize = 'unicode61 remove_diacritics 2');
CREATE INDEX nodes_by_version ON nodes(current_version) WHERE current_version IS NOT NULL;
CREATE TRIGGER blobs_drop_search AFTER DELETE ON blobs BEGIN
    DELETE FROM search_text WHERE rowid IN (SELECT id FROM search_docs WHERE blob = OLD.hash);
    DELETE FROM search_docs WHERE blob = OLD.hash;
END;
";

/// WebDAV's dead properties (issue 50, `store::dav`): set by clients with PROPPATCH, kept by
/// node so that they follow moves, and go with the node. (V13 to V15 only add tables, each `IF
/// NOT EXISTS`: a database made older by dropping a later schema's own tables, as tests do,
/// still takes them.)
const V13: &str = "
CREATE TABLE IF NOT EXISTS dav_props (
    node_id   INTEGER NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
    namespace TEXT NOT NULL,           -- the property's XML namespace, '' for none
    name      TEXT NOT NULL,
    prefix    TEXT,                    -- the prefix the client wrote
    xml       BLOB,                    -- the value, as XML
    PRIMARY KEY (node_id, namespace, name)
);
";

/// App passwords (issue 50): one per device of a user's WebDAV clients (Finder and Explorer
/// cannot run the pin flow), kept as their sha256 like tokens, revoked one by one.
const V14: &str = "
CREATE TABLE IF NOT EXISTS app_passwords (
    hash         BLOB PRIMARY KEY,     -- sha256 of the password
    user_id      INTEGER NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    name         TEXT NOT NULL,        -- the device, as the user calls it
    created_on   INTEGER NOT NULL,
    last_used_on INTEGER               -- written at most hourly
);
CREATE UNIQUE INDEX IF NOT EXISTS app_passwords_by_user ON app_passwords(user_id, name);
";

/// WebDAV's locks (issue 50, `store::dav`): in the database so that every server of one store
/// sees them; by the path they were taken on (a lock may name a path nothing is at yet), read
/// by account (the path's first segment); an expired one is no longer read, and goes with the
/// next lock taken.
const V15: &str = "
CREATE TABLE IF NOT EXISTS dav_locks (
    token        TEXT PRIMARY KEY,     -- urn:uuid:...
    account      TEXT NOT NULL,        -- the first segment of path
    path         TEXT NOT NULL,        -- below /dav, percent-encoded as WebDAV spells it
    principal    TEXT,                 -- the e-mail that took it
    owner        TEXT,                 -- the client's owner element, as XML
    shared       INTEGER NOT NULL,
    deep         INTEGER NOT NULL,
    timeout_secs INTEGER,
    expires_on   INTEGER               -- ns; NULL: never
);
CREATE INDEX IF NOT EXISTS dav_locks_by_account ON dav_locks(account);
CREATE INDEX IF NOT EXISTS dav_locks_by_expiry ON dav_locks(expires_on);
";

/// What each WebDAV device was shown (issue 50, `store::seen`), so that a PUT without
/// preconditions over a version it never saw keeps both: a file's version it was answered, or
/// for a folder it listed, the account's newest change then. One row per device and node (a
/// listing of 10,000 files is one row), pruned after a week; no key to `nodes` (a row of a
/// node deleted is never read again, node IDs are not reused, and it ages out).
const V16: &str = "
CREATE TABLE IF NOT EXISTS dav_seen (
    device  BLOB NOT NULL,             -- sha256 of the secret it signs in with
    node_id INTEGER NOT NULL,
    md5     TEXT,                      -- a file: the version it was answered
    change_id INTEGER,                 -- a folder: changes.id, newest of its account, when listed
    at      INTEGER NOT NULL,          -- ns; rewritten at least daily while in use
    PRIMARY KEY (device, node_id)
);
CREATE INDEX IF NOT EXISTS dav_seen_by_age ON dav_seen(at);
";

/// Adds the columns of the preview cache to a database from before it (idempotent). Ready
/// previews of such a database have their sizes measured once the threads start.
pub fn preview_cache_columns(conn: &Connection) -> rusqlite::Result<()> {
    let has = conn
        .prepare("SELECT 1 FROM pragma_table_info('previews') WHERE name = 'requested'")?
        .exists([])?;
    if !has {
        conn.execute_batch(
            "ALTER TABLE previews ADD COLUMN bytes INTEGER NOT NULL DEFAULT 0;  -- on disk, 4 KiB blocks; -1: not measured yet
             ALTER TABLE previews ADD COLUMN used_on INTEGER NOT NULL DEFAULT 0; -- last asked for (ns)
             ALTER TABLE previews ADD COLUMN requested INTEGER NOT NULL DEFAULT 0; -- 1: somebody asked for it
             UPDATE previews SET bytes = -1 WHERE status = 1;",
        )?;
    }
    Ok(())
}

/// Opens the connection's pragmas and brings the schema to the current version.
pub fn prepare(conn: &mut Connection) -> rusqlite::Result<()> {
    prepare_to(conn, VERSION)
}

/// The same up to version `target` (tests make older databases with it).
pub(crate) fn prepare_to(conn: &mut Connection, target: i64) -> rusqlite::Result<()> {
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    // Transactions take the write lock when they begin: a deferred one that reads first and
    // writes later fails at once (SQLITE_BUSY_SNAPSHOT, not retried by the busy timeout) when
    // another connection wrote in between (the preview threads, a server beside a mount).
    conn.set_transaction_behavior(rusqlite::TransactionBehavior::Immediate);
    conn.pragma_update(None, "journal_mode", "WAL")?;
    // NORMAL in WAL mode: every transaction is atomic and survives a crash; the few whose
    // durability across a power cut matters (a version becoming current, after which a client
    // drops its copy) run with FULL (`Durable`), which also makes all before them durable.
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    // Statement journals (each savepoint of a batch writes the pages it changes there) and
    // temporary tables in memory: on disk they were most of a create burst's writes, to a
    // file that is deleted unread.
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if version < 1 {
        let tx = conn.transaction()?;
        tx.execute_batch(V1)?;
        tx.pragma_update(None, "user_version", 1)?;
        tx.commit()?;
    }
    for (to, sql) in [
        (2, V2),
        (3, V3),
        (4, V4),
        (5, V5),
        (6, V6),
        (7, V7),
        (8, V8),
        (9, V9),
        (10, V10),
        (11, V11),
        (12, V12),
        (13, V13),
        (14, V14),
        (15, V15),
        (16, V16),
    ] {
        if version < to && to <= target {
            let tx = conn.transaction()?;
            if to == 7 {
                // V7 copies the cache's columns, which older stores added when they opened.
                preview_cache_columns(&tx)?;
            }
            tx.execute_batch(sql)?;
            tx.pragma_update(None, "user_version", to)?;
            tx.commit()?;
        }
    }
    debug_assert_eq!(
        conn.query_row("PRAGMA user_version", [], |r| r.get::<_, i64>(0))?,
        target.max(version)
    );
    Ok(())
}

/// Makes the transactions of its lifetime durable across a power cut, once [`Durable::done`]
/// says so, then returns the connection to commits that are atomic and crash-safe but not
/// flushed one by one: SQLite's `synchronous` FULL (the WAL fsynced at commit) and NORMAL,
/// PostgreSQL's `synchronous_commit` on and off (a commit returns before its WAL is flushed; a
/// power cut loses at most the last few hundred milliseconds of such commits, never a part of
/// one). So on either engine only the commits after which a client drops its copy (the group
/// commits of upload step 3) wait for the disk, and the many small transactions around them
/// (steps 1 and 2, blob holds) do not.
///
/// On PostgreSQL the commit itself is not flushed either: [`Durable::done`] flushes the WAL up
/// to it afterwards, once the writers' lock (released at the commit) is free for the next
/// writer, so that the servers of a store do not wait for each other's disk flushes, and
/// flushes that overlap are one (PostgreSQL flushes all the WAL written so far).
pub struct Durable<'a>(&'a super::db::Conn);

impl<'a> Durable<'a> {
    pub fn new(conn: &'a super::db::Conn) -> super::db::Result<Durable<'a>> {
        if !conn.is_pg() {
            conn.execute_batch("PRAGMA synchronous = FULL")?;
        }
        Ok(Durable(conn))
    }

    /// After the commits: durable once this returns (PostgreSQL: a transaction of its own
    /// committed with `synchronous_commit` on, whose commit record comes after theirs in the
    /// WAL, so that waiting for it to be flushed waits for them; an ID is what makes it write
    /// that record).
    pub fn done(self) -> super::db::Result<()> {
        if self.0.is_pg() {
            self.0.execute_batch(
                "BEGIN; SET LOCAL synchronous_commit = on; SELECT txid_current(); COMMIT",
            )?;
        }
        Ok(())
    }
}

impl Drop for Durable<'_> {
    fn drop(&mut self) {
        if !self.0.is_pg() {
            if let Err(e) = self.0.execute_batch("PRAGMA synchronous = NORMAL") {
                log::warn!("could not reset synchronous: {e}");
            }
        }
    }
}
