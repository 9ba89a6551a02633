//! The schema is written twice (store/schema.rs for SQLite, store/schema_pg.rs for
//! PostgreSQL): a store made on each must have the same tables, the same columns in them and
//! the same indexes (by name, table and columns), so the two cannot drift apart unseen.

use std::collections::BTreeSet;

use vaultfs::store::db::{Conn, Engine, Value};
use vaultfs::store::{Store, StoreConfig};

type Shape = (
    BTreeSet<(String, String)>,
    BTreeSet<(String, String, String)>,
);

/// The rows of `sql`, of `n` text columns.
fn texts(conn: &Conn, n: usize, sql: &str) -> Vec<Vec<String>> {
    let mut stmt = conn.prepare(sql).unwrap();
    stmt.query_map([], |r| {
        Ok((0..n)
            .map(|i| match r.get::<_, Value>(i).unwrap() {
                Value::Text(s) => s,
                other => panic!("{sql}: {other:?}"),
            })
            .collect())
    })
    .unwrap()
    .map(Result::unwrap)
    .collect()
}

/// (table, column) and (index, table, columns) of SQLite's store.
fn sqlite_shape(conn: &Conn) -> Shape {
    let columns = texts(
        conn,
        2,
        "SELECT m.name, p.name FROM sqlite_master m, pragma_table_info(m.name) p \
         WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite_%'",
    );
    let indexes = texts(
        conn,
        3,
        "SELECT m.name, m.tbl_name, group_concat(i.name, ',' ORDER BY i.seqno) FROM \
         (SELECT name, tbl_name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL) m, \
         pragma_index_info(m.name) i GROUP BY m.name, m.tbl_name",
    );
    shape(columns, indexes)
}

/// The same of PostgreSQL's (its primary keys' and unique constraints' own indexes left out,
/// as SQLite lists none for them).
fn pg_shape(conn: &Conn) -> Shape {
    let columns = texts(
        conn,
        2,
        "SELECT table_name::text, column_name::text FROM information_schema.columns \
         WHERE table_schema = 'public'",
    );
    let indexes = texts(
        conn,
        3,
        "SELECT i.relname::text, t.relname::text, \
             string_agg(a.attname::text, ',' ORDER BY k.n) \
         FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid \
             JOIN pg_class t ON t.oid = x.indrelid \
             JOIN pg_namespace s ON s.oid = t.relnamespace AND s.nspname = 'public' \
             CROSS JOIN LATERAL unnest(x.indkey) WITH ORDINALITY AS k(attnum, n) \
             JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.attnum \
         WHERE NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.oid) \
         GROUP BY i.relname, t.relname",
    );
    shape(columns, indexes)
}

fn shape(columns: Vec<Vec<String>>, indexes: Vec<Vec<String>>) -> Shape {
    (
        columns
            .into_iter()
            .map(|r| (r[0].clone(), r[1].clone()))
            .collect(),
        indexes
            .into_iter()
            .map(|r| (r[0].clone(), r[1].clone(), r[2].clone()))
            .collect(),
    )
}

#[test]
fn sqlite_and_postgres_define_the_same_tables_columns_and_indexes() {
    let Some(pg) = crate::common::pg::pg() else {
        return;
    };
    let database = pg.database();
    let dir = tempfile::tempdir().unwrap();
    let made = |sub: &str, database: Option<String>| {
        let path = dir.path().join(sub);
        std::fs::create_dir_all(&path).unwrap();
        let config = StoreConfig {
            database,
            ..StoreConfig::default()
        };
        std::thread::spawn(move || drop(Store::open(&path, config).unwrap()))
            .join()
            .unwrap();
    };
    made("lite", None);
    made("pg", Some(database.clone()));
    let lite = Engine::Sqlite(dir.path().join("lite/vault.db"))
        .connect()
        .unwrap();
    let (lite_columns, lite_indexes) = sqlite_shape(&lite);
    let lite_version: i64 = lite
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    let ((pg_columns, pg_indexes), pg_version) = std::thread::spawn(move || {
        let conn = Engine::Postgres(database).connect().unwrap();
        let version: Value = conn
            .query_row(
                "SELECT value FROM settings WHERE name = 'schema_version'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        (pg_shape(&conn), version)
    })
    .join()
    .unwrap();
    // Both engines at the same schema version, so the shapes below are of the same schema.
    assert_eq!(
        pg_version,
        Value::Blob(lite_version.to_string().into_bytes()),
        "schema versions"
    );
    // What PostgreSQL keeps as rows that SQLite keeps as files beside vault.db (`settings`),
    // or in the one process's memory (`blob_holds`, the holds of every server of the store).
    let pg_only: BTreeSet<&str> = ["settings", "blob_holds"].into();
    let pg_columns: BTreeSet<_> = pg_columns
        .into_iter()
        .filter(|(t, _)| !pg_only.contains(t.as_str()))
        .collect();
    let pg_indexes: BTreeSet<_> = pg_indexes
        .into_iter()
        .filter(|(_, t, _)| !pg_only.contains(t.as_str()))
        .collect();
    // The full-text index is each engine's own (schema 12): SQLite's FTS5 table `search_text`
    // with the shadow tables FTS5 makes, PostgreSQL's text and tsvector columns of
    // `search_docs` (and its GIN index), which both engines have otherwise.
    let fts_lite = |t: &str| t == "search_text" || t.starts_with("search_text_");
    let lite_columns: BTreeSet<_> = lite_columns
        .into_iter()
        .filter(|(t, _)| !fts_lite(t))
        .collect();
    let lite_indexes: BTreeSet<_> = lite_indexes
        .into_iter()
        .filter(|(_, t, _)| !fts_lite(t))
        .collect();
    let fts_pg =
        |t: &str, c: &str| t == "search_docs" && c.split(',').any(|c| c == "body" || c == "tsv");
    let pg_columns: BTreeSet<_> = pg_columns
        .into_iter()
        .filter(|(t, c)| !fts_pg(t, c))
        .collect();
    let pg_indexes: BTreeSet<_> = pg_indexes
        .into_iter()
        .filter(|(_, t, c)| !fts_pg(t, c))
        .collect();
    assert!(lite_columns.len() > 20, "{lite_columns:?}");
    // The newest schema's (11: deleted files kept restorable) is among what is compared: the
    // catalogue queries see every table and index, not an older subset.
    for (table, column) in [("deleted", "folder_id"), ("versions", "created_on")] {
        assert!(
            lite_columns.contains(&(table.to_string(), column.to_string())),
            "{table}.{column} not listed"
        );
    }
    for (index, table, columns) in [
        ("deleted_by_folder", "deleted", "folder_id,deleted_on"),
        ("deleted_by_age", "deleted", "deleted_on"),
        ("versions_by_age", "versions", "created_on"),
    ] {
        let row = (index.to_string(), table.to_string(), columns.to_string());
        assert!(lite_indexes.contains(&row), "{row:?} not listed");
    }
    assert_eq!(
        lite_columns
            .symmetric_difference(&pg_columns)
            .collect::<Vec<_>>(),
        Vec::<&(String, String)>::new(),
        "columns of one engine only"
    );
    assert_eq!(
        lite_indexes
            .symmetric_difference(&pg_indexes)
            .collect::<Vec<_>>(),
        Vec::<&(String, String, String)>::new(),
        "indexes of one engine only"
    );
}
