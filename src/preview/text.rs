//! Plain text: laid out in a monospaced font on Letter pages, written as a PDF with real text
//! (krilla), then rasterized from that PDF (hayro) so pages and PDF agree.

use std::sync::Arc;

use krilla::Document;
use krilla::color::rgb;
use krilla::geom::Point;
use krilla::num::NormalizedF32;
use krilla::page::PageSettings;
use krilla::paint::Fill;
use krilla::surface::Surface;
use krilla::text::{Font, GlyphId, KrillaGlyph, TextDirection};

use super::pdf::rasterize;
use super::sniff::decode_text;
use super::{DocumentPdf, Limits, Page, Rendered, Unsupported};

/// US Letter, in points.
const PAGE_WIDTH: f32 = 612.0;
const PAGE_HEIGHT: f32 = 792.0;
const FONT_SIZE: f32 = 9.0;
const LINE_HEIGHT: f32 = 11.0;
const MARGIN_X: f32 = 48.0;
const MARGIN_TOP: f32 = 48.0;
const MARGIN_BOTTOM: f32 = 56.0;
const FOOTER_SIZE: f32 = 8.0;
/// Footer baseline, from the top of the page.
const FOOTER_BASELINE: f32 = PAGE_HEIGHT - 28.0;
/// Advance width of every DejaVu Sans Mono glyph: 1233 of 2048 units per em.
const ADVANCE_EM: f32 = 1233.0 / 2048.0;
/// Characters per line: 95 x 5.42 pt = 515 pt of the 516 pt between the margins.
const COLUMNS: usize = ((PAGE_WIDTH - 2.0 * MARGIN_X) / (FONT_SIZE * ADVANCE_EM)) as usize;
/// Lines per page: 62.
const LINES: usize = ((PAGE_HEIGHT - MARGIN_TOP - MARGIN_BOTTOM) / LINE_HEIGHT) as usize;
const TAB_WIDTH: usize = 8;
/// Zero-width characters (combining marks) kept after one character: a file of nothing but
/// combining accents would otherwise be one line of millions of characters, shaped as one
/// cluster (0.8 GB for 2 MB of U+0301). Real text stacks two or three.
const MAX_MARKS: usize = 8;

/// How many leading bytes of a text file `render` uses at most; the caller reads only that
/// much of a text file. 8 MiB: the default 500 full pages (62 lines of 95 characters) at up to
/// two bytes per character (Latin, Greek, Cyrillic, ...).
pub const TEXT_MAX_BYTES: usize = 8 * 1024 * 1024;

pub(super) fn render_text(
    data: &[u8],
    limits: &Limits,
    out: &mut dyn FnMut(Page) -> Result<(), String>,
) -> Result<Rendered, Unsupported> {
    limits.check_deadline()?;
    let cut = data.len() >= TEXT_MAX_BYTES;
    let data = &data[..data.len().min(TEXT_MAX_BYTES)];
    // The caller has already judged this to be text (perhaps by its name): lenient check.
    let text = decode_text(data, true).ok_or_else(|| Unsupported::new("not text"))?;
    let (pages, overflow, lacks_glyphs) = layout(&text, limits.max_pages.max(1));
    drop(text);
    let pdf = write_pdf(&pages, lacks_glyphs, limits)?;
    drop(pages);
    let pdf = Arc::new(pdf);
    let (count, _) = rasterize(pdf.clone(), limits, out)?;
    let pdf = Arc::try_unwrap(pdf).unwrap_or_else(|shared| (*shared).clone());
    Ok(Rendered {
        pdf: DocumentPdf::Made(pdf),
        pages: count,
        truncated: overflow || cut,
    })
}

/// Splits text into pages of at most LINES lines of at most COLUMNS columns; stops after
/// `max_pages` pages. Returns the pages, whether text was left over, and whether some
/// character has no glyph in the font.
fn layout(text: &str, max_pages: usize) -> (Vec<Vec<String>>, bool, bool) {
    let face = ttf_parser::Face::parse(dejavu::sans_mono::regular(), 0).ok();
    let mut lacks_glyphs = false;
    let mut l = Layout {
        pages: Vec::new(),
        page: Vec::new(),
        line: String::new(),
        cols: 0,
        last_space: None,
        marks: 0,
        max_pages,
    };
    let mut chars = text.chars().peekable();
    while l.pages.len() < max_pages {
        let Some(c) = chars.next() else { break };
        match c {
            '\n' => l.end_line(),
            // CRLF is one line end; a lone CR (old Mac files) is one too.
            '\r' => {
                if chars.peek() != Some(&'\n') {
                    l.end_line();
                }
            }
            '\u{0C}' => l.end_page(),
            '\t' => {
                let spaces = TAB_WIDTH - l.cols % TAB_WIDTH;
                for _ in 0..spaces {
                    l.push(' ', 1);
                }
            }
            // ANSI escape sequences of coloured logs: CSI (ESC [ parameters final) is dropped.
            '\u{1B}' => {
                if chars.peek() == Some(&'[') {
                    chars.next();
                    while let Some(&n) = chars.peek() {
                        chars.next();
                        if ('\u{40}'..='\u{7E}').contains(&n) {
                            break;
                        }
                    }
                }
            }
            '\u{FEFF}' => {}
            c if c.is_control() => l.push(char::REPLACEMENT_CHARACTER, 1),
            c if is_zero_width(c) => {
                if l.marks < MAX_MARKS {
                    l.push(c, 0);
                    l.marks += 1;
                }
            }
            c => {
                // DejaVu covers ASCII; only look further characters up.
                if !c.is_ascii() && !lacks_glyphs {
                    lacks_glyphs = face.as_ref().is_some_and(|f| f.glyph_index(c).is_none());
                }
                l.push(c, 1)
            }
        }
    }
    let overflow = l.pages.len() >= max_pages
        && (!l.line.trim().is_empty() || chars.any(|c| !c.is_whitespace()));
    if l.pages.len() < max_pages {
        if !l.line.is_empty() {
            l.end_line();
        }
        l.end_page();
    }
    let mut pages = l.pages;
    pages.truncate(max_pages);
    if pages.is_empty() {
        // Whitespace only: one blank page rather than no preview.
        pages.push(Vec::new());
    }
    (pages, overflow, lacks_glyphs)
}

struct Layout {
    pages: Vec<Vec<String>>,
    page: Vec<String>,
    line: String,
    cols: usize,
    /// Byte offset just after the last space of `line`, and the columns up to it.
    last_space: Option<(usize, usize)>,
    /// Zero-width characters since the last character with a width (or the line's start).
    marks: usize,
    max_pages: usize,
}

impl Layout {
    fn push(&mut self, c: char, width: usize) {
        if self.cols + width > COLUMNS {
            self.wrap();
        }
        self.line.push(c);
        self.cols += width;
        if width > 0 {
            self.marks = 0;
        }
        if c == ' ' {
            self.last_space = Some((self.line.len(), self.cols));
        }
    }

    /// Breaks an overlong line: after its last space when that is in the second half of the
    /// line (words stay whole), otherwise hard at the column limit.
    fn wrap(&mut self) {
        match self.last_space {
            Some((at, cols)) if cols > COLUMNS / 2 && at < self.line.len() => {
                let rest = self.line.split_off(at);
                let rest_cols = self.cols - cols;
                self.end_line();
                self.line = rest;
                self.cols = rest_cols;
            }
            _ => self.end_line(),
        }
    }

    fn end_line(&mut self) {
        let line = std::mem::take(&mut self.line);
        self.cols = 0;
        self.marks = 0;
        self.last_space = None;
        if self.pages.len() >= self.max_pages {
            return;
        }
        self.page.push(line);
        if self.page.len() == LINES {
            self.pages.push(std::mem::take(&mut self.page));
        }
    }

    /// Form feed or end of text: the page so far is complete. An empty page (form feed right
    /// after a full page, or at the start) is not made.
    fn end_page(&mut self) {
        if !self.line.is_empty() {
            self.end_line();
        }
        while self.page.last().is_some_and(|l| l.trim().is_empty()) {
            self.page.pop();
        }
        if !self.page.is_empty() && self.pages.len() < self.max_pages {
            self.pages.push(std::mem::take(&mut self.page));
        }
        self.page.clear();
    }
}

/// Combining marks and zero-width characters take no column (common ranges; exact width
/// tables would be a dependency for little gain).
fn is_zero_width(c: char) -> bool {
    matches!(c,
        '\u{0300}'..='\u{036F}'
        | '\u{0483}'..='\u{0489}'
        | '\u{0591}'..='\u{05BD}'
        | '\u{0610}'..='\u{061A}'
        | '\u{064B}'..='\u{065F}'
        | '\u{1AB0}'..='\u{1AFF}'
        | '\u{1DC0}'..='\u{1DFF}'
        | '\u{200B}'..='\u{200F}'
        | '\u{20D0}'..='\u{20FF}'
        | '\u{FE00}'..='\u{FE0F}'
        | '\u{FE20}'..='\u{FE2F}')
}

/// The laid-out pages as a PDF with real text: DejaVu Sans Mono, embedded as a subset with a
/// ToUnicode map by krilla, so the text can be selected and copied.
fn write_pdf(
    pages: &[Vec<String>],
    lacks_glyphs: bool,
    limits: &Limits,
) -> Result<Vec<u8>, Unsupported> {
    let font = Font::new(dejavu::sans_mono::regular().into(), 0)
        .ok_or_else(|| Unsupported::new("built-in font could not be loaded"))?;
    let total = pages.len();
    let mut document = Document::new();
    for (index, lines) in pages.iter().enumerate() {
        limits.check_deadline()?;
        let settings = PageSettings::from_wh(PAGE_WIDTH, PAGE_HEIGHT).expect("positive size");
        let mut page = document.start_page_with(settings);
        let mut surface = page.surface();
        if index == 0 && lacks_glyphs {
            claim_notdef(&mut surface, &font);
        }
        surface.set_fill(Some(Fill::default()));
        for (n, line) in lines.iter().enumerate() {
            let line = line.trim_end();
            if line.is_empty() {
                continue;
            }
            let baseline = MARGIN_TOP + FONT_SIZE + n as f32 * LINE_HEIGHT;
            surface.draw_text(
                Point::from_xy(MARGIN_X, baseline),
                font.clone(),
                FONT_SIZE,
                line,
                false,
                TextDirection::Auto,
            );
        }
        let footer = format!("{} / {}", index + 1, total);
        let footer_width = footer.chars().count() as f32 * FOOTER_SIZE * ADVANCE_EM;
        surface.set_fill(Some(Fill {
            paint: rgb::Color::new(110, 110, 110).into(),
            ..Fill::default()
        }));
        surface.draw_text(
            Point::from_xy((PAGE_WIDTH - footer_width) / 2.0, FOOTER_BASELINE),
            font.clone(),
            FOOTER_SIZE,
            &footer,
            false,
            TextDirection::LeftToRight,
        );
        surface.finish();
        page.finish();
    }
    document
        .finish()
        .map_err(|e| Unsupported(format!("PDF writing failed: {e:?}")))
}

/// krilla leaves glyph 0 (.notdef) out of the ToUnicode map, and gives a .notdef the text it
/// stands for as /ActualText only when that differs from the first .notdef's: so the first
/// character the font lacks would not copy out of the PDF anywhere. An invisible .notdef
/// outside the page takes that first place.
fn claim_notdef(surface: &mut Surface<'_>, font: &Font) {
    surface.set_fill(Some(Fill {
        opacity: NormalizedF32::ZERO,
        ..Fill::default()
    }));
    let notdef = KrillaGlyph::new(GlyphId::new(0), 0.0, 0.0, 0.0, 0.0, 0..1, None);
    surface.draw_glyphs(
        Point::from_xy(-100.0, -100.0),
        &[notdef],
        font.clone(),
        " ",
        FONT_SIZE,
        false,
    );
}

#[cfg(test)]
pub(super) mod geometry {
    //! The layout constants, for the tests.
    pub const COLUMNS: usize = super::COLUMNS;
    pub const LINES: usize = super::LINES;
    pub const MARGIN_X_PX: u32 = (super::MARGIN_X * 2.0) as u32;
}
