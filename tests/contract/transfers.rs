//! The contract: uploads (alone and concurrent) and downloads.

use vaultfs::api::{ErrorKind, RangeRequest};
use vaultfs::backend::Backend;

use crate::common::md5hex;
use crate::common::pattern;
use crate::{World, assert_err, at, content, put, read_all, stream};

/// Step 3s that arrive together are committed together (one durable transaction); each still
/// gets its own answer: bytes shared by several files stored once, a wrong checksum failing
/// alone, every other file whole.
pub(crate) async fn concurrent_uploads_get_their_own_answers<B: Backend>(w: &World<B>) {
    let b = &w.a;
    let folder = at(&w.vault, "many");
    b.create_folder(&folder).await.unwrap();
    // 0..40 distinct, 40..52 the same bytes, 52..60 announced with another md5.
    let body = |i: usize| -> Vec<u8> {
        if (40..52).contains(&i) {
            b"the same bytes in twelve files".to_vec()
        } else {
            format!("file {i} ").repeat(i + 1).into_bytes()
        }
    };
    let mut tickets = Vec::new();
    for i in 0..60 {
        let id = b
            .create_file(&folder, &format!("f{i:02}"))
            .await
            .unwrap()
            .file_id()
            .unwrap();
        let data = body(i);
        let md5 = if i >= 52 {
            md5hex(b"not these bytes")
        } else {
            md5hex(&data)
        };
        let v = b
            .begin_version(&id, data.len() as u64, Some(&md5))
            .await
            .unwrap();
        tickets.push((id, v.file_ex_properties.unwrap().version_id.unwrap(), data));
    }
    let answers = futures_util::future::join_all(
        tickets
            .iter()
            .map(|(id, vid, data)| b.upload(id, vid, data.len() as u64, stream(data))),
    )
    .await;
    for (i, (answer, (id, _, data))) in answers.into_iter().zip(&tickets).enumerate() {
        if i >= 52 {
            assert_err(answer, ErrorKind::BadRequest, Some("checksum_mismatch"));
            assert_eq!(
                b.node(&at(&folder, &format!("f{i:02}")))
                    .await
                    .unwrap()
                    .size,
                Some(0)
            );
        } else {
            let node = answer.unwrap_or_else(|e| panic!("upload {i}: {e:?}"));
            assert_eq!(node.name, format!("f{i:02}"));
            assert_eq!(node.md5_checksum.as_deref(), Some(md5hex(data).as_str()));
            assert_eq!(&content(b, id).await, data, "file {i}");
        }
    }
    assert!(w.store.check_integrity().unwrap().is_empty());
}

pub(crate) async fn upload_cases<B: Backend>(w: &World<B>) {
    let b = &w.a;
    let id = put(b, &w.vault, "u.txt", b"old content")
        .await
        .file_id()
        .unwrap();
    let version = |len: u64, md5: Option<String>| {
        let id = id.clone();
        async move {
            let v = b.begin_version(&id, len, md5.as_deref()).await.unwrap();
            v.file_ex_properties.unwrap().version_id.unwrap()
        }
    };

    // The bytes sent differ from step 2's length, shorter and longer: 400, old content kept.
    let vid = version(20, None).await;
    assert_err(
        b.upload(&id, &vid, 5, stream(b"short")).await,
        ErrorKind::BadRequest,
        Some("length_mismatch"),
    );
    let vid = version(3, None).await;
    let long = b"much longer";
    assert_err(
        b.upload(&id, &vid, long.len() as u64, stream(long)).await,
        ErrorKind::BadRequest,
        Some("length_mismatch"),
    );
    // The body ends before the length it was announced with.
    let vid = version(5, None).await;
    assert_err(
        b.upload(&id, &vid, 5, stream(b"abc")).await,
        ErrorKind::BadRequest,
        Some("length_mismatch"),
    );
    // Another md5 than announced.
    let vid = version(5, Some(md5hex(b"other"))).await;
    assert_err(
        b.upload(&id, &vid, 5, stream(b"hello")).await,
        ErrorKind::BadRequest,
        Some("checksum_mismatch"),
    );
    assert_eq!(content(b, &id).await, b"old content");
    assert_eq!(b.node(&at(&w.vault, "u.txt")).await.unwrap().size, Some(11));

    // Success, then the same step 3 again succeeds; other bytes for it do not.
    let data = pattern(3 << 20, 0);
    let vid = version(data.len() as u64, Some(md5hex(&data))).await;
    let node = b
        .upload(&id, &vid, data.len() as u64, stream(&data))
        .await
        .unwrap();
    assert_eq!(node.size, Some(data.len() as u64));
    assert_eq!(node.md5_checksum.as_deref(), Some(md5hex(&data).as_str()));
    let again = b
        .upload(&id, &vid, data.len() as u64, stream(&data))
        .await
        .unwrap();
    assert_eq!(again.md5_checksum, node.md5_checksum);
    let mut other = data.clone();
    other[0] ^= 1;
    assert_err(
        b.upload(&id, &vid, other.len() as u64, stream(&other))
            .await,
        ErrorKind::Conflict,
        None,
    );
    assert!(content(b, &id).await == data);

    assert_err(
        b.upload(&id, "424242", 1, stream(b"x")).await,
        ErrorKind::NotFound,
        None,
    );
    assert_err(
        b.upload("999999999", &vid, 1, stream(b"x")).await,
        ErrorKind::NotFound,
        None,
    );

    // An empty file.
    let e = put(b, &w.vault, "empty", b"").await;
    assert_eq!(content(b, &e.file_id().unwrap()).await, b"");
}

pub(crate) async fn download_cases<B: Backend>(w: &World<B>) {
    let b = &w.a;
    let data = pattern(1000, 0);
    let id = put(b, &w.vault, "d.bin", &data).await.file_id().unwrap();

    let d = b.download(&id, None).await.unwrap();
    assert_eq!((d.total_size, d.range, d.len()), (1000, None, 1000));
    assert_eq!(d.node.size, Some(1000));
    assert_eq!(d.node.md5_checksum.as_deref(), Some(md5hex(&data).as_str()));
    assert!(read_all(d).await.unwrap() == data);

    let cases = [
        (RangeRequest::span(0, 1), (0, 0)),
        (
            RangeRequest::From {
                start: 100,
                end: Some(199),
            },
            (100, 199),
        ),
        (RangeRequest::Suffix(10), (990, 999)),
        (RangeRequest::Suffix(5000), (0, 999)),
        (
            RangeRequest::From {
                start: 995,
                end: None,
            },
            (995, 999),
        ),
        (
            RangeRequest::From {
                start: 990,
                end: Some(5000),
            },
            (990, 999),
        ),
        (
            RangeRequest::From {
                start: 999,
                end: Some(999),
            },
            (999, 999),
        ),
    ];
    for (r, (a, z)) in cases {
        let d = b.download(&id, Some(r)).await.unwrap();
        assert_eq!(
            (d.range, d.total_size, d.len()),
            (Some((a, z)), 1000, z - a + 1),
            "{r}"
        );
        let got = read_all(d).await.unwrap();
        assert!(got == data[a as usize..=z as usize], "{r}");
    }
    for r in [
        RangeRequest::From {
            start: 1000,
            end: None,
        },
        RangeRequest::From {
            start: 5000,
            end: Some(6000),
        },
    ] {
        assert_err(
            b.download(&id, Some(r)).await,
            ErrorKind::RangeNotSatisfiable,
            None,
        );
    }
    let empty = put(b, &w.vault, "empty", b"").await.file_id().unwrap();
    assert_err(
        b.download(&empty, Some(RangeRequest::span(0, 1))).await,
        ErrorKind::RangeNotSatisfiable,
        None,
    );
    assert_err(
        b.download("999999999", None).await,
        ErrorKind::NotFound,
        None,
    );
    assert_err(
        b.download("not-an-id", None).await,
        ErrorKind::NotFound,
        None,
    );
}
