//! The contract: copy, move and delete.

use vaultfs::api::{Base, ErrorKind, NodeType};
use vaultfs::backend::Backend;

use crate::common::md5hex;
use crate::{World, assert_err, at, content, names, path, put};

pub(crate) async fn copy_cases<B: Backend>(w: &World<B>) {
    let b = &w.a;
    let src = at(&w.vault, "a.txt");
    let src_id = put(b, &w.vault, "a.txt", b"alpha").await.file_id().unwrap();
    b.create_folder(&at(&w.vault, "box")).await.unwrap();
    let blobs = w.store.blob_count().unwrap();

    let copied = b
        .copy(&src, &at(&w.vault, "box/a2.txt"), false)
        .await
        .unwrap();
    assert_eq!(copied.uri, "/nodes/pth/Acme/My First Vault/box/a2.txt");
    let copy_id = copied.file_id().unwrap();
    assert_ne!(copy_id, src_id);
    assert_eq!(
        copied.md5_checksum.as_deref(),
        Some(md5hex(b"alpha").as_str())
    );
    assert_eq!(content(b, &copy_id).await, b"alpha");
    assert_eq!(content(b, &src_id).await, b"alpha");
    // The copy shares the stored bytes.
    assert_eq!(w.store.blob_count().unwrap(), blobs);

    // The copy is its own file from now on.
    put(b, &w.vault, "a.txt", b"alpha v2").await;
    assert_eq!(content(b, &copy_id).await, b"alpha");

    put(b, &w.vault, "b.txt", b"beta").await;
    let b_path = at(&w.vault, "b.txt");
    assert_err(
        b.copy(&src, &b_path, false).await,
        ErrorKind::Conflict,
        Some("exists"),
    );
    assert_eq!(
        content(b, &b.node(&b_path).await.unwrap().file_id().unwrap()).await,
        b"beta"
    );
    let over = b.copy(&src, &b_path, true).await.unwrap();
    assert_eq!(content(b, &over.file_id().unwrap()).await, b"alpha v2");

    // A folder is copied with everything under it.
    let tree = at(&w.vault, "tree");
    b.create_folder(&tree).await.unwrap();
    b.create_folder(&at(&tree, "sub")).await.unwrap();
    put(b, &at(&tree, "sub"), "deep.txt", b"deep").await;
    put(b, &tree, "top.txt", b"top").await;
    let t2 = at(&w.vault, "box/tree2");
    let copied = b.copy(&tree, &t2, false).await.unwrap();
    assert_eq!(copied.node_type, NodeType::FolderNodeType);
    assert_eq!(names(b, &t2).await, ["sub", "top.txt"]);
    let deep = b.node(&at(&t2, "sub/deep.txt")).await.unwrap();
    assert_eq!(content(b, &deep.file_id().unwrap()).await, b"deep");
    assert_eq!(names(b, &tree).await, ["sub", "top.txt"]);

    assert_err(
        b.copy(&at(&w.vault, "nope"), &at(&w.vault, "x"), false)
            .await,
        ErrorKind::NotFound,
        None,
    );
    assert_err(
        b.copy(&src, &at(&w.vault, "missing/x"), false).await,
        ErrorKind::NotFound,
        None,
    );
    assert_err(
        b.copy(&w.vault, &at(&w.vault, "v2"), false).await,
        ErrorKind::Forbidden,
        None,
    );
}

pub(crate) async fn move_cases<B: Backend>(w: &World<B>) {
    let b = &w.a;
    let v = &w.vault;
    let id = put(b, v, "m.txt", b"move me").await.file_id().unwrap();

    // Rename in place keeps the file (ID and content).
    let moved = b
        .rename(&at(v, "m.txt"), &at(v, "n.txt"), false)
        .await
        .unwrap();
    assert_eq!(
        (moved.name.as_str(), moved.file_id().unwrap()),
        ("n.txt", id.clone())
    );
    assert_err(b.node(&at(v, "m.txt")).await, ErrorKind::NotFound, None);
    assert_eq!(content(b, &id).await, b"move me");

    // Across folders.
    b.create_folder(&at(v, "dst")).await.unwrap();
    let moved = b
        .rename(&at(v, "n.txt"), &at(v, "dst/n.txt"), false)
        .await
        .unwrap();
    assert_eq!(moved.uri, "/nodes/pth/Acme/My First Vault/dst/n.txt");
    assert_eq!(names(b, &at(v, "dst")).await, ["n.txt"]);
    assert_err(b.node(&at(v, "n.txt")).await, ErrorKind::NotFound, None);

    // A folder into itself.
    b.create_folder(&at(v, "dst/inner")).await.unwrap();
    assert_err(
        b.rename(&at(v, "dst"), &at(v, "dst/inner/dst"), false)
            .await,
        ErrorKind::BadRequest,
        None,
    );

    // Replace semantics: fail keeps both; replace keeps the file under the name (its ID, now with
    // the source's bytes as a new version) and the source goes.
    put(b, v, "o.txt", b"other").await;
    let target = at(v, "dst/n.txt");
    assert_err(
        b.rename(&at(v, "o.txt"), &target, false).await,
        ErrorKind::Conflict,
        Some("exists"),
    );
    assert_eq!(content(b, &id).await, b"move me");
    let over = b.rename(&at(v, "o.txt"), &target, true).await.unwrap();
    assert_eq!(over.file_id().unwrap(), id, "the name keeps its file");
    assert_eq!(
        content(b, &b.node(&target).await.unwrap().file_id().unwrap()).await,
        b"other"
    );
    assert_err(b.node(&at(v, "o.txt")).await, ErrorKind::NotFound, None);

    // Kinds must match, and a folder replaced must be empty.
    put(b, v, "file", b"f").await;
    assert_err(
        b.rename(&at(v, "file"), &at(v, "dst"), true).await,
        ErrorKind::Conflict,
        None,
    );
    b.create_folder(&at(v, "empty")).await.unwrap();
    b.create_folder(&at(v, "full")).await.unwrap();
    put(b, &at(v, "full"), "x", b"x").await;
    assert_err(
        b.rename(&at(v, "empty"), &at(v, "full"), true).await,
        ErrorKind::Conflict,
        None,
    );
    assert_eq!(names(b, &at(v, "full")).await, ["x"]);
    b.rename(&at(v, "full"), &at(v, "empty"), true)
        .await
        .unwrap();
    assert_eq!(names(b, &at(v, "empty")).await, ["x"]);
    assert_err(b.node(&at(v, "full")).await, ErrorKind::NotFound, None);

    assert_err(
        b.rename(&at(v, "nope"), &at(v, "x"), false).await,
        ErrorKind::NotFound,
        None,
    );
    assert_err(
        b.rename(&w.vault, &at(v, "x"), false).await,
        ErrorKind::Forbidden,
        None,
    );
}

pub(crate) async fn delete_cases<B: Backend>(w: &World<B>) {
    let b = &w.a;
    let v = &w.vault;
    let id = put(b, v, "gone.txt", b"bye").await.file_id().unwrap();
    b.delete(&at(v, "gone.txt")).await.unwrap();
    assert_err(b.node(&at(v, "gone.txt")).await, ErrorKind::NotFound, None);
    assert_err(b.download(&id, None).await, ErrorKind::NotFound, None);
    assert_err(
        b.delete(&at(v, "gone.txt")).await,
        ErrorKind::NotFound,
        None,
    );

    let dir = at(v, "dir");
    b.create_folder(&dir).await.unwrap();
    b.create_folder(&at(&dir, "sub")).await.unwrap();
    let deep = put(b, &at(&dir, "sub"), "deep", b"deep")
        .await
        .file_id()
        .unwrap();
    b.delete(&dir).await.unwrap();
    assert_err(b.node(&at(v, "dir/sub")).await, ErrorKind::NotFound, None);
    assert_err(b.download(&deep, None).await, ErrorKind::NotFound, None);
    assert!(names(b, v).await.is_empty());

    assert_err(b.delete(v).await, ErrorKind::Forbidden, None);
    assert_err(b.delete(&path("/Acme")).await, ErrorKind::Forbidden, None);
    assert!(b.node(v).await.is_ok());

    // A delete on a condition (our extension): refused while another version is current, or
    // while a file made with no version has one now; done while the condition holds. A
    // server that does not know it (the public service's dialect) deletes as asked.
    let kept = at(v, "kept.txt");
    let kept_id = put(b, v, "kept.txt", b"theirs").await.file_id().unwrap();
    let old = Base::Md5(md5hex(b"mine"));
    if matches!(w._keep, crate::Keep::Dialect(_)) {
        b.delete_if(&kept, &old).await.unwrap();
        assert_err(b.node(&kept).await, ErrorKind::NotFound, None);
        return;
    }
    assert_err(
        b.delete_if(&kept, &old).await,
        ErrorKind::Precondition,
        Some("version_conflict"),
    );
    assert_err(
        b.delete_if(&kept, &Base::Absent).await,
        ErrorKind::Precondition,
        Some("version_conflict"),
    );
    assert_eq!(content(b, &kept_id).await, b"theirs");
    b.delete_if(&kept, &Base::Md5(md5hex(b"theirs")))
        .await
        .unwrap();
    assert_err(b.node(&kept).await, ErrorKind::NotFound, None);
    b.create_file(v, "empty.txt").await.unwrap();
    b.delete_if(&at(v, "empty.txt"), &Base::Absent)
        .await
        .unwrap();
    assert!(names(b, v).await.is_empty());
}
