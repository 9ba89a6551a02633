//! The conflict check (issue 32): an upload says what it replaces, and one whose base no longer
//! holds is refused with `version_conflict`, so a later save cannot silently erase an earlier one
//! by somebody else. Our server checks at step 2 and again, atomically, when step 3 commits; the
//! public service knows no such check, and the client compares the file step 2 shows instead
//! (the window between step 2 and step 3 remains there, and only there).

use super::{World, assert_err, common::content, md5hex, put, stream};
use vaultfs::api::{Base, ErrorKind};
use vaultfs::backend::Backend;

pub(crate) async fn conflict_cases<B: Backend>(w: &World<B>) {
    let b = &w.a;
    let file = put(b, &w.vault, "report.txt", b"first").await;
    let id = file.file_id().unwrap();
    let read = Base::Md5(md5hex(b"first"));
    let len = |d: &[u8]| d.len() as u64;

    // Two writers read "first"; A announces its edit, then B stores its own.
    let a = b
        .begin_version_with(&id, 6, None, Default::default(), &read)
        .await
        .unwrap();
    let a_vid = a.version_id().unwrap();
    let checked = a.file_ex_properties.as_ref().unwrap().conflict_check == Some(true);
    assert_eq!(
        checked, w.keeps_attrs,
        "our server checks at step 3; the public service not"
    );
    let edit_b = b"edit from B";
    let bv = b
        .begin_version_with(&id, len(edit_b), None, Default::default(), &read)
        .await
        .unwrap();
    b.upload(&id, &bv.version_id().unwrap(), len(edit_b), stream(edit_b))
        .await
        .unwrap();

    // A's step 3: refused where the server checks, and B's bytes stay; elsewhere it is the
    // window the docs state.
    let done = b.upload(&id, &a_vid, 6, stream(b"from A")).await;
    if checked {
        assert_err(done, ErrorKind::Precondition, Some("version_conflict"));
        assert_eq!(content(b, &id).await, edit_b);
    } else {
        done.unwrap();
    }

    // A step 2 whose base is stale is refused everywhere (on the public service, by the client).
    assert_err(
        b.begin_version_with(&id, 3, None, Default::default(), &read)
            .await,
        ErrorKind::Precondition,
        Some("version_conflict"),
    );
    // The current md5 as base is accepted, and so is no check at all.
    let now = md5hex(&content(b, &id).await);
    for base in [Base::Md5(now.to_uppercase()), Base::Any] {
        b.begin_version_with(&id, 1, None, Default::default(), &base)
            .await
            .unwrap();
    }

    // A new name: "no content yet" holds for a file of step 1 alone, and for an empty one; not
    // once somebody stored bytes there.
    let fresh = b.create_file(&w.vault, "new.txt").await.unwrap();
    let fid = fresh.file_id().unwrap();
    let v = b
        .begin_version_with(&fid, 0, None, Default::default(), &Base::Absent)
        .await
        .unwrap();
    b.upload(&fid, &v.version_id().unwrap(), 0, stream(b""))
        .await
        .unwrap();
    let v = b
        .begin_version_with(&fid, 5, None, Default::default(), &Base::Absent)
        .await
        .unwrap();
    b.upload(&fid, &v.version_id().unwrap(), 5, stream(b"other"))
        .await
        .unwrap();
    assert_err(
        b.begin_version_with(&fid, 4, None, Default::default(), &Base::Absent)
            .await,
        ErrorKind::Precondition,
        Some("version_conflict"),
    );
    assert_eq!(content(b, &fid).await, b"other");
}

/// Versions within reach (issue 32): `vprop=1` lists what is kept, newest first, and each kept
/// version reads back whole or by range. The public service documents `vprop` without its
/// shape: there the client says it shows none, and never reads the current bytes for an old
/// version.
pub(crate) async fn version_cases<B: Backend>(w: &World<B>) {
    use vaultfs::api::RangeRequest;
    let b = &w.a;
    let p = super::at(&w.vault, "kept.txt");
    let file = put(b, &w.vault, "kept.txt", b"one").await;
    let id = file.file_id().unwrap();
    for data in [&b"two!"[..], b"three"] {
        let v = b.begin_version(&id, data.len() as u64, None).await.unwrap();
        b.upload(
            &id,
            &v.version_id().unwrap(),
            data.len() as u64,
            stream(data),
        )
        .await
        .unwrap();
    }
    if !w.keeps_attrs {
        assert_err(b.versions(&p).await, ErrorKind::MethodNotAllowed, None);
        assert!(b.download_version(&id, "1", None).await.is_err());
        return;
    }
    let versions = b.versions(&p).await.unwrap();
    let sizes: Vec<u64> = versions.iter().map(|v| v.size).collect();
    assert_eq!(sizes, [5, 4, 3], "newest first: {versions:?}");
    let current: Vec<bool> = versions.iter().map(|v| v.current).collect();
    assert_eq!(current, [true, false, false]);
    for (v, want) in versions.iter().zip([&b"three"[..], b"two!", b"one"]) {
        assert_eq!(v.md5_checksum.as_deref(), Some(md5hex(want).as_str()));
        assert!(v.created_on.is_some() && v.modified_on.is_some(), "{v:?}");
        let d = b.download_version(&id, &v.version_id, None).await.unwrap();
        assert_eq!(d.node.size, Some(want.len() as u64));
        assert_eq!(super::read_all(d).await.unwrap(), want);
    }
    let oldest = &versions[2].version_id;
    let part = b
        .download_version(&id, oldest, Some(RangeRequest::parse("bytes=1-").unwrap()))
        .await
        .unwrap();
    assert_eq!(super::read_all(part).await.unwrap(), b"ne");
    assert_err(
        b.download_version(&id, "999999999", None).await,
        ErrorKind::NotFound,
        None,
    );
    // Another account reaches neither the list nor the bytes.
    assert_err(
        w.other.download_version(&id, oldest, None).await,
        ErrorKind::NotFound,
        None,
    );
    let folder = b.versions(&w.vault).await;
    assert!(folder.is_err(), "a folder has no versions: {folder:?}");
}
