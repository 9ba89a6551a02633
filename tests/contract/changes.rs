//! The change feed through [`Backend::changes`]: the local backend reads the store's log, the
//! remote one `GET /changes` of `vaultfs serve`; against the public service's dialect there is
//! none (404), and the call says so instead of failing, for the mount to poll.

use std::time::{Duration, Instant};

use vaultfs::api::{ChangeKind, ChangesPage, NodeType};
use vaultfs::backend::Backend;

use crate::{Keep, World, at};

fn kinds(page: &ChangesPage) -> Vec<(ChangeKind, NodeType, String, Option<String>)> {
    page.changes
        .iter()
        .map(|c| (c.kind, c.node_type, c.uri.clone(), c.from_uri.clone()))
        .collect()
}

pub async fn change_feed<B: Backend>(w: &World<B>) {
    let Some(start) = w.a.changes(None, Duration::ZERO).await.unwrap() else {
        assert!(
            matches!(w._keep, Keep::Dialect(_)),
            "only a server without the route has no feed"
        );
        return;
    };
    assert!(start.changes.is_empty() && !start.reset);
    let fed = at(&w.vault, "fed");
    let began = Instant::now();
    let (page, made) = tokio::join!(
        w.a.changes(Some(start.cursor), Duration::from_secs(10)),
        async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            w.a.create_folder(&fed).await.unwrap();
            Instant::now()
        }
    );
    let page = page.unwrap().unwrap();
    let late = began.elapsed().saturating_sub(made - began);
    assert!(
        late < Duration::from_millis(500),
        "answered {late:?} after the change"
    );
    assert_eq!(
        kinds(&page),
        vec![(
            ChangeKind::Created,
            NodeType::FolderNodeType,
            fed.uri(),
            None
        )]
    );
    // Another account's changes wake nothing here and never show.
    let (mine, ()) = tokio::join!(
        w.a.changes(Some(page.cursor), Duration::from_secs(1)),
        async {
            w.other
                .create_folder(&at(&w.other_vault, "theirs"))
                .await
                .unwrap();
        }
    );
    let mine = mine.unwrap().unwrap();
    assert!(
        mine.changes.is_empty() && mine.cursor == page.cursor,
        "{mine:?}"
    );
    // A move and a delete, read on from the cursor.
    let moved = at(&w.vault, "fed2");
    w.a.rename(&fed, &moved, false).await.unwrap();
    w.a.delete(&moved).await.unwrap();
    let next =
        w.a.changes(Some(page.cursor), Duration::ZERO)
            .await
            .unwrap()
            .unwrap();
    assert_eq!(
        kinds(&next),
        vec![
            (
                ChangeKind::Moved,
                NodeType::FolderNodeType,
                moved.uri(),
                Some(fed.uri())
            ),
            (
                ChangeKind::Deleted,
                NodeType::FolderNodeType,
                moved.uri(),
                None
            ),
        ]
    );
    // A cursor this store never gave: reset, and the current cursor.
    let stale =
        w.a.changes(Some(next.cursor + 1_000_000), Duration::ZERO)
            .await
            .unwrap()
            .unwrap();
    assert!(stale.reset && stale.cursor == next.cursor, "{stale:?}");
}
