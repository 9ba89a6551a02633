//! PDFs: rasterized pages, encrypted, truncated or garbage input, page bounds and deadlines.

use super::*;

#[test]
fn krilla_pdf_pages_are_letter_at_144_dpi() {
    let pdf = krilla_pdf(3, 612.0, 792.0);
    assert_eq!(sniff("doc.pdf", &pdf), PreviewKind::Pdf);
    let (rendered, pages) = render_all(PreviewKind::Pdf, &pdf, &Limits::default()).unwrap();
    assert!(matches!(rendered.pdf, DocumentPdf::Original));
    assert_eq!((rendered.pages, rendered.truncated), (3, false));
    for page in &pages {
        let img = grey_letter_page(page);
        // "Page N" at x 72 pt, baseline 144 pt, 40 pt high: pixels 144.., 200..288.
        assert!(ink(&img, 144, 200, 500, 300) > 1000, "text was drawn");
        assert_eq!(ink(&img, 0, 400, 1224, 1584), 0, "the rest is white");
        assert_eq!(
            *img.get_pixel(0, 0),
            Rgb([255, 255, 255]),
            "white background"
        );
    }
}

#[test]
fn ghostscript_pdf_renders() {
    let (rendered, pages) =
        render_all(PreviewKind::Pdf, GHOSTSCRIPT_PDF, &Limits::default()).unwrap();
    assert_eq!((rendered.pages, rendered.truncated), (2, false));
    // A4 portrait, then A4 landscape.
    assert_eq!((pages[0].width, pages[0].height), (1190, 1684));
    assert_eq!((pages[1].width, pages[1].height), (1684, 1190));
    let first = decode(&pages[0]);
    // The red rectangle: 72..322 x 400..600 pt from the bottom.
    let Rgb([r, g, b]) = *first.get_pixel(300, 700);
    assert!(
        r > 150 && g < 80 && b < 80,
        "red rectangle, got {r},{g},{b}"
    );
    // The title in Helvetica, a font the file does not embed.
    assert!(ink(&first, 144, 150, 900, 210) > 1000, "title text drawn");
    let second = decode(&pages[1]);
    // The green disc centred at (421, 250) pt.
    let Rgb([r, g, b]) = *second.get_pixel(842, 1190 - 500);
    assert!(g > 80 && r < 60 && b < 60, "green disc, got {r},{g},{b}");
}

#[test]
fn encrypted_pdf_with_user_password_is_unsupported() {
    assert_eq!(sniff("e.pdf", ENCRYPTED_PDF), PreviewKind::Pdf);
    let err = render_all(PreviewKind::Pdf, ENCRYPTED_PDF, &Limits::default()).unwrap_err();
    assert_eq!(err.0, "encrypted PDF: needs a password to open");
}

#[test]
fn truncated_or_garbage_pdf_is_unsupported() {
    let pdf = krilla_pdf(2, 612.0, 792.0);
    for len in [0, 9, 100, 400] {
        let err = render_all(PreviewKind::Pdf, &pdf[..len], &Limits::default()).unwrap_err();
        assert!(!err.0.is_empty(), "cut at {len}");
    }
    // Cut anywhere: a preview of what survives or Unsupported, never a panic.
    for len in (0..pdf.len()).step_by(97) {
        let _ = render_all(PreviewKind::Pdf, &pdf[..len], &Limits::default());
    }
    let mut junk = b"%PDF-1.7\n".to_vec();
    junk.extend(random_bytes(5000, 7));
    assert!(render_all(PreviewKind::Pdf, &junk, &Limits::default()).is_err());
}

#[test]
fn pdf_pages_beyond_max_pages_are_dropped() {
    let pdf = krilla_pdf(5, 612.0, 792.0);
    let limits = Limits {
        max_pages: 2,
        ..Limits::default()
    };
    let (rendered, pages) = render_all(PreviewKind::Pdf, &pdf, &limits).unwrap();
    assert_eq!(
        (rendered.pages, rendered.truncated, pages.len()),
        (2, true, 2)
    );
    let zero = Limits {
        max_pages: 0,
        ..Limits::default()
    };
    let (rendered, _) = render_all(PreviewKind::Pdf, &pdf, &zero).unwrap();
    assert_eq!(
        (rendered.pages, rendered.truncated),
        (1, true),
        "0 counts as 1"
    );
    let (rendered, _) = render_all(PreviewKind::Text, b"text", &zero).unwrap();
    assert_eq!(rendered.pages, 1);
}

#[test]
fn pdf_after_leading_junk_renders() {
    // Readers accept a header within the first KiB (mail or HTTP leftovers before it).
    let mut pdf = b"Content-Type: application/pdf\r\n\r\n".to_vec();
    pdf.extend(krilla_pdf(2, 612.0, 792.0));
    assert_eq!(sniff("mail.bin", &pdf), PreviewKind::Pdf);
    let (rendered, pages) = render_all(PreviewKind::Pdf, &pdf, &Limits::default()).unwrap();
    assert_eq!(rendered.pages, 2);
    assert!(ink(&decode(&pages[1]), 144, 200, 500, 300) > 1000);
}

#[test]
fn huge_pdf_page_is_shrunk_to_max_page_side() {
    let pdf = krilla_pdf(1, 3000.0, 1000.0);
    let (_, pages) = render_all(PreviewKind::Pdf, &pdf, &Limits::default()).unwrap();
    assert_eq!((pages[0].width, pages[0].height), (4096, 1365));
    let small = Limits {
        max_page_side: 1000,
        ..Limits::default()
    };
    let (_, pages) = render_all(PreviewKind::Pdf, &krilla_pdf(1, 612.0, 792.0), &small).unwrap();
    assert_eq!((pages[0].width, pages[0].height), (773, 1000));
    decode(&pages[0]);
}

#[test]
fn deadline_in_the_past_stops_every_kind() {
    let limits = Limits {
        deadline: Some(Instant::now() - Duration::from_secs(1)),
        ..Limits::default()
    };
    let png = encode(&test_image(8, 8), ImageFormat::Png);
    for (kind, data) in [
        (PreviewKind::Pdf, krilla_pdf(1, 612.0, 792.0)),
        (PreviewKind::Text, b"hello\n".to_vec()),
        (PreviewKind::Image, png),
    ] {
        let err = render_all(kind, &data, &limits).unwrap_err();
        assert_eq!(err, Unsupported("took too long".into()), "{kind:?}");
    }
}

#[test]
fn an_error_from_out_stops_the_job() {
    let pdf = krilla_pdf(3, 612.0, 792.0);
    let mut calls = 0;
    let err = render(PreviewKind::Pdf, &pdf, &Limits::default(), &mut |_| {
        calls += 1;
        Err("disk full".into())
    })
    .unwrap_err();
    assert_eq!((err, calls), (Unsupported("disk full".into()), 1));
}

#[test]
fn random_bytes_are_unsupported_as_any_kind() {
    for seed in 1..4 {
        let data = random_bytes(20_000, seed);
        assert_eq!(sniff("x", &data), PreviewKind::Unsupported);
        for kind in [
            PreviewKind::Pdf,
            PreviewKind::Image,
            PreviewKind::Text,
            PreviewKind::Unsupported,
        ] {
            assert!(
                render_all(kind, &data, &Limits::default()).is_err(),
                "{kind:?}"
            );
        }
    }
    assert!(
        render_all(PreviewKind::Text, b"", &Limits::default()).is_err(),
        "empty file"
    );
}
