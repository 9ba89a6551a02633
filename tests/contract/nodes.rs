//! The contract: nodes and their paging, folders, creating files, starting versions, attributes,
//! and other accounts' nodes.

use std::time::{Duration, SystemTime};

use vaultfs::api::{ErrorKind, NodePath, NodeType, file_mode, whole_mode};
use vaultfs::backend::{Backend, list_all};

use crate::common::md5hex;
use crate::{World, assert_err, at, content, names, path, put, stream};

pub(crate) async fn nodes_and_paging<B: Backend>(w: &World<B>) {
    let b = &w.a;
    let vault = b.node(&w.vault).await.unwrap();
    assert_eq!(vault.node_type, NodeType::VaultNodeType);
    assert_eq!(vault.name, "My First Vault");
    assert_eq!(vault.uri, "/nodes/pth/Acme/My First Vault");
    // The root shows the caller's account only.
    assert_eq!(names(b, &NodePath::root()).await, ["Acme"]);

    let dir = at(&w.vault, "paging");
    b.create_folder(&dir).await.unwrap();
    let mut all: Vec<String> = ["g", "c", "a", "f", "b", "e", "d"].map(String::from).into();
    for n in &all {
        put(b, &dir, n, n.as_bytes()).await;
    }
    all.sort();
    let mut pages = Vec::new();
    for page in 0..4 {
        let n = b.list(&dir, page, 3).await.unwrap();
        assert_eq!(n.total_children, Some(7));
        assert_eq!(n.name, "paging");
        let got: Vec<String> = n.children.unwrap().into_iter().map(|c| c.name).collect();
        assert_eq!(got.len(), [3, 3, 1, 0][page as usize], "page {page}");
        pages.extend(got);
    }
    assert_eq!(pages, all);
    let whole = list_all(b, &dir, 2).await.unwrap();
    assert_eq!(whole.total_children, Some(7));
    let kids = whole.children.unwrap();
    assert_eq!(kids.iter().map(|c| c.name.clone()).collect::<Vec<_>>(), all);
    assert!(kids.iter().all(|c| c.is_file() && c.size == Some(1)));

    let f = b.node(&at(&dir, "c")).await.unwrap();
    let id = f.file_id().unwrap();
    assert!(f.is_file());
    assert_eq!((f.name.as_str(), f.size), ("c", Some(1)));
    assert_eq!(f.uri, "/nodes/pth/Acme/My First Vault/paging/c");
    assert_eq!(f.md5_checksum.as_deref(), Some(md5hex(b"c").as_str()));
    for link in [&f.link_uri, &f.preview_link_uri, &f.download_link_uri] {
        assert!(link.as_deref().unwrap().ends_with(&format!("&id={id}")));
    }
    assert!(f.download_uri.as_deref().unwrap().ends_with(&id));
    assert!(f.created_time().is_some() && f.modified_time().is_some());

    // Names that need encoding on the request line come back as they were.
    let odd = at(&w.vault, "Résumé & notes #1 %20?+");
    b.create_folder(&odd).await.unwrap();
    put(b, &odd, "a b;c=d.txt", b"x").await;
    assert_eq!(b.node(&odd).await.unwrap().name, "Résumé & notes #1 %20?+");
    assert_eq!(names(b, &odd).await, ["a b;c=d.txt"]);

    assert_err(
        b.node(&at(&w.vault, "nope")).await,
        ErrorKind::NotFound,
        None,
    );
    assert_err(
        b.list(&at(&w.vault, "nope"), 0, 10).await,
        ErrorKind::NotFound,
        None,
    );
}

pub(crate) async fn folders<B: Backend>(w: &World<B>) {
    let b = &w.a;
    let docs = at(&w.vault, "docs");
    let made = b.create_folder(&docs).await.unwrap();
    assert_eq!(made.node_type, NodeType::FolderNodeType);
    assert_eq!(
        (made.name.as_str(), made.uri.as_str()),
        ("docs", "/nodes/pth/Acme/My First Vault/docs")
    );
    let sub = b.create_folder(&at(&docs, "sub")).await.unwrap();
    assert_eq!(sub.name, "sub");
    assert_eq!(names(b, &docs).await, ["sub"]);

    assert_err(
        b.create_folder(&docs).await,
        ErrorKind::Conflict,
        Some("exists"),
    );
    assert_err(
        b.create_folder(&at(&w.vault, "missing/x")).await,
        ErrorKind::NotFound,
        None,
    );
    put(b, &docs, "f.txt", b"f").await;
    // A file already has the name; a file cannot hold a folder.
    assert_err(
        b.create_folder(&at(&docs, "f.txt")).await,
        ErrorKind::Conflict,
        None,
    );
    assert_err(
        b.create_folder(&at(&docs, "f.txt/x")).await,
        ErrorKind::Conflict,
        None,
    );
    // Vaults come with accounts.
    assert_err(
        b.create_folder(&path("/Acme/Second Vault")).await,
        ErrorKind::Forbidden,
        None,
    );
}

pub(crate) async fn create_file_cases<B: Backend>(w: &World<B>) {
    let b = &w.a;
    let f = b.create_file(&w.vault, "new.txt").await.unwrap();
    let id = f.file_id().unwrap();
    assert!(f.is_file());
    assert_eq!(f.name, "new.txt");
    assert!(f.size.unwrap_or(0) == 0);
    // A never uploaded file reads as empty.
    assert_eq!(content(b, &id).await, b"");

    // An existing file is returned as it is: same ID, content kept.
    put(b, &w.vault, "new.txt", b"kept").await;
    let again = b.create_file(&w.vault, "new.txt").await.unwrap();
    assert_eq!(again.file_id().unwrap(), id);
    assert_eq!(again.size, Some(4));
    assert_eq!(content(b, &id).await, b"kept");

    b.create_folder(&at(&w.vault, "dir")).await.unwrap();
    assert_err(
        b.create_file(&w.vault, "dir").await,
        ErrorKind::Conflict,
        None,
    );
    assert_err(
        b.create_file(&at(&w.vault, "missing"), "x").await,
        ErrorKind::NotFound,
        None,
    );
    for bad in ["..", ".", "a/b", "a\0b"] {
        assert_err(
            b.create_file(&w.vault, bad).await,
            ErrorKind::BadRequest,
            Some("bad_path"),
        );
    }
    assert_err(
        b.create_file(&w.vault, "").await,
        ErrorKind::BadRequest,
        None,
    );
    assert_eq!(names(b, &w.vault).await, ["dir", "new.txt"]);
}

pub(crate) async fn begin_version_cases<B: Backend>(w: &World<B>) {
    let b = &w.a;
    let f = b.create_file(&w.vault, "v.txt").await.unwrap();
    let id = f.file_id().unwrap();
    let v = b.begin_version(&id, 3, None).await.unwrap();
    assert_eq!(v.file_id().unwrap(), id);
    let ex = v.file_ex_properties.unwrap();
    let vid = ex.version_id.unwrap();
    assert_eq!(ex.upload_uri, format!("/nodes/upload/{id}/{vid}"));
    assert_err(
        b.begin_version("999999999", 3, None).await,
        ErrorKind::NotFound,
        None,
    );
    assert_err(
        b.begin_version("not-an-id", 3, None).await,
        ErrorKind::NotFound,
        None,
    );
    assert_err(
        b.begin_version(&id, 3, Some("xyz")).await,
        ErrorKind::BadRequest,
        None,
    );
    // Without an md5 the server computes it.
    let node = b.upload(&id, &vid, 3, stream(b"abc")).await.unwrap();
    assert_eq!(node.md5_checksum.as_deref(), Some(md5hex(b"abc").as_str()));
}

/// Times and modes a client sets (issue 22): with a new version (step 2) or alone, before 1970
/// and after 2038 to the nanosecond. A server that keeps none (the public service) refuses the
/// update alone and stores a version as if no attributes had been given.
pub(crate) async fn attribute_cases<B: Backend>(w: &World<B>) {
    use vaultfs::api::FileAttrs;
    let b = &w.a;
    let epoch = SystemTime::UNIX_EPOCH;
    let before_1970 = epoch - Duration::new(315_619_200, 0) + Duration::from_nanos(123_456_789);
    let after_2038 = epoch + Duration::new(4_102_444_800, 987_654_321);
    let in_2001 = epoch + Duration::from_secs(1_000_000_000);
    let started = SystemTime::now() - Duration::from_secs(2);
    let file = put(b, &w.vault, "times.sh", b"#!/bin/sh\n").await;
    let id = file.file_id().unwrap();
    let p = at(&w.vault, "times.sh");
    let set = |modified, mode| FileAttrs { modified, mode };

    if !w.keeps_attrs {
        assert_err(
            b.set_attrs(&id, set(Some(in_2001), None)).await,
            ErrorKind::BadRequest,
            None,
        );
        let v = b
            .begin_version_with(
                &id,
                2,
                None,
                set(Some(in_2001), Some(0o755)),
                &Default::default(),
            )
            .await
            .unwrap();
        let vid = v.version_id().unwrap();
        let node = b.upload(&id, &vid, 2, stream(b"ok")).await.unwrap();
        assert!(node.modified_time().unwrap() >= started, "{node:?}");
        assert_ne!(node.mode, Some(0o755));
        return;
    }

    assert_eq!(file.mode.map(file_mode), Some(0o644));
    let node = b
        .set_attrs(&id, set(Some(before_1970), Some(0o755)))
        .await
        .unwrap();
    assert_eq!(node.modified_time(), Some(before_1970), "{node:?}");
    assert_eq!(node.mode.map(file_mode), Some(0o755));
    let node = b.node(&p).await.unwrap();
    assert_eq!(node.modified_time(), Some(before_1970));
    assert_eq!(node.mode.map(file_mode), Some(0o755));
    // Modes go out whole (st_mode's S_IFREG marks them so).
    assert_eq!(node.mode, Some(0o100755));
    // One attribute alone leaves the other as it is; a mode sent without the mark (a client
    // that knows only execute bits) keeps its execute bits only.
    let node = b.set_attrs(&id, set(Some(after_2038), None)).await.unwrap();
    assert_eq!(node.modified_time(), Some(after_2038));
    assert_eq!(node.mode.map(file_mode), Some(0o755));
    let node = b.set_attrs(&id, set(None, Some(0o700))).await.unwrap();
    assert_eq!(
        (node.modified_time(), node.mode.map(file_mode)),
        (Some(after_2038), Some(0o744))
    );
    let listed = b.list(&w.vault, 0, 100).await.unwrap().children.unwrap();
    let listed = listed.iter().find(|c| c.name == "times.sh").unwrap();
    assert_eq!(
        (listed.modified_time(), listed.mode.map(file_mode)),
        (Some(after_2038), Some(0o744))
    );

    // With a version: taken when it is committed, not before.
    let v = b
        .begin_version_with(
            &id,
            2,
            None,
            set(Some(in_2001), Some(0o644)),
            &Default::default(),
        )
        .await
        .unwrap();
    assert_eq!(v.modified_time(), Some(after_2038));
    let vid = v.version_id().unwrap();
    let node = b.upload(&id, &vid, 2, stream(b"ok")).await.unwrap();
    assert_eq!(
        (node.modified_time(), node.mode.map(file_mode)),
        (Some(in_2001), Some(0o644))
    );
    // A whole mode is kept whole: read-only, private.
    for perm in [0o444, 0o600] {
        let node = b
            .set_attrs(&id, set(None, Some(whole_mode(perm))))
            .await
            .unwrap();
        assert_eq!(node.mode, Some(whole_mode(perm)));
        assert_eq!(b.node(&p).await.unwrap().mode, Some(whole_mode(perm)));
    }
    // A version without a time is modified at its commit; the bits stay.
    b.set_attrs(&id, set(None, Some(0o755))).await.unwrap();
    let node = put(b, &w.vault, "times.sh", b"again").await;
    assert!(node.modified_time().unwrap() >= started, "{node:?}");
    assert_eq!(node.mode.map(file_mode), Some(0o755));

    assert_err(
        b.set_attrs("999999999", set(Some(in_2001), None)).await,
        ErrorKind::NotFound,
        None,
    );
    // Another account's file is not found either, and keeps its time.
    assert_err(
        w.other.set_attrs(&id, set(Some(in_2001), None)).await,
        ErrorKind::NotFound,
        None,
    );
    assert_ne!(b.node(&p).await.unwrap().modified_time(), Some(in_2001));
}

pub(crate) async fn other_accounts_are_forbidden<B: Backend>(w: &World<B>) {
    let (b, theirs) = (&w.a, &w.other);
    let ov = &w.other_vault;
    let their_file = put(theirs, ov, "secret.txt", b"secret")
        .await
        .file_id()
        .unwrap();
    let their_path = at(ov, "secret.txt");
    let mine = put(b, &w.vault, "mine.txt", b"mine").await;
    let f = ErrorKind::Forbidden;

    // By path.
    assert_err(b.node(&their_path).await, f, None);
    assert_err(b.node(&at(ov, "does-not-exist")).await, f, None);
    assert_err(b.list(ov, 0, 10).await, f, None);
    assert_err(b.create_folder(&at(ov, "x")).await, f, None);
    assert_err(b.create_file(ov, "x").await, f, None);
    assert_err(b.delete(&their_path).await, f, None);
    assert_err(
        b.copy(&their_path, &at(&w.vault, "stolen"), false).await,
        f,
        None,
    );
    assert_err(
        b.copy(&at(&w.vault, "mine.txt"), &at(ov, "planted"), false)
            .await,
        f,
        None,
    );
    assert_err(
        b.rename(&their_path, &at(&w.vault, "stolen"), false).await,
        f,
        None,
    );
    // By ID: not found, as an unused ID would be (IDs are not to be counted).
    let nf = ErrorKind::NotFound;
    assert_err(b.download(&their_file, None).await, nf, None);
    assert_err(b.begin_version(&their_file, 1, None).await, nf, None);
    assert_err(b.preview(&their_file).await, nf, None);
    assert_err(
        theirs.download(&mine.file_id().unwrap(), None).await,
        nf,
        None,
    );

    // Nothing of theirs changed.
    assert_eq!(names(theirs, ov).await, ["secret.txt"]);
    assert_eq!(content(theirs, &their_file).await, b"secret");
    assert_eq!(names(b, &w.vault).await, ["mine.txt"]);
}
