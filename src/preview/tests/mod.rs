//! Tests of the renderer on fixtures made here (krilla PDFs, images encoded with the image
//! crate, text) plus a Ghostscript PDF kept in `fixtures/`: one module per concern, the
//! fixtures and helpers they share here.

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

mod images;
mod look;
mod pdf;
mod scale;
mod sniff;
mod text;

use super::text::geometry;
use super::*;
use crate::api::PageSize;

const PNG_SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";
const GHOSTSCRIPT_PDF: &[u8] = include_bytes!("../fixtures/ghostscript.pdf");
const ENCRYPTED_PDF: &[u8] = include_bytes!("../fixtures/encrypted.pdf");

/// Renders into memory (the tests' stand-in for the store's writing pages to disk).
fn render_all(
    kind: PreviewKind,
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

/// Checks that `page` is a Letter page at 144 dpi, black and grey on white stored as a grey PNG
/// (several times smaller than RGB), and decodes it.
#[track_caller]
fn grey_letter_page(page: &Page) -> RgbImage {
    assert_eq!((page.width, page.height), (1224, 1584));
    let color = image::load_from_memory(&page.png).unwrap().color();
    assert_eq!(color, image::ColorType::L8);
    assert!(page.png.len() < 150_000, "{} bytes", page.png.len());
    decode(page)
}
