//! The contract: previews.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use vaultfs::api::{ErrorKind, PreviewStatus};
use vaultfs::backend::Backend;

use crate::common::fixtures::{png_size, sample_text};
use crate::{World, assert_err, at, put};

/// Polls the preview metadata until it leaves InProgress.
async fn settled<B: Backend>(b: &B, id: &str) -> vaultfs::api::PreviewMeta {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let meta = b.preview(id).await.unwrap();
        if meta.status != PreviewStatus::InProgress {
            return meta;
        }
        assert!(
            Instant::now() < deadline,
            "preview of {id} still in progress after 60s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(crate) async fn preview_cases<B: Backend>(w: &World<B>) {
    let b = &w.a;
    let id = put(b, &w.vault, "notes.txt", &sample_text())
        .await
        .file_id()
        .unwrap();
    let meta = settled(b, &id).await;
    assert_eq!(meta.status, PreviewStatus::Ready);
    assert!(meta.pages.len() >= 2, "{meta:?}");
    let base = format!("/preview/id/Document/{id}");
    assert_eq!(
        meta.pdf_uri.as_deref(),
        Some(format!("{base}/pdf").as_str())
    );
    for (i, p) in meta.pages.iter().enumerate() {
        assert_eq!(p.page_number as usize, i + 1);
        assert_eq!(p.page_uri, format!("{base}/{}", i + 1));
        assert_eq!(
            (p.width, p.height),
            (1224, 1584),
            "Letter at 2 px per point"
        );
    }

    // Pages at 100%, scaled, and bounded; the aspect ratio is kept and every bound holds.
    let page = |n: u32, scale: Option<u32>, max_width: Option<u32>, max_height: Option<u32>| {
        let size = vaultfs::api::PageSize {
            scale,
            max_width,
            max_height,
        };
        b.preview_page(&id, n, size)
    };
    let full = page(1, None, None, None).await.unwrap();
    assert_eq!(full.content_type, "image/png");
    assert_eq!(png_size(&full.data), (1224, 1584));
    let thumb = page(2, Some(25), None, None).await.unwrap();
    assert_eq!(png_size(&thumb.data), (306, 396));
    let (w1, h1) = png_size(&page(1, None, Some(100), None).await.unwrap().data);
    assert_eq!(w1, 100);
    assert!((h1 as i64 - 129).abs() <= 1, "{w1}x{h1}");
    let (w2, h2) = png_size(&page(1, Some(50), Some(400), Some(300)).await.unwrap().data);
    assert!(w2 <= 400 && (299..=300).contains(&h2), "{w2}x{h2}");
    assert!(((w2 as f64 / h2 as f64) - 1224.0 / 1584.0).abs() < 0.01);
    let n = meta.pages.len() as u32;
    assert_err(
        page(n + 1, None, None, None).await,
        ErrorKind::NotFound,
        None,
    );

    // The PDF of a text file is made for it, with the text in it.
    let mut pdf = Vec::new();
    let mut body = b.preview_pdf(&id).await.unwrap().body;
    while let Some(chunk) = body.next().await {
        pdf.extend_from_slice(&chunk.unwrap());
    }
    assert!(pdf.starts_with(b"%PDF-"));

    // A copy shares the preview of its bytes at once; a new version gets a new one.
    let copy = b
        .copy(&at(&w.vault, "notes.txt"), &at(&w.vault, "copy.txt"), false)
        .await
        .unwrap();
    let copy_meta = b.preview(&copy.file_id().unwrap()).await.unwrap();
    assert_eq!(copy_meta.status, PreviewStatus::Ready);
    assert_eq!(copy_meta.pages.len(), meta.pages.len());
    put(b, &w.vault, "notes.txt", b"one short line\n").await;
    let meta2 = settled(b, &id).await;
    assert_eq!(meta2.status, PreviewStatus::Ready);
    assert_eq!(meta2.pages.len(), 1);

    // Bytes with no type: no preview, and no pages or PDF.
    let junk: Vec<u8> = (0..5000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let jid = put(b, &w.vault, "blob.bin", &junk).await.file_id().unwrap();
    let jm = settled(b, &jid).await;
    assert_eq!(jm.status, PreviewStatus::TypeNotSupported);
    assert!(jm.pages.is_empty() && jm.pdf_uri.is_none());
    assert_err(
        b.preview_page(&jid, 1, Default::default()).await,
        ErrorKind::NotFound,
        None,
    );
    assert_err(b.preview_pdf(&jid).await, ErrorKind::NotFound, None);
    // A file created but never uploaded has nothing to preview.
    let empty = b.create_file(&w.vault, "never.txt").await.unwrap();
    let em = b.preview(&empty.file_id().unwrap()).await.unwrap();
    assert_eq!(em.status, PreviewStatus::TypeNotSupported);
    assert_err(b.preview("999999999").await, ErrorKind::NotFound, None);
}
