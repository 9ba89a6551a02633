//! Timings of twenty pages, and pages written out for a person to look at.

use super::*;

#[test]
fn timings_of_twenty_pages() {
    let text = long_text().repeat(6); // 22 pages, 20 rendered
    let twenty = Limits {
        max_pages: 20,
        ..Limits::default()
    };
    let start = Instant::now();
    let (text_rendered, _) = render_all(PreviewKind::Text, text.as_bytes(), &twenty).unwrap();
    let text_time = start.elapsed();
    assert_eq!((text_rendered.pages, text_rendered.truncated), (20, true));
    let text_pdf = made_pdf(&text_rendered);
    let start = Instant::now();
    let (rendered, _) = render_all(PreviewKind::Pdf, text_pdf, &Limits::default()).unwrap();
    let text_pdf_time = start.elapsed();
    assert_eq!(rendered.pages, 20);
    let sparse = krilla_pdf(20, 612.0, 792.0);
    let start = Instant::now();
    let (rendered, _) = render_all(PreviewKind::Pdf, &sparse, &Limits::default()).unwrap();
    let sparse_time = start.elapsed();
    assert_eq!(rendered.pages, 20);
    println!(
        "timing: 20-page text file {text_time:?} (decode, layout, PDF, rasterize); \
         that 20-page PDF alone {text_pdf_time:?}; 20 sparse krilla pages {sparse_time:?}"
    );
}

/// Writes one page of each kind to /tmp/preview-look/ for a person to look at:
/// `cargo test --lib preview::tests::look::look -- --ignored`.
#[test]
#[ignore]
fn look() {
    let dir = std::path::Path::new("/tmp/preview-look");
    std::fs::create_dir_all(dir).unwrap();
    let mut text = String::from("vaultfs preview of a text file\tafter a tab\n");
    text.push_str(&"0123456789".repeat(10)); // hard-wrapped at 95 columns
    text.push_str(
        "\n漢字かな交じり文 (no CJK glyphs in DejaVu) \x1b[1mbold escape dropped\x1b[0m\n\n",
    );
    text.push_str(&long_text());
    let (_, pages) = render_all(PreviewKind::Text, text.as_bytes(), &Limits::default()).unwrap();
    std::fs::write(dir.join("text-1.png"), &pages[0].png).unwrap();
    // The top at full resolution, to check the column limit against the margins.
    let top = decode(&pages[0]);
    let top = DynamicImage::ImageRgb8(top).crop_imm(0, 60, 1224, 180);
    top.save(dir.join("text-1-top.png")).unwrap();
    let last = pages.last().unwrap();
    std::fs::write(dir.join("text-last.png"), &last.png).unwrap();
    let (_, pages) = render_all(PreviewKind::Pdf, GHOSTSCRIPT_PDF, &Limits::default()).unwrap();
    std::fs::write(dir.join("pdf-1.png"), &pages[0].png).unwrap();
    std::fs::write(dir.join("pdf-2.png"), &pages[1].png).unwrap();
    let mut photo = RgbImage::from_fn(600, 400, |x, y| {
        Rgb([(x * 255 / 600) as u8, (y * 255 / 400) as u8, 160])
    });
    for x in 0..600 {
        photo.put_pixel(x, 200, Rgb([0, 0, 0]));
    }
    let jpeg = jpeg_with_orientation(&photo, 6);
    let (rendered, pages) = render_all(PreviewKind::Image, &jpeg, &Limits::default()).unwrap();
    std::fs::write(dir.join("image.png"), &pages[0].png).unwrap();
    std::fs::write(dir.join("image.pdf"), made_pdf(&rendered)).unwrap();
    let thumb = fit(
        pages[0].width,
        pages[0].height,
        &PageSize {
            scale: Some(25),
            ..PageSize::default()
        },
    );
    std::fs::write(
        dir.join("image-thumb.png"),
        scale_png(&pages[0].png, thumb.0, thumb.1).unwrap(),
    )
    .unwrap();
}
