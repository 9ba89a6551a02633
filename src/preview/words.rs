//! The text of a file for the search index (`store::search`): a text file's own characters,
//! a PDF's text layer (the Unicode of each glyph shown, in content order). No layout and no
//! OCR: what a viewer's "select all, copy" gives, roughly.

use std::sync::Arc;

use hayro::hayro_interpret::font::GlyphRun;
use hayro::hayro_interpret::hayro_cmap::BfString;
use hayro::hayro_interpret::hayro_syntax::Pdf;
use hayro::hayro_interpret::kurbo::{Affine, BezPath, Rect};
use hayro::hayro_interpret::{
    BlendMode, ClipPath, Context, Device, DrawMode, DrawProps, Image, ImageDrawProps,
    InterpreterCache, InterpreterSettings, SoftMask, interpret_page,
};

use super::{Limits, PreviewKind, Unsupported};

/// Characters of text kept per file: what is indexed (PostgreSQL's tsvector takes at most
/// 1 MB, and a search finds a document by its first few hundred pages).
pub const INDEX_MAX_CHARS: usize = 512 * 1024;

/// The text of `data` as a file of `kind` (at most [`INDEX_MAX_CHARS`]); `Err` when it has
/// none to index (an image, an encrypted or damaged PDF). For PDFs run it where a hostile
/// file can do no harm (the store runs it in its preview child process).
pub fn extract(kind: PreviewKind, data: &[u8], limits: &Limits) -> Result<String, Unsupported> {
    let text = match kind {
        PreviewKind::Text => String::from_utf8_lossy(data).into_owned(),
        PreviewKind::Pdf => {
            let job = std::panic::AssertUnwindSafe(|| pdf_text(data, limits));
            std::panic::catch_unwind(job)
                .map_err(|_| Unsupported::new("text extraction panicked"))??
        }
        _ => return Err(Unsupported::new("no text to index in this kind of file")),
    };
    Ok(cut(text))
}

/// `text` cut to [`INDEX_MAX_CHARS`] at a character boundary.
fn cut(mut text: String) -> String {
    if text.len() > INDEX_MAX_CHARS {
        let mut end = INDEX_MAX_CHARS;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

fn pdf_text(data: &[u8], limits: &Limits) -> Result<String, Unsupported> {
    let pdf = Pdf::new(Arc::new(data.to_vec()))
        .map_err(|_| Unsupported::new("PDF could not be read (damaged, truncated or encrypted)"))?;
    let cache = InterpreterCache::new();
    let settings = InterpreterSettings::default();
    let mut device = Words::default();
    for page in pdf.pages().iter().take(limits.max_pages.max(1)) {
        limits.check_deadline()?;
        super::pdf::check_content(page)?;
        let bbox = Rect::new(-1e6, -1e6, 1e6, 1e6);
        let mut ctx = Context::new(
            Affine::IDENTITY,
            bbox,
            &cache,
            page.xref(),
            settings.clone(),
        );
        interpret_page(page, &mut ctx, &mut device);
        device.out.push('\n');
        device.last = None;
        if device.out.len() > INDEX_MAX_CHARS {
            break;
        }
    }
    Ok(device.out)
}

/// A device that keeps only the glyphs' Unicode: a space between runs shown on one line, a
/// line break where the next run starts on another.
#[derive(Default)]
struct Words {
    out: String,
    /// Where the previous run's last glyph was (text space origin, y) and its size.
    last: Option<(f64, f64)>,
}

impl<'a> Device<'a> for Words {
    fn draw_path(&mut self, _: &BezPath, _: DrawProps<'a>, _: &DrawMode) {}
    fn push_clip_path(&mut self, _: &ClipPath) {}
    fn push_transparency_group(&mut self, _: f32, _: Option<SoftMask<'a>>, _: BlendMode) {}
    fn draw_glyph_run(&mut self, run: &GlyphRun<'_, 'a>, _: DrawProps<'a>, _: &DrawMode) {
        let glyphs = run.glyphs();
        let Some(first) = glyphs.first() else { return };
        let t = first.transform();
        let (y, size) = (t.translation().y, t.as_coeffs()[3].abs().max(1e-6));
        if let Some((last_y, last_size)) = self.last {
            let sep = if (y - last_y).abs() > 0.5 * size.max(last_size) {
                '\n'
            } else {
                ' '
            };
            if !self.out.ends_with(char::is_whitespace) {
                self.out.push(sep);
            }
        }
        for glyph in glyphs {
            match glyph.as_unicode() {
                Some(BfString::Char(c)) if !c.is_control() => self.out.push(c),
                Some(BfString::String(s)) => self.out.push_str(&s),
                _ => {}
            }
        }
        self.last = Some((y, size));
    }
    fn draw_image(&mut self, _: Image<'a, '_>, _: ImageDrawProps<'a>) {}
    fn pop_clip(&mut self) {}
    fn pop_transparency_group(&mut self) {}
}
