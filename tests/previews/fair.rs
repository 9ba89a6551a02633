//! The search index is fair across accounts (issue 47, item 8): one account's PDFs that take
//! their text extractor half a minute each hold no other account's new file unsearchable.

use std::io::Write;
use std::time::{Duration, Instant};

use flate2::Compression;
use flate2::write::ZlibEncoder;

use super::{put, sha256};
use crate::common;
use vaultfs::api::NodePath;
use vaultfs::backend::Backend;
use vaultfs::server::ServerOptions;

/// A PDF of 40 pages sharing one content stream of a million fills (58 KB): its text takes the
/// extractor about half a minute (14 s for 20 pages on the machine this was written on). `tag`
/// makes each one's bytes different.
fn slow_pdf(tag: usize) -> Vec<u8> {
    const PAGES: usize = 40;
    let content = "0.5 g 0 0 612 792 re f\n".repeat(1_000_000 + tag);
    let mut z = ZlibEncoder::new(Vec::new(), Compression::best());
    z.write_all(content.as_bytes()).unwrap();
    let data = z.finish().unwrap();
    let kids: Vec<String> = (0..PAGES).map(|i| format!("{} 0 R", 3 + i)).collect();
    let mut objects = vec![
        b"<< /Type /Catalog /Pages 2 0 R >>".to_vec(),
        format!(
            "<< /Type /Pages /Kids [{}] /Count {PAGES} >>",
            kids.join(" ")
        )
        .into_bytes(),
    ];
    for _ in 0..PAGES {
        objects.push(
            format!(
                "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {} 0 R >>",
                3 + PAGES
            )
            .into_bytes(),
        );
    }
    objects.push(
        [
            format!(
                "<< /Length {} /Filter /FlateDecode >>\nstream\n",
                data.len()
            )
            .as_bytes(),
            &data,
            b"\nendstream",
        ]
        .concat(),
    );
    common::fixtures::pdf_of_objects(&objects)
}

#[tokio::test(flavor = "multi_thread")]
async fn one_accounts_slow_pdfs_hold_no_other_accounts_new_file() {
    let s =
        common::TestServer::start_with(common::served_retention(), ServerOptions::default()).await;
    let (alice, bob) = super::search::alice_and_bob(&s).await;
    let acme = NodePath::parse_uri("/nodes/pth/Acme/My First Vault").unwrap();
    let bobco = NodePath::parse_uri("/nodes/pth/Bobco/My First Vault").unwrap();

    let pdfs: Vec<Vec<u8>> = (0..3).map(slow_pdf).collect();
    let last = pdfs.iter().map(|p| sha256(p)).max().unwrap();
    for (i, pdf) in pdfs.iter().enumerate() {
        put(&alice, &acme, &format!("slow{i}.pdf"), pdf).await;
    }
    // The indexer starts on them once the store is idle (1.5 s after the last write).
    tokio::time::sleep(Duration::from_secs(3)).await;

    // Bob's file's bytes sort after Alice's (taken in the order of their hashes, it came last).
    let mine = (0..)
        .map(|i| format!("bob keeps zebrafish ({i})").into_bytes())
        .find(|b| sha256(b) > last)
        .unwrap();
    let asked = Instant::now();
    put(&bob, &bobco, "mine.txt", &mine).await;
    loop {
        let hits = bob
            .search(&NodePath::root(), "zebrafish", 10)
            .await
            .unwrap()
            .hits;
        if hits.len() == 1 {
            break;
        }
        assert!(
            asked.elapsed() < Duration::from_secs(15),
            "Bob's new file not searchable after {:?}: the index is held by Alice's PDFs",
            asked.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("Bob's file searchable after {:?}", asked.elapsed());
    s.stop().await;
}
