//! PDF pages to PNG with hayro.

use std::io::Read;
use std::sync::Arc;

use hayro::hayro_interpret::InterpreterSettings;
use hayro::hayro_interpret::util::TransformExt;
use hayro::hayro_syntax::object::dict::keys::CONTENTS;
use hayro::hayro_syntax::object::{Array, Stream};
use hayro::hayro_syntax::page::Page as PdfPage;
use hayro::hayro_syntax::{DecryptionError, Filter, LoadPdfError, Pdf};
use hayro::kurbo::Affine;
use hayro::vello_cpu::color::palette::css::WHITE;
use hayro::vello_cpu::peniko::ImageAlphaType;
use hayro::vello_cpu::{Pixels, Pixmap, RasterizerSettings, RenderContext, Resources, TargetInit};
use hayro::{RenderCache, RenderSettings, render_into};
use image::{DynamicImage, RgbImage, RgbaImage};

use super::scale::encode_page;
use super::{DocumentPdf, Limits, PX_PER_PT, Page, Rendered, Unsupported, emit};

/// Decoded bytes of one page's content streams at most. hayro inflates them whole before
/// drawing: a few KB of Flate can inflate to gigabytes (the store's child process bound stops
/// that too; this says why, at once). Real pages, maps and drawings included, stay far below.
pub const MAX_PAGE_CONTENT: u64 = 256 << 20;

/// A PDF file: its own pages, the file itself as the document PDF.
pub(super) fn render_pdf(
    data: &[u8],
    limits: &Limits,
    out: &mut dyn FnMut(Page) -> Result<(), String>,
) -> Result<Rendered, Unsupported> {
    // hayro wants owned, shareable bytes.
    let (pages, truncated) = rasterize(Arc::new(data.to_vec()), limits, out)?;
    Ok(Rendered {
        pdf: DocumentPdf::Original,
        pages,
        truncated,
    })
}

/// Renders each page (up to `max_pages`) and hands it to `out`; returns (pages, truncated).
pub(super) fn rasterize(
    data: Arc<Vec<u8>>,
    limits: &Limits,
    out: &mut dyn FnMut(Page) -> Result<(), String>,
) -> Result<(usize, bool), Unsupported> {
    let pdf = Pdf::new(data).map_err(|e| {
        Unsupported::new(match e {
            LoadPdfError::Decryption(DecryptionError::PasswordProtected) => {
                "encrypted PDF: needs a password to open"
            }
            LoadPdfError::Decryption(DecryptionError::UnsupportedAlgorithm) => {
                "encrypted PDF: unsupported encryption"
            }
            LoadPdfError::Decryption(_) => "encrypted PDF: damaged encryption data",
            LoadPdfError::Invalid => "PDF could not be read (damaged or truncated)",
        })
    })?;
    let all = pdf.pages();
    if all.is_empty() {
        return Err(Unsupported::new("PDF has no pages"));
    }
    // The cache holds fonts and images shared between pages; it lives as long as the document.
    let cache = RenderCache::new();
    let settings = InterpreterSettings::default();
    let mut ctx = RenderContext::new(1, 1);
    let mut resources = Resources::default();
    // At least one page: a preview without pages would be no preview.
    let max_pages = limits.max_pages.max(1);
    let mut rendered = 0;
    for page in all.iter().take(max_pages) {
        limits.check_deadline()?;
        check_content(page)?;
        let png = render_page(page, &cache, &settings, limits, &mut ctx, &mut resources)?;
        emit(out, png)?;
        rendered += 1;
    }
    Ok((rendered, all.len() > max_pages))
}

/// One page at 2 px/pt (less if that exceeds `max_page_side`), on white, as an RGB PNG.
fn render_page<'a>(
    page: &'a PdfPage<'a>,
    cache: &RenderCache<'a>,
    settings: &InterpreterSettings,
    limits: &Limits,
    ctx: &mut RenderContext,
    resources: &mut Resources,
) -> Result<Page, Unsupported> {
    let (w_pt, h_pt) = page.render_dimensions();
    let (w_pt, h_pt) = (sanitize(w_pt), sanitize(h_pt));
    let (width, height) = page_pixels(w_pt, h_pt, limits.max_page_side);
    // The pixmap side is a u16 in vello_cpu.
    let (w16, h16) = (
        u16::try_from(width).map_err(|_| Unsupported::new("page too large"))?,
        u16::try_from(height).map_err(|_| Unsupported::new("page too large"))?,
    );
    ctx.reset_and_resize(w16, h16);
    let transform = Affine::scale_non_uniform(
        f64::from(width) / f64::from(w_pt),
        f64::from(height) / f64::from(h_pt),
    ) * page.initial_transform(true).to_kurbo();
    render_into(
        page,
        cache,
        settings,
        &RenderSettings::default(),
        ctx,
        transform,
    );
    ctx.flush();
    let mut pixmap = Pixmap::new(w16, h16);
    ctx.render_with(
        &mut pixmap,
        resources,
        RasterizerSettings {
            target_init: TargetInit::Clear(WHITE),
            ..Default::default()
        },
    );
    // Opaque white background: premultiplied equals straight. The RGB conversion is left to
    // the (optimized) dependencies: a per-pixel loop here takes ~0.5 s a page in debug builds.
    let rgb = match pixmap.try_take_rgb8(ImageAlphaType::AlphaPremultiplied) {
        Pixels::Rgb8(rgb) => RgbImage::from_raw(width, height, rgb),
        Pixels::Rgba8(rgba) => RgbaImage::from_raw(width, height, rgba)
            .map(|rgba| DynamicImage::ImageRgba8(rgba).into_rgb8()),
    }
    .ok_or_else(|| Unsupported::new("renderer returned a wrong buffer"))?;
    let (png, _) = encode_page(rgb).map_err(Unsupported)?;
    Ok(Page { width, height, png })
}

/// `Err` when the page's content streams inflate to more than [`MAX_PAGE_CONTENT`], counted
/// without keeping them (Flate only; other filters expand little).
pub(super) fn check_content(page: &PdfPage<'_>) -> Result<(), Unsupported> {
    let raw = page.raw();
    let streams: Vec<Stream<'_>> = match raw.get::<Stream<'_>>(CONTENTS) {
        Some(s) => vec![s],
        None => raw
            .get::<Array<'_>>(CONTENTS)
            .map(|a| a.iter::<Stream<'_>>().collect())
            .unwrap_or_default(),
    };
    let mut total = 0;
    for stream in streams {
        total += inflated_len(&stream, MAX_PAGE_CONTENT + 1 - total);
        if total > MAX_PAGE_CONTENT {
            return Err(Unsupported(format!(
                "a page's content inflates to more than {} MiB",
                MAX_PAGE_CONTENT >> 20
            )));
        }
    }
    Ok(())
}

/// The inflated length of a stream of Flate filters (one or more), at most `cap`; 0 for other
/// filters or none. Layers before the last are kept (each at most `cap`), the last is counted.
fn inflated_len(stream: &Stream<'_>, cap: u64) -> u64 {
    let filters = stream.filters();
    if filters.is_empty() || filters.iter().any(|f| *f != Filter::FlateDecode) {
        return 0;
    }
    let mut data = stream.raw_data().into_owned();
    for layer in 1..=filters.len() {
        // As hayro: zlib, else raw deflate; a damaged stream counts what came out of it.
        let mut reader: Box<dyn Read> = if data.starts_with(&[0x78]) {
            Box::new(flate2::read::ZlibDecoder::new(&data[..]))
        } else {
            Box::new(flate2::read::DeflateDecoder::new(&data[..]))
        };
        let mut limited = (&mut reader).take(cap);
        if layer == filters.len() {
            let mut n = 0;
            let mut buf = [0u8; 64 << 10];
            while let Ok(k @ 1..) = limited.read(&mut buf) {
                n += k as u64;
            }
            return n;
        }
        let mut next = Vec::new();
        let _ = limited.read_to_end(&mut next);
        if next.len() as u64 >= cap {
            return cap;
        }
        drop(reader);
        data = next;
    }
    0
}

/// Pixel size of a page of `w_pt` x `h_pt` points: 2 px/pt, shrunk to fit `max_side`.
pub(super) fn page_pixels(w_pt: f32, h_pt: f32, max_side: u32) -> (u32, u32) {
    let (w_pt, h_pt) = (sanitize(w_pt), sanitize(h_pt));
    let max_side = max_side.clamp(1, u32::from(u16::MAX)) as f32;
    let scale = PX_PER_PT.min(max_side / w_pt.max(h_pt));
    let side = |pt: f32| ((pt * scale).round() as u32).clamp(1, max_side as u32);
    (side(w_pt), side(h_pt))
}

/// Page dimensions from a hostile file can be NaN, negative or absurd.
fn sanitize(pt: f32) -> f32 {
    if pt.is_finite() && pt > 0.0 {
        pt.min(1.0e6)
    } else {
        1.0
    }
}
