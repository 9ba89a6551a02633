//! Previews on a shared store: kept in the bucket, so a preview one server made is read
//! through the other, and the bound of the previews holds across servers.

use super::*;

/// The keys under `prefix` in the test bucket (moto takes unsigned requests).
async fn bucket_keys(cluster: &Cluster, prefix: &str) -> Vec<String> {
    let BlobLocation::Bucket(l) = &cluster.location else {
        unreachable!("a bucket")
    };
    let endpoint = l.endpoint.as_deref().unwrap();
    let xml = reqwest::Client::new()
        .get(format!("{endpoint}/{}", l.bucket))
        .query(&[
            ("list-type", "2"),
            ("prefix", &format!("{}{prefix}", l.prefix)),
        ])
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!xml.contains("<IsTruncated>true"), "{xml}");
    xml.split("<Key>")
        .skip(1)
        .map(|k| k.split("</Key>").next().unwrap()[l.prefix.len()..].to_string())
        .collect()
}

/// Every page of a ready preview at 100%, and its PDF.
async fn preview_bytes<B: Backend>(b: &B, id: &str, pages: usize) -> Vec<Bytes> {
    use futures_util::StreamExt;
    let mut out = Vec::new();
    for page in 1..=pages as u32 {
        out.push(
            b.preview_page(id, page, Default::default())
                .await
                .unwrap()
                .data,
        );
    }
    let mut pdf = b.preview_pdf(id).await.unwrap();
    let mut bytes = Vec::new();
    while let Some(c) = pdf.body.next().await {
        bytes.extend_from_slice(&c.unwrap());
    }
    out.push(bytes.into());
    out
}

fn sha256hex(data: &[u8]) -> String {
    vaultfs::api::checksum::hex(&sha2::Sha256::digest(data))
}

/// Previews are kept in the bucket: a preview rendered by one server is read, byte for byte,
/// through the other, which renders nothing; none is left on either server's disk or under a
/// temporary key.
#[tokio::test(flavor = "multi_thread")]
async fn a_preview_made_by_one_server_is_read_through_the_other() {
    let Some(cluster) = Cluster::with_bucket() else {
        return;
    };
    // Deletes final (no versions kept): a file deleted under the default rule stays
    // restorable, with its bytes and previews, for the age bound (`store::expire`).
    let final_deletes = ["--keep-versions", "0"];
    let one = cluster.serve_with("one", common::free_port(), &final_deletes);
    let two = cluster.serve_with("two", common::free_port(), &final_deletes);
    let token = common::login(&one.base(), "a@acme.test", "pw-a").await;
    let (a, b) = (
        client(&one, "a@acme.test", &token),
        client(&two, "a@acme.test", &token),
    );
    let text = Bytes::from(common::fixtures::sample_text());
    let id = put(&a, "notes.txt", text.clone()).await;
    let pages = common::preview_pages_when_ready(&a, &id, 120).await;
    assert!(pages >= 1);
    let from_one = preview_bytes(&a, &id, pages).await;
    let sizes = |m: vaultfs::api::PreviewMeta| {
        let pages: Vec<_> = m
            .pages
            .iter()
            .map(|p| (p.page_number, p.width, p.height))
            .collect();
        (m.status, pages)
    };
    assert_eq!(
        sizes(b.preview(&id).await.unwrap()),
        sizes(a.preview(&id).await.unwrap())
    );
    let from_two = preview_bytes(&b, &id, pages).await;
    assert_eq!(from_one.len(), from_two.len());
    for (i, (x, y)) in from_one.iter().zip(&from_two).enumerate() {
        assert!(!x.is_empty() && x == y, "file {i} of the preview differs");
    }

    assert!(
        one.logged().contains("preview of notes.txt done"),
        "{}",
        one.logged()
    );
    assert!(!two.logged().contains("preview of"), "{}", two.logged());
    let hash = sha256hex(&text);
    let mut keys = bucket_keys(&cluster, "previews/").await;
    keys.sort();
    let mut expected: Vec<String> = (1..=pages)
        .map(|n| format!("previews/{hash}/text/page-{n:04}.png"))
        .collect();
    expected.push(format!("previews/{hash}/text/document.pdf"));
    expected.sort();
    assert_eq!(
        keys, expected,
        "only the preview's files, under their names"
    );
    for node in [&one, &two] {
        let local: Vec<_> = std::fs::read_dir(node.data.join("previews"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            local,
            ["tmp"],
            "nothing but the staging folder on local disk"
        );
    }
    // Gone with the file's bytes, from the bucket too.
    b.delete(&at("notes.txt")).await.unwrap();
    assert!(bucket_keys(&cluster, "previews/").await.is_empty());
}

/// The bound of the previews holds on a shared store: a server making room removes the
/// objects of the previews it evicts from the bucket, whichever server made them, and an
/// evicted preview asked for again is made again and read through either server.
#[tokio::test(flavor = "multi_thread")]
async fn previews_evicted_on_a_shared_store_leave_the_bucket() {
    let Some(cluster) = Cluster::with_bucket() else {
        return;
    };
    // Room for one preview at a time.
    let small = ["--preview-cache-size", "1"];
    let one = cluster.serve_with("one", common::free_port(), &small);
    let two = cluster.serve_with("two", common::free_port(), &small);
    let token = common::login(&one.base(), "a@acme.test", "pw-a").await;
    let (a, b) = (
        client(&one, "a@acme.test", &token),
        client(&two, "a@acme.test", &token),
    );
    let first = Bytes::from(common::fixtures::sample_text());
    let mut second = common::fixtures::sample_text();
    second.extend_from_slice(b"one more line\n");
    let second = Bytes::from(second);
    let (h1, h2) = (sha256hex(&first), sha256hex(&second));
    let id1 = put(&a, "first.txt", first).await;
    let id2 = put(&a, "second.txt", second).await;

    let pages1 = common::preview_pages_when_ready(&a, &id1, 120).await;
    let made_by_one = preview_bytes(&a, &id1, pages1).await;
    assert!(
        !bucket_keys(&cluster, &format!("previews/{h1}/"))
            .await
            .is_empty()
    );
    // Two makes the second one, and room for it: the first one's objects go.
    common::preview_pages_when_ready(&b, &id2, 120).await;
    assert!(
        bucket_keys(&cluster, &format!("previews/{h1}/"))
            .await
            .is_empty(),
        "the evicted preview's objects are still in the bucket"
    );
    assert!(
        !bucket_keys(&cluster, &format!("previews/{h2}/"))
            .await
            .is_empty()
    );
    // Asked for again through one: made again (and the second one evicted in turn), and the
    // same through two.
    assert_eq!(
        common::preview_pages_when_ready(&a, &id1, 120).await,
        pages1
    );
    assert_eq!(preview_bytes(&b, &id1, pages1).await, made_by_one);
    assert!(
        bucket_keys(&cluster, &format!("previews/{h2}/"))
            .await
            .is_empty()
    );
    assert!(bucket_keys(&cluster, "previews/tmp/").await.is_empty());
}
