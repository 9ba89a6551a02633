//! The change feed across the servers of one store: a change made through one server wakes a
//! long poll waiting at the other (PostgreSQL's LISTEN/NOTIFY), within a second; waiting costs
//! the servers next to nothing.

use std::time::{Duration, Instant};

use vaultfs::api::{ChangeKind, NodeType};
use vaultfs::backend::Backend;

use crate::{Sign, at, clients, common, two_servers};

#[tokio::test(flavor = "multi_thread")]
async fn a_change_at_one_server_wakes_a_waiter_at_the_other() {
    let Some((_cluster, one, two, token)) = two_servers(Sign::AtOne).await else {
        return;
    };
    let (a, b) = clients(&one, &two, &token);
    let mut cursor = b
        .changes(None, Duration::ZERO)
        .await
        .unwrap()
        .unwrap()
        .cursor;
    // Each way, a few times: made at one server, heard at the other.
    for (i, (writer, reader)) in [(&a, &b), (&b, &a), (&a, &b)].into_iter().enumerate() {
        let folder = at(&format!("f{i}"));
        let (page, made) = tokio::join!(
            reader.changes(Some(cursor), Duration::from_secs(20)),
            async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                writer.create_folder(&folder).await.unwrap();
                Instant::now()
            }
        );
        let page = page.unwrap().unwrap();
        let late = made.elapsed();
        eprintln!("heard at the other server {late:?} after the change");
        assert!(late < Duration::from_secs(1), "{late:?}");
        assert_eq!(page.changes.len(), 1, "{page:?}");
        let c = &page.changes[0];
        assert_eq!(
            (c.kind, c.node_type, c.uri.clone()),
            (ChangeKind::Created, NodeType::FolderNodeType, folder.uri())
        );
        cursor = page.cursor;
    }
    // As many waiters at two as a user may hold (16), 10 s: next to no CPU at either server.
    let creds = common::Creds {
        email: "a@acme.test".into(),
        token: token.clone(),
    };
    let polls = common::long_polls(&two.base(), &creds, 16).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = (
        common::cpu_time(one.child.id()),
        common::cpu_time(two.child.id()),
    );
    tokio::time::sleep(Duration::from_secs(10)).await;
    let used = (
        common::cpu_time(one.child.id()) - before.0,
        common::cpu_time(two.child.id()) - before.1,
    );
    eprintln!("16 long polls held 10 s at two: CPU {used:?} (one, two)");
    assert!(
        polls.iter().all(|p| !p.is_finished()),
        "a poll answered with nothing changed"
    );
    assert!(
        used.0 <= Duration::from_millis(50) && used.1 <= Duration::from_millis(50),
        "{used:?}"
    );
    a.delete(&at("f0")).await.unwrap();
    for p in polls {
        let page = tokio::time::timeout(Duration::from_secs(2), p)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(page["message"]["changes"][0]["kind"], "deleted");
    }
}

/// A database made by a vaultfs of schema 9 gets the change log when a server opens it, and
/// its tree and users stay as they were.
#[test]
fn a_database_of_schema_9_gets_the_change_log() {
    use vaultfs::store::db::Engine;
    use vaultfs::store::{Scope, Store, StoreConfig};
    let Some(pg) = common::pg::pg() else {
        return;
    };
    let database = pg.database();
    let tmp = tempfile::tempdir().unwrap();
    let config = || StoreConfig {
        database: Some(database.clone()),
        blobs: vaultfs::store::BlobLocation::Dir(tmp.path().join("blobs")),
        ..StoreConfig::default()
    };
    let store = Store::open(&tmp.path().join("one"), config()).unwrap();
    store.add_user("a@acme.test", "Acme", "pw-a").unwrap();
    store.create_folder(Scope::All, &at("kept")).unwrap();
    drop(store);
    // As schema 9 was: no change log (and none of schema 11's deleted files, 12's search
    // index, 13's WebDAV properties, 14's app passwords, 15's locks or 16's WebDAV seen).
    let conn = Engine::Postgres(database.clone()).connect().unwrap();
    let version = || -> Vec<u8> {
        conn.query_row(
            "SELECT value FROM settings WHERE name = 'schema_version'",
            [],
            |r| r.get(0),
        )
        .unwrap()
    };
    let newest = version();
    conn.execute_batch(
        "DROP TABLE changes; DROP TABLE change_floors;
         DROP TABLE deleted; DROP INDEX versions_by_age;
         DROP TABLE search_docs; DROP INDEX nodes_by_version;
         DROP TRIGGER blobs_drop_search ON blobs; DROP FUNCTION blobs_drop_search();
         DROP TABLE dav_props; DROP TABLE app_passwords; DROP TABLE dav_locks; DROP TABLE dav_seen;
         UPDATE settings SET value = convert_to('9', 'UTF8') WHERE name = 'schema_version'",
    )
    .unwrap();
    let store = Store::open(&tmp.path().join("two"), config()).unwrap();
    assert!(store.node(Scope::All, &at("kept")).is_ok());
    let head = store.changes(Scope::All, None, 10).unwrap().cursor;
    store.create_folder(Scope::All, &at("new")).unwrap();
    let page = store.changes(Scope::All, Some(head), 10).unwrap();
    assert_eq!(page.changes.len(), 1, "{page:?}");
    assert_eq!(page.changes[0].uri, at("new").uri());
    // Brought forward to the newest schema, past 10 too.
    assert_eq!(version(), newest);
}
