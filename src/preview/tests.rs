//! Tests of the renderer on fixtures made here (krilla PDFs, images encoded with the image
//! crate, text) plus a Ghostscript PDF kept in `fixtures/`.

use std::io::Cursor;
use std::time::{Duration, Instant};

use hayro::hayro_interpret::font::GlyphRun;
use hayro::hayro_interpret::{
    BlendMode, ClipPath, Context, Device, DrawMode, DrawProps, Image, ImageDrawProps,
    InterpreterCache, InterpreterSettings, SoftMask, interpret_page,
};
use hayro::hayro_syntax::Pdf;
use hayro::kurbo::{Affine, BezPath, Rect};
use image::{DynamicImage, ImageFormat, Rgb, RgbImage, Rgba, RgbaImage};
use krilla::Document;
use krilla::geom::Point;
use krilla::page::PageSettings;
use krilla::text::{Font, TextDirection};

use super::text::geometry;
use super::*;
use crate::api::PageSize;

const PNG_SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";
const GHOSTSCRIPT_PDF: &[u8] = include_bytes!("fixtures/ghostscript.pdf");
const ENCRYPTED_PDF: &[u8] = include_bytes!("fixtures/encrypted.pdf");

/// Renders into memory (the tests' stand-in for the store's writing pages to disk).
fn render_all(
    kind: Kind,
    data: &[u8],
    limits: &Limits,
) -> Result<(Rendered, Vec<Page>), Unsupported> {
    let mut pages = Vec::new();
    let rendered = render(kind, data, limits, &mut |p| {
        pages.push(p);
        Ok(())
    })?;
    assert_eq!(
        rendered.pages,
        pages.len(),
        "Rendered.pages counts the pages handed out"
    );
    Ok((rendered, pages))
}

fn decode(page: &Page) -> RgbImage {
    assert!(page.png.starts_with(PNG_SIGNATURE), "page is a PNG");
    let img = image::load_from_memory_with_format(&page.png, ImageFormat::Png).unwrap();
    assert_eq!((img.width(), img.height()), (page.width, page.height));
    img.into_rgb8()
}

/// Pixels in the box (x0..x1, y0..y1) that are clearly not white.
fn ink(img: &RgbImage, x0: u32, y0: u32, x1: u32, y1: u32) -> usize {
    let mut n = 0;
    for y in y0..y1.min(img.height()) {
        for x in x0..x1.min(img.width()) {
            if img.get_pixel(x, y).0.iter().any(|&c| c < 200) {
                n += 1;
            }
        }
    }
    n
}

/// A Letter-sized PDF written with krilla: "Page N" in 40 pt DejaVu Sans at (72, 144) pt.
fn krilla_pdf(pages: usize, width: f32, height: f32) -> Vec<u8> {
    let font = Font::new(dejavu::sans::regular().into(), 0).unwrap();
    let mut doc = Document::new();
    for n in 1..=pages {
        let mut page = doc.start_page_with(PageSettings::from_wh(width, height).unwrap());
        let mut surface = page.surface();
        surface.draw_text(
            Point::from_xy(72.0, 144.0),
            font.clone(),
            40.0,
            &format!("Page {n}"),
            false,
            TextDirection::Auto,
        );
        surface.finish();
        page.finish();
    }
    doc.finish().unwrap()
}

/// Text as a PDF reader would copy it: each glyph's Unicode (ToUnicode map), or the
/// /ActualText of a marked-content span (krilla's way for glyphs like .notdef that stand for
/// several characters); a line break after each glyph run.
fn extract_text(pdf: &[u8]) -> Vec<String> {
    use hayro::hayro_interpret::hayro_cmap::BfString;
    use hayro::hayro_syntax::object::{Dict, String as PdfString};

    #[derive(Default)]
    struct Collect {
        text: String,
        /// One entry per open marked-content span: whether it carried /ActualText.
        spans: Vec<bool>,
    }
    impl<'a> Device<'a> for Collect {
        fn draw_path(&mut self, _: &BezPath, _: DrawProps<'a>, _: &DrawMode) {}
        fn push_clip_path(&mut self, _: &ClipPath) {}
        fn push_transparency_group(&mut self, _: f32, _: Option<SoftMask<'a>>, _: BlendMode) {}
        fn draw_glyph_run(&mut self, run: &GlyphRun<'_, 'a>, _: DrawProps<'a>, _: &DrawMode) {
            if self.spans.contains(&true) {
                return;
            }
            for glyph in run.glyphs() {
                match glyph.as_unicode() {
                    Some(BfString::Char(c)) => self.text.push(c),
                    Some(BfString::String(s)) => self.text.push_str(&s),
                    None => self.text.push('\u{FFFD}'),
                }
            }
            self.text.push('\n');
        }
        fn draw_image(&mut self, _: Image<'a, '_>, _: ImageDrawProps<'a>) {}
        fn pop_clip(&mut self) {}
        fn pop_transparency_group(&mut self) {}
        fn begin_marked_content(&mut self, _: &[u8], properties: Option<&Dict<'_>>) {
            let actual = properties.and_then(|p| p.get::<PdfString<'_>>("ActualText"));
            if let Some(actual) = &actual {
                let bytes = actual.as_bytes();
                if let Some(utf16) = bytes.strip_prefix(&[0xFE, 0xFF]) {
                    let units = utf16
                        .chunks_exact(2)
                        .map(|p| u16::from_be_bytes([p[0], p[1]]));
                    self.text
                        .extend(char::decode_utf16(units).map(|c| c.unwrap_or('\u{FFFD}')));
                } else {
                    self.text.extend(bytes.iter().map(|&b| char::from(b)));
                }
            }
            self.spans.push(actual.is_some());
        }
        fn end_marked_content(&mut self) {
            self.spans.pop();
        }
    }
    let pdf = Pdf::new(std::sync::Arc::new(pdf.to_vec())).unwrap();
    let cache = InterpreterCache::new();
    pdf.pages()
        .iter()
        .map(|page| {
            let mut ctx = Context::new(
                Affine::IDENTITY,
                Rect::new(0.0, 0.0, 1.0e4, 1.0e4),
                &cache,
                page.xref(),
                InterpreterSettings::default(),
            );
            let mut device = Collect::default();
            interpret_page(page, &mut ctx, &mut device);
            device.text
        })
        .collect()
}

fn made_pdf(rendered: &Rendered) -> &[u8] {
    match &rendered.pdf {
        DocumentPdf::Made(pdf) => pdf,
        DocumentPdf::Original => panic!("expected a made PDF"),
    }
}

// ---------------------------------------------------------------- sniff

#[test]
fn sniff_by_content_first() {
    let mut pdf_late = vec![b' '; 600];
    pdf_late.extend_from_slice(b"%PDF-1.7\n");
    assert_eq!(
        sniff("x.bin", &pdf_late),
        Kind::Pdf,
        "%PDF- within the first 1 KiB"
    );
    let mut pdf_later = vec![b'\n'; 2000];
    pdf_later.extend_from_slice(b"%PDF-1.7\n");
    assert_eq!(
        sniff("x.pdf", &pdf_later),
        Kind::Pdf,
        ".pdf with the magic further in"
    );
    assert_eq!(
        sniff("x.pdf", b"hello, not a pdf"),
        Kind::Text,
        "content wins over the name"
    );
    assert_eq!(
        sniff("a.jpg", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR"),
        Kind::Image
    );
    assert_eq!(
        sniff("noext", &[0xFF, 0xD8, 0xFF, 0xE0, 0, 0x10]),
        Kind::Image
    );
    assert_eq!(sniff("a", b"GIF89a\x01\0\x01\0"), Kind::Image);
    assert_eq!(sniff("a", b"RIFF\x10\0\0\0WEBPVP8L"), Kind::Image);
    assert_eq!(sniff("a", b"II*\0\x08\0\0\0"), Kind::Image);
    assert_eq!(sniff("a", b"MM\0*\0\0\0\x08"), Kind::Image);
    let mut bmp = b"BM".to_vec();
    bmp.extend_from_slice(&[0; 12]);
    bmp.extend_from_slice(&40u32.to_le_bytes());
    assert_eq!(sniff("a", &bmp), Kind::Image);
    assert_eq!(
        sniff("a.txt", b"BMW and Audi are car makers"),
        Kind::Text,
        "BM is not enough"
    );
    for name in [
        "a.txt", "a.md", "a.csv", "a.rs", "a.log", "README", ".bashrc",
    ] {
        assert_eq!(
            sniff(name, "plain text, é ü € Привет\n".as_bytes()),
            Kind::Text,
            "{name}"
        );
    }
    assert_eq!(
        sniff("latin1", b"caf\xe9 na\xefve \x80 12,50\n"),
        Kind::Text
    );
    assert_eq!(sniff("utf16", b"\xff\xfeh\0i\0 \0\xac\x20"), Kind::Text);
    assert_eq!(sniff("a.txt", b""), Kind::Unsupported, "empty file");
    assert_eq!(
        sniff("a.zip", b"PK\x03\x04\x14\0\0\0\x08\0"),
        Kind::Unsupported
    );
    assert_eq!(
        sniff("a.docx", b"PK\x03\x04\x14\0\x06\0\x08\0\0\0!\0"),
        Kind::Unsupported
    );
    assert_eq!(sniff("a.bin", &random_bytes(8192, 1)), Kind::Unsupported);
    // A head cut in the middle of a UTF-8 character is still text.
    let cut = "ab€".as_bytes();
    assert_eq!(sniff("a", &cut[..cut.len() - 1]), Kind::Text);
    // Control characters: few are fine, many are binary unless the name says text.
    let mut noisy = b"log line\n".repeat(20);
    noisy.extend_from_slice(&[0x01; 8]);
    assert_eq!(sniff("a", &noisy), Kind::Unsupported);
    assert_eq!(sniff("a.log", &noisy), Kind::Text);
}

/// A name's class is all `sniff` reads of it: the store keys previews by the kind so chosen.
#[test]
fn a_name_counts_only_by_its_class() {
    let mut noisy = b"log line\n".repeat(20);
    noisy.extend_from_slice(&[0x01; 8]);
    let mut pdf_later = vec![b'\n'; 2000];
    pdf_later.extend_from_slice(b"%PDF-1.7\n");
    let heads: [&[u8]; 6] = [
        &noisy,
        &pdf_later,
        b"plain text\n",
        b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR",
        b"",
        b"PK\x03\x04\x14\0\0\0\x08\0",
    ];
    let names = [
        "a.pdf",
        "a.PDF",
        "a.txt",
        "a.csv",
        "a.log",
        "a",
        "a.bin",
        "a.pdf.bin",
        ".pdf",
        "b.Md",
    ];
    for head in heads {
        for name in names {
            assert_eq!(
                sniff(name, head),
                kinds(head)[name_class(name)],
                "{name} {head:?}"
            );
        }
    }
    assert_eq!(
        kinds(&noisy),
        [Kind::Unsupported, Kind::Text, Kind::Unsupported]
    );
    for k in [Kind::Pdf, Kind::Image, Kind::Text, Kind::Unsupported] {
        assert_eq!(Kind::parse(k.as_str()), Some(k));
    }
}

fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    // xorshift: deterministic, no dependency.
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

// ---------------------------------------------------------------- PDF

#[test]
fn krilla_pdf_pages_are_letter_at_144_dpi() {
    let pdf = krilla_pdf(3, 612.0, 792.0);
    assert_eq!(sniff("doc.pdf", &pdf), Kind::Pdf);
    let (rendered, pages) = render_all(Kind::Pdf, &pdf, &Limits::default()).unwrap();
    assert!(matches!(rendered.pdf, DocumentPdf::Original));
    assert_eq!((rendered.pages, rendered.truncated), (3, false));
    for page in &pages {
        assert_eq!((page.width, page.height), (1224, 1584));
        // Black and grey on white: stored as a grey PNG (several times smaller than RGB).
        let color = image::load_from_memory(&page.png).unwrap().color();
        assert_eq!(color, image::ColorType::L8);
        assert!(page.png.len() < 150_000, "{} bytes", page.png.len());
        let img = decode(page);
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
    let (rendered, pages) = render_all(Kind::Pdf, GHOSTSCRIPT_PDF, &Limits::default()).unwrap();
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
    assert_eq!(sniff("e.pdf", ENCRYPTED_PDF), Kind::Pdf);
    let err = render_all(Kind::Pdf, ENCRYPTED_PDF, &Limits::default()).unwrap_err();
    assert_eq!(err.0, "encrypted PDF: needs a password to open");
}

#[test]
fn truncated_or_garbage_pdf_is_unsupported() {
    let pdf = krilla_pdf(2, 612.0, 792.0);
    for len in [0, 9, 100, 400] {
        let err = render_all(Kind::Pdf, &pdf[..len], &Limits::default()).unwrap_err();
        assert!(!err.0.is_empty(), "cut at {len}");
    }
    // Cut anywhere: a preview of what survives or Unsupported, never a panic.
    for len in (0..pdf.len()).step_by(97) {
        let _ = render_all(Kind::Pdf, &pdf[..len], &Limits::default());
    }
    let mut junk = b"%PDF-1.7\n".to_vec();
    junk.extend(random_bytes(5000, 7));
    assert!(render_all(Kind::Pdf, &junk, &Limits::default()).is_err());
}

#[test]
fn pdf_pages_beyond_max_pages_are_dropped() {
    let pdf = krilla_pdf(5, 612.0, 792.0);
    let limits = Limits {
        max_pages: 2,
        ..Limits::default()
    };
    let (rendered, pages) = render_all(Kind::Pdf, &pdf, &limits).unwrap();
    assert_eq!(
        (rendered.pages, rendered.truncated, pages.len()),
        (2, true, 2)
    );
    let zero = Limits {
        max_pages: 0,
        ..Limits::default()
    };
    let (rendered, _) = render_all(Kind::Pdf, &pdf, &zero).unwrap();
    assert_eq!(
        (rendered.pages, rendered.truncated),
        (1, true),
        "0 counts as 1"
    );
    let (rendered, _) = render_all(Kind::Text, b"text", &zero).unwrap();
    assert_eq!(rendered.pages, 1);
}

#[test]
fn pdf_after_leading_junk_renders() {
    // Readers accept a header within the first KiB (mail or HTTP leftovers before it).
    let mut pdf = b"Content-Type: application/pdf\r\n\r\n".to_vec();
    pdf.extend(krilla_pdf(2, 612.0, 792.0));
    assert_eq!(sniff("mail.bin", &pdf), Kind::Pdf);
    let (rendered, pages) = render_all(Kind::Pdf, &pdf, &Limits::default()).unwrap();
    assert_eq!(rendered.pages, 2);
    assert!(ink(&decode(&pages[1]), 144, 200, 500, 300) > 1000);
}

#[test]
fn huge_pdf_page_is_shrunk_to_max_page_side() {
    let pdf = krilla_pdf(1, 3000.0, 1000.0);
    let (_, pages) = render_all(Kind::Pdf, &pdf, &Limits::default()).unwrap();
    assert_eq!((pages[0].width, pages[0].height), (4096, 1365));
    let small = Limits {
        max_page_side: 1000,
        ..Limits::default()
    };
    let (_, pages) = render_all(Kind::Pdf, &krilla_pdf(1, 612.0, 792.0), &small).unwrap();
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
        (Kind::Pdf, krilla_pdf(1, 612.0, 792.0)),
        (Kind::Text, b"hello\n".to_vec()),
        (Kind::Image, png),
    ] {
        let err = render_all(kind, &data, &limits).unwrap_err();
        assert_eq!(err, Unsupported("took too long".into()), "{kind:?}");
    }
}

#[test]
fn an_error_from_out_stops_the_job() {
    let pdf = krilla_pdf(3, 612.0, 792.0);
    let mut calls = 0;
    let err = render(Kind::Pdf, &pdf, &Limits::default(), &mut |_| {
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
        assert_eq!(sniff("x", &data), Kind::Unsupported);
        for kind in [Kind::Pdf, Kind::Image, Kind::Text, Kind::Unsupported] {
            assert!(
                render_all(kind, &data, &Limits::default()).is_err(),
                "{kind:?}"
            );
        }
    }
    assert!(
        render_all(Kind::Text, b"", &Limits::default()).is_err(),
        "empty file"
    );
}

// ---------------------------------------------------------------- images

/// Left half red, right half blue, a green top-left pixel: shows size and orientation.
fn test_image(w: u32, h: u32) -> RgbImage {
    let mut img = RgbImage::from_fn(w, h, |x, _| {
        if x < w / 2 {
            Rgb([220, 20, 20])
        } else {
            Rgb([20, 20, 220])
        }
    });
    img.put_pixel(0, 0, Rgb([20, 200, 20]));
    img
}

fn encode(img: &RgbImage, format: ImageFormat) -> Vec<u8> {
    let mut out = Cursor::new(Vec::new());
    DynamicImage::ImageRgb8(img.clone())
        .write_to(&mut out, format)
        .unwrap();
    out.into_inner()
}

#[test]
fn every_image_format_renders_at_its_pixel_size() {
    let img = test_image(40, 30);
    for format in [
        ImageFormat::Png,
        ImageFormat::Jpeg,
        ImageFormat::Gif,
        ImageFormat::WebP,
        ImageFormat::Bmp,
        ImageFormat::Tiff,
    ] {
        let data = encode(&img, format);
        assert_eq!(sniff("picture", &data), Kind::Image, "{format:?}");
        let (rendered, pages) = render_all(Kind::Image, &data, &Limits::default()).unwrap();
        assert_eq!((rendered.pages, rendered.truncated), (1, false));
        assert_eq!((pages[0].width, pages[0].height), (40, 30), "{format:?}");
        let page = decode(&pages[0]);
        let Rgb([r, _, b]) = *page.get_pixel(5, 15);
        assert!(r > 150 && b < 100, "{format:?}: left is red");
        let Rgb([r, _, b]) = *page.get_pixel(35, 15);
        assert!(b > 150 && r < 100, "{format:?}: right is blue");
        // The PDF: one page of 20 x 15 pt, whose 2 px/pt rendering is the picture again.
        let pdf = made_pdf(&rendered);
        let (_, pdf_pages) = render_all(Kind::Pdf, pdf, &Limits::default()).unwrap();
        assert_eq!(
            (pdf_pages[0].width, pdf_pages[0].height),
            (40, 30),
            "{format:?}"
        );
        let Rgb([r, _, b]) = *decode(&pdf_pages[0]).get_pixel(5, 15);
        assert!(r > 150 && b < 100, "{format:?}: PDF shows the picture");
    }
}

#[test]
fn transparency_is_composited_onto_white() {
    let mut img = RgbaImage::from_pixel(10, 10, Rgba([0, 0, 0, 0]));
    img.put_pixel(1, 1, Rgba([0, 0, 0, 255]));
    img.put_pixel(2, 2, Rgba([0, 0, 0, 128]));
    let mut data = Cursor::new(Vec::new());
    img.write_to(&mut data, ImageFormat::Png).unwrap();
    let (_, pages) = render_all(Kind::Image, data.get_ref(), &Limits::default()).unwrap();
    let page = decode(&pages[0]);
    assert_eq!(*page.get_pixel(0, 0), Rgb([255, 255, 255]));
    assert_eq!(*page.get_pixel(1, 1), Rgb([0, 0, 0]));
    assert_eq!(*page.get_pixel(2, 2), Rgb([127, 127, 127]));
}

/// A JPEG with an APP1 Exif segment holding one IFD entry: Orientation (0x0112).
fn jpeg_with_orientation(img: &RgbImage, orientation: u16) -> Vec<u8> {
    let jpeg = encode(img, ImageFormat::Jpeg);
    let mut tiff = b"MM\0*\0\0\0\x08".to_vec(); // big-endian TIFF header, IFD at 8
    tiff.extend_from_slice(&1u16.to_be_bytes()); // one entry
    tiff.extend_from_slice(&0x0112u16.to_be_bytes()); // tag: Orientation
    tiff.extend_from_slice(&3u16.to_be_bytes()); // type: SHORT
    tiff.extend_from_slice(&1u32.to_be_bytes()); // count
    tiff.extend_from_slice(&orientation.to_be_bytes());
    tiff.extend_from_slice(&[0, 0]); // value padding
    tiff.extend_from_slice(&0u32.to_be_bytes()); // no next IFD
    let mut app1 = b"Exif\0\0".to_vec();
    app1.extend_from_slice(&tiff);
    let mut out = jpeg[..2].to_vec(); // SOI
    out.extend_from_slice(&[0xFF, 0xE1]);
    out.extend_from_slice(&(app1.len() as u16 + 2).to_be_bytes());
    out.extend_from_slice(&app1);
    out.extend_from_slice(&jpeg[2..]);
    out
}

#[test]
fn jpeg_exif_orientation_is_applied() {
    // 40 x 20, red left half; orientation 6 = "rotate 90° clockwise to display".
    let data = jpeg_with_orientation(&test_image(40, 20), 6);
    let (rendered, pages) = render_all(Kind::Image, &data, &Limits::default()).unwrap();
    assert_eq!(
        (pages[0].width, pages[0].height),
        (20, 40),
        "rotated to portrait"
    );
    let page = decode(&pages[0]);
    // Turned clockwise, the left (red) half is now on top and the right (blue) at the bottom.
    let Rgb([r, _, b]) = *page.get_pixel(10, 5);
    assert!(r > 150 && b < 100, "top is red");
    let Rgb([r, _, b]) = *page.get_pixel(10, 35);
    assert!(b > 150 && r < 100, "bottom is blue");
    let (_, pdf_pages) = render_all(Kind::Pdf, made_pdf(&rendered), &Limits::default()).unwrap();
    assert_eq!(
        (pdf_pages[0].width, pdf_pages[0].height),
        (20, 40),
        "the PDF too"
    );
    // Orientation 1 leaves it alone.
    let data = jpeg_with_orientation(&test_image(40, 20), 1);
    let (_, pages) = render_all(Kind::Image, &data, &Limits::default()).unwrap();
    assert_eq!((pages[0].width, pages[0].height), (40, 20));
}

#[test]
fn large_image_is_shrunk_to_max_page_side() {
    let data = encode(&test_image(500, 100), ImageFormat::Png);
    let limits = Limits {
        max_page_side: 200,
        ..Limits::default()
    };
    let (rendered, pages) = render_all(Kind::Image, &data, &limits).unwrap();
    assert_eq!((pages[0].width, pages[0].height), (200, 40));
    let (_, pdf_pages) = render_all(Kind::Pdf, made_pdf(&rendered), &Limits::default()).unwrap();
    assert_eq!((pdf_pages[0].width, pdf_pages[0].height), (200, 40));
}

/// A PNG signature and an IHDR chunk (with its real CRC) claiming `w` x `h` RGBA, then a
/// little zlib data: the header of a decompression bomb.
fn png_bomb(w: u32, h: u32) -> Vec<u8> {
    let mut ihdr = b"IHDR".to_vec();
    ihdr.extend_from_slice(&w.to_be_bytes());
    ihdr.extend_from_slice(&h.to_be_bytes());
    ihdr.extend_from_slice(&[8, 6, 0, 0, 0]);
    let mut png = PNG_SIGNATURE.to_vec();
    png.extend_from_slice(&13u32.to_be_bytes());
    png.extend_from_slice(&ihdr);
    png.extend_from_slice(&crc32(&ihdr).to_be_bytes());
    let mut idat = b"IDAT".to_vec();
    idat.extend_from_slice(&[0x78, 0x9C, 0x63, 0, 0, 0, 0, 0]);
    png.extend_from_slice(&(idat.len() as u32 - 4).to_be_bytes());
    png.extend_from_slice(&idat);
    png.extend_from_slice(&crc32(&idat).to_be_bytes());
    png
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn decompression_bomb_fails_fast() {
    let bomb = png_bomb(100_000, 100_000);
    assert_eq!(sniff("bomb.png", &bomb), Kind::Image);
    let start = Instant::now();
    let err = render_all(Kind::Image, &bomb, &Limits::default()).unwrap_err();
    assert!(err.0.contains("too large"), "{err}");
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
    // Within the pixel limit but over a lower one.
    let data = encode(&test_image(40, 30), ImageFormat::Png);
    let tight = Limits {
        max_image_pixels: 1000,
        ..Limits::default()
    };
    assert!(render_all(Kind::Image, &data, &tight).is_err());
    // Truncated and garbage images.
    assert!(render_all(Kind::Image, &data[..data.len() / 2], &Limits::default()).is_err());
    let mut junk = b"GIF89a".to_vec();
    junk.extend(random_bytes(3000, 3));
    assert!(render_all(Kind::Image, &junk, &Limits::default()).is_err());
}

// ---------------------------------------------------------------- text

fn long_text() -> String {
    let mut text = String::new();
    for n in 1..=150 {
        text.push_str(&format!(
            "{n:03} café naïve über € Привет мир — line of a text file\tafter a tab\n"
        ));
        if n % 10 == 0 {
            // A long line: wrapped over several lines.
            text.push_str(&"wrapped-word ".repeat(30));
            text.push('\n');
        }
    }
    text
}

#[test]
fn text_is_laid_out_on_letter_pages_with_real_text() {
    let text = long_text();
    let (rendered, pages) = render_all(Kind::Text, text.as_bytes(), &Limits::default()).unwrap();
    // 150 lines + 15 long lines of 4 wrapped lines each = 210 lines at 62 a page.
    assert_eq!((rendered.pages, rendered.truncated), (4, false));
    let pdf = made_pdf(&rendered);
    assert!(pdf.starts_with(b"%PDF-"));
    let copied = extract_text(pdf);
    assert_eq!(copied.len(), 4);
    let head: String = copied[0].chars().take(300).collect();
    assert!(
        copied[0].contains("001 café naïve über € Привет мир — line of a text file"),
        "{head}"
    );
    assert!(
        copied[0].contains("1 / 4") && copied[3].contains("4 / 4"),
        "page numbers"
    );
    assert!(copied[3].contains("150 café"));
    // Tabs expanded to the next multiple of 8 columns: 54 characters, then 2 spaces.
    assert!(copied[0].contains("file  after a tab"), "{head}");
    // Long lines are wrapped at a word boundary, never longer than the column limit.
    for line in copied.iter().flat_map(|p| p.lines()) {
        assert!(line.chars().count() <= geometry::COLUMNS, "{line}");
    }
    assert!(
        copied[0]
            .lines()
            .any(|l| l.starts_with("wrapped-word wrapped-word"))
    );
    for page in &pages {
        assert_eq!((page.width, page.height), (1224, 1584));
        // Black and grey on white: stored as a grey PNG (several times smaller than RGB).
        let color = image::load_from_memory(&page.png).unwrap().color();
        assert_eq!(color, image::ColorType::L8);
        assert!(page.png.len() < 150_000, "{} bytes", page.png.len());
        let img = decode(page);
        // Ink inside the margins, none left of them.
        assert!(ink(&img, geometry::MARGIN_X_PX, 96, 1224, 300) > 1000);
        assert_eq!(ink(&img, 0, 0, geometry::MARGIN_X_PX - 4, 1584), 0);
        // The page number in the footer.
        assert!(ink(&img, 500, 1500, 724, 1560) > 50, "footer");
    }
}

#[test]
fn latin1_and_utf16_text() {
    let latin1 = b"caf\xe9 na\xefve \x80 12,50 \x93quoted\x94\n";
    let (rendered, _) = render_all(Kind::Text, latin1, &Limits::default()).unwrap();
    let copied = extract_text(made_pdf(&rendered));
    assert!(
        copied[0].contains("café naïve € 12,50 “quoted”"),
        "{}",
        copied[0]
    );
    let mut utf16 = vec![0xFF, 0xFE];
    utf16.extend("Grüße, Ελλάδα\n".encode_utf16().flat_map(u16::to_le_bytes));
    let (rendered, _) = render_all(Kind::Text, &utf16, &Limits::default()).unwrap();
    assert!(extract_text(made_pdf(&rendered))[0].contains("Grüße, Ελλάδα"));
}

#[test]
fn form_feed_starts_a_page_and_whitespace_gives_one_blank_page() {
    let (rendered, _) =
        render_all(Kind::Text, b"one\n\x0ctwo\n\x0cthree", &Limits::default()).unwrap();
    let copied = extract_text(made_pdf(&rendered));
    assert_eq!(copied.len(), 3);
    assert!(copied[1].starts_with("two\n"));
    let (rendered, pages) = render_all(Kind::Text, b"\n\n   \n", &Limits::default()).unwrap();
    assert_eq!((rendered.pages, pages.len()), (1, 1));
}

#[test]
fn text_beyond_max_pages_is_dropped() {
    let text = "line\n".repeat(geometry::LINES * 10);
    let limits = Limits {
        max_pages: 3,
        ..Limits::default()
    };
    let (rendered, pages) = render_all(Kind::Text, text.as_bytes(), &limits).unwrap();
    assert_eq!(
        (rendered.pages, rendered.truncated, pages.len()),
        (3, true, 3)
    );
    assert_eq!(
        extract_text(made_pdf(&rendered)).len(),
        3,
        "the PDF has as many pages"
    );
    // Exactly full: nothing dropped.
    let text = "line\n".repeat(geometry::LINES * 3);
    let (rendered, _) = render_all(Kind::Text, text.as_bytes(), &limits).unwrap();
    assert_eq!((rendered.pages, rendered.truncated), (3, false));
}

#[test]
fn cjk_and_controls_do_not_break_layout() {
    let text = "漢字かな交じり文 and \x1b[31mred\x1b[0m and a bell \x07\n".repeat(5);
    let (rendered, _) = render_all(Kind::Text, text.as_bytes(), &Limits::default()).unwrap();
    let copied = extract_text(made_pdf(&rendered));
    // CJK glyphs are missing from DejaVu: .notdef boxes, whose text is in /ActualText.
    assert!(
        copied[0].contains("漢字かな交じり文 and red and a bell \u{FFFD}"),
        "{}",
        copied[0]
    );
    assert_eq!(copied[0].matches("漢字かな交じり文").count(), 5);
}

// ---------------------------------------------------------------- fit, scale_png

#[test]
fn fit_table() {
    let size = |scale, max_width, max_height| PageSize {
        scale,
        max_width,
        max_height,
    };
    let cases = [
        // (w, h, request) -> expected
        ((1224, 1584), size(None, None, None), (1224, 1584)),
        ((1224, 1584), size(Some(100), None, None), (1224, 1584)),
        ((1224, 1584), size(Some(25), None, None), (306, 396)),
        ((1224, 1584), size(Some(50), None, None), (612, 792)),
        ((1224, 1584), size(Some(1), None, None), (12, 16)),
        ((1224, 1584), size(Some(0), None, None), (12, 16)), // clamped to 1%
        ((1224, 1584), size(Some(250), None, None), (1224, 1584)), // clamped to 100%
        ((1224, 1584), size(None, Some(600), None), (600, 776)),
        ((1224, 1584), size(None, None, Some(792)), (612, 792)),
        ((1224, 1584), size(None, Some(600), Some(600)), (464, 600)),
        (
            (1224, 1584),
            size(Some(25), Some(600), Some(600)),
            (306, 396),
        ), // scale is smaller
        ((1224, 1584), size(Some(50), Some(300), None), (300, 388)), // bound is smaller
        (
            (1224, 1584),
            size(None, Some(5000), Some(5000)),
            (1224, 1584),
        ), // never enlarged
        ((1000, 1), size(Some(10), None, None), (100, 1)),           // never below 1 px
        ((1, 1000), size(None, Some(1), Some(10)), (1, 10)),
        ((3, 3), size(Some(1), None, None), (1, 1)),
        ((1224, 1584), size(None, Some(0), None), (1, 1)),
        ((333, 333), size(Some(50), None, None), (167, 167)), // 166.5 rounds up
        ((0, 0), size(None, None, None), (1, 1)),
    ];
    for ((w, h), request, expected) in cases {
        let got = fit(w, h, &request);
        assert_eq!(got, expected, "fit({w}, {h}, {request:?})");
        if let Some(max_w) = request.max_width {
            assert!(got.0 <= max_w.max(1));
        }
        if let Some(max_h) = request.max_height {
            assert!(got.1 <= max_h.max(1));
        }
    }
}

#[test]
fn scale_png_resizes_exactly() {
    let page = encode(&test_image(200, 100), ImageFormat::Png);
    let small = scale_png(&page, 50, 25).unwrap();
    assert!(small.starts_with(PNG_SIGNATURE));
    let img = image::load_from_memory(&small).unwrap().into_rgb8();
    assert_eq!(img.dimensions(), (50, 25));
    let Rgb([r, _, b]) = *img.get_pixel(10, 12);
    assert!(r > 150 && b < 100, "colours survive");
    assert_eq!(
        scale_png(&page, 200, 100).unwrap(),
        page,
        "same size: unchanged"
    );
    assert!(scale_png(b"not a png", 10, 10).is_err());
    // A grey page stays grey.
    let (_, pages) = render_all(Kind::Text, b"grey text\n", &Limits::default()).unwrap();
    let thumb = scale_png(&pages[0].png, 306, 396).unwrap();
    let thumb = image::load_from_memory(&thumb).unwrap();
    assert_eq!(
        (thumb.width(), thumb.height(), thumb.color()),
        (306, 396, image::ColorType::L8)
    );
    assert!(scale_png(&page, 0, 10).is_err());
}

// ---------------------------------------------------------------- timings, look

#[test]
fn timings_of_twenty_pages() {
    let text = long_text().repeat(6); // 22 pages, 20 rendered
    let twenty = Limits {
        max_pages: 20,
        ..Limits::default()
    };
    let start = Instant::now();
    let (text_rendered, _) = render_all(Kind::Text, text.as_bytes(), &twenty).unwrap();
    let text_time = start.elapsed();
    assert_eq!((text_rendered.pages, text_rendered.truncated), (20, true));
    let text_pdf = made_pdf(&text_rendered);
    let start = Instant::now();
    let (rendered, _) = render_all(Kind::Pdf, text_pdf, &Limits::default()).unwrap();
    let text_pdf_time = start.elapsed();
    assert_eq!(rendered.pages, 20);
    let sparse = krilla_pdf(20, 612.0, 792.0);
    let start = Instant::now();
    let (rendered, _) = render_all(Kind::Pdf, &sparse, &Limits::default()).unwrap();
    let sparse_time = start.elapsed();
    assert_eq!(rendered.pages, 20);
    println!(
        "timing: 20-page text file {text_time:?} (decode, layout, PDF, rasterize); \
         that 20-page PDF alone {text_pdf_time:?}; 20 sparse krilla pages {sparse_time:?}"
    );
}

/// Writes one page of each kind to /tmp/preview-look/ for a person to look at:
/// `cargo test --lib preview::tests::look -- --ignored`.
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
    let (_, pages) = render_all(Kind::Text, text.as_bytes(), &Limits::default()).unwrap();
    std::fs::write(dir.join("text-1.png"), &pages[0].png).unwrap();
    // The top at full resolution, to check the column limit against the margins.
    let top = decode(&pages[0]);
    let top = DynamicImage::ImageRgb8(top).crop_imm(0, 60, 1224, 180);
    top.save(dir.join("text-1-top.png")).unwrap();
    let last = pages.last().unwrap();
    std::fs::write(dir.join("text-last.png"), &last.png).unwrap();
    let (_, pages) = render_all(Kind::Pdf, GHOSTSCRIPT_PDF, &Limits::default()).unwrap();
    std::fs::write(dir.join("pdf-1.png"), &pages[0].png).unwrap();
    std::fs::write(dir.join("pdf-2.png"), &pages[1].png).unwrap();
    let mut photo = RgbImage::from_fn(600, 400, |x, y| {
        Rgb([(x * 255 / 600) as u8, (y * 255 / 400) as u8, 160])
    });
    for x in 0..600 {
        photo.put_pixel(x, 200, Rgb([0, 0, 0]));
    }
    let jpeg = jpeg_with_orientation(&photo, 6);
    let (rendered, pages) = render_all(Kind::Image, &jpeg, &Limits::default()).unwrap();
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
