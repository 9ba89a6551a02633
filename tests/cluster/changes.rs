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
    let mut cursor = b.changes(None, Duration::ZERO).await.unwrap().unwrap().cursor;
    // Each way, a few times: made at one server, heard at the other.
    for (i, (writer, reader)) in [(&a, &b), (&b, &a), (&a, &b)].into_iter().enumerate() {
        let folder = at(&format!("f{i}"));
        let (page, made) = tokio::join!(reader.changes(Some(cursor), Duration::from_secs(20)), async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            writer.create_folder(&folder).await.unwrap();
            Instant::now()
        });
        let page = page.unwrap().unwrap();
        let late = made.elapsed();
        eprintln!("heard at the other server {late:?} after the change");
        assert!(late < Duration::from_secs(1), "{late:?}");
        assert_eq!(page.changes.len(), 1, "{page:?}");
        let c = &page.changes[0];
        assert_eq!((c.kind, c.node_type, c.uri.clone()), (ChangeKind::Created, NodeType::FolderNodeType, folder.uri()));
        cursor = page.cursor;
    }
    // As many waiters at two as a user may hold (16), 10 s: next to no CPU at either server.
    let creds = common::Creds {
        email: "a@acme.test".into(),
        token: token.clone(),
    };
    let polls = common::long_polls(&two.base(), &creds, 16).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = (common::cpu_time(one.child.id()), common::cpu_time(two.child.id()));
    tokio::time::sleep(Duration::from_secs(10)).await;
    let used = (
        common::cpu_time(one.child.id()) - before.0,
        common::cpu_time(two.child.id()) - before.1,
    );
    eprintln!("16 long polls held 10 s at two: CPU {used:?} (one, two)");
    assert!(polls.iter().all(|p| !p.is_finished()), "a poll answered with nothing changed");
    assert!(used.0 <= Duration::from_millis(50) && used.1 <= Duration::from_millis(50), "{used:?}");
    a.delete(&at("f0")).await.unwrap();
    for p in polls {
        let page = tokio::time::timeout(Duration::from_secs(2), p).await.unwrap().unwrap();
        assert_eq!(page["message"]["changes"][0]["kind"], "deleted");
    }
}
