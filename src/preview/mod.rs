//! Preview rendering: turns a stored file into PNG page images plus a PDF of the document
//! (docs/design.md §2 "Previews"). Pure functions over bytes, no I/O: the store decides where pages go.
//!
//! - [`sniff`] tells what a file is, by its content first (magic bytes) and its name second.
//! - [`render`] produces the pages one by one, each handed to a callback as soon as it is
//!   encoded, so a long document never sits in memory as images: at most one page's pixmap
//!   (plus, for PDFs, the document itself) is held at a time.
//! - [`fit`] and [`scale_png`] serve the `scale` / `max_width` / `max_height` page requests.
//!
//! Pages are 2 px per PDF point (144 dpi): a US Letter page is 1224x1584 px.
//!
//! What each kind becomes:
//! - **PDF**: every page rasterized with hayro (pure Rust) on white; the PDF preview is the file
//!   itself ([`DocumentPdf::Original`]). Encrypted PDFs that need a user password, and PDFs
//!   hayro cannot load at all, have no preview.
//! - **Image** (PNG, JPEG, GIF, WebP, BMP, TIFF): one page of the image's own pixel size (shrunk
//!   to fit [`Limits::max_page_side`]), EXIF orientation applied, first frame of animations and
//!   multi-page TIFFs, transparency composited onto white. The PDF is one page of
//!   width/2 x height/2 points holding that picture (JPEG sources as JPEG, others lossless), so
//!   its 2 px/pt rendering is the page image.
//! - **Text** (UTF-8, UTF-16 with a byte order mark, else Windows-1252/Latin-1 when the bytes
//!   look like text): laid out on US Letter pages (612x792 pt) in DejaVu Sans Mono 9 pt,
//!   95 columns x 62 lines, long lines wrapped (at a space when there is one in the second half
//!   of the line, else hard), tabs expanded to 8 columns, form feeds start a new page, ANSI
//!   colour escapes dropped, "N / M" centred in the footer; only blank lines give one blank
//!   page. The PDF is written with krilla with real, selectable text (embedded font subset with
//!   a ToUnicode map); the page images are rendered from that PDF so both agree. DejaVu has no
//!   CJK glyphs: those characters show as empty boxes (.notdef) but still copy out of the PDF
//!   correctly (krilla puts them in /ActualText).
//! - **Everything else**, and an **empty file**, has no preview
//!   ([`PreviewKind::Unsupported`]); an empty file has nothing worth a page.
//!
//! Bounds ([`Limits`]): at most `max_pages` pages (the rest dropped, `truncated` set), images of
//! at most `max_image_pixels` (checked from the header before decoding, and as the decoder's
//! allocation limit, so a decompression bomb fails fast), pages at most `max_page_side` px on
//! their longer side, and a deadline checked between pages. Third-party code runs under
//! `catch_unwind`: a panic in a decoder becomes [`Unsupported`], never a crash. Memory is not
//! bounded here (hayro inflates a stream whole; a page of many fills records them all): the
//! store runs this in a child process with a memory bound (`store::previews::sandbox`).

mod pdf;
mod picture;
mod scale;
mod sniff;
mod text;
mod words;

#[cfg(test)]
mod tests;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

pub use scale::{fit, scale_png};
pub use sniff::{Kinds, kinds, name_class, sniff};
pub use text::TEXT_MAX_BYTES;
pub use words::{INDEX_MAX_CHARS, extract as extract_text};

/// Pixels per PDF point of a page image at 100% (144 dpi).
pub const PX_PER_PT: f32 = 2.0;

/// Bounds of one rendering job.
///
/// - `max_pages` (default 500): pages beyond are dropped and [`Rendered::truncated`] is set
///   (0 counts as 1).
/// - `max_image_pixels` (default 64 Mpx): the largest image decoded, also the decoders'
///   allocation limit (`image::Limits::max_alloc`), against decompression bombs.
/// - `max_page_side` (default 4096 px): a page larger than this at 2 px/pt (or an image larger
///   than this) is rendered smaller to fit, aspect ratio kept.
/// - `deadline`: checked between pages; once past it the job stops with
///   `Unsupported("took too long")`.
#[derive(Debug, Clone)]
pub struct Limits {
    pub max_pages: usize,
    pub max_image_pixels: u64,
    pub max_page_side: u32,
    pub deadline: Option<Instant>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_pages: 500,
            max_image_pixels: 64_000_000,
            max_page_side: 4096,
            deadline: None,
        }
    }
}

impl Limits {
    /// `Err` once the deadline has passed.
    fn check_deadline(&self) -> Result<(), Unsupported> {
        match self.deadline {
            Some(d) if Instant::now() >= d => Err(Unsupported::new("took too long")),
            _ => Ok(()),
        }
    }
}

/// What a file is for its preview (which renderer it goes to, or none), judged by its content
/// first (magic bytes) and its name second. (Not a node's kind: `store::nodes` and `fs::table`
/// have their own.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreviewKind {
    Pdf,
    Image,
    Text,
    Unsupported,
}

impl PreviewKind {
    /// Its name in the store (a preview's directory, a row's key).
    pub fn as_str(self) -> &'static str {
        match self {
            PreviewKind::Pdf => "pdf",
            PreviewKind::Image => "image",
            PreviewKind::Text => "text",
            PreviewKind::Unsupported => "none",
        }
    }

    /// The kind of that name (`as_str`); None for any other string.
    pub fn parse(s: &str) -> Option<PreviewKind> {
        [
            PreviewKind::Pdf,
            PreviewKind::Image,
            PreviewKind::Text,
            PreviewKind::Unsupported,
        ]
        .into_iter()
        .find(|k| k.as_str() == s)
    }
}

/// One rendered page, 2 px per PDF point (144 dpi; a Letter page is 1224x1584), PNG-encoded.
#[derive(Debug, Clone)]
pub struct Page {
    pub width: u32,
    pub height: u32,
    pub png: Vec<u8>,
}

/// The document PDF of a rendered file.
#[derive(Debug, Clone)]
pub enum DocumentPdf {
    /// The input is itself the PDF (a PDF file): serve the original bytes.
    Original,
    /// A PDF made for the preview (an image wrapped in a page; text laid out with real,
    /// selectable text).
    Made(Vec<u8>),
}

/// The result of a successful [`render`]: the pages themselves went to the callback.
#[derive(Debug, Clone)]
pub struct Rendered {
    pub pdf: DocumentPdf,
    /// Pages handed to the callback, numbered 1..=pages in the order they were handed.
    pub pages: usize,
    /// Pages were dropped (more than `max_pages`, or a text file longer than what was passed).
    pub truncated: bool,
}

/// Why a file has no preview (goes into a log line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsupported(pub String);

impl Unsupported {
    fn new(reason: impl Into<String>) -> Self {
        Unsupported(reason.into())
    }
}

impl std::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unsupported {}

/// Renders `data` (the whole file, or for Text its first [`TEXT_MAX_BYTES`]) page by page,
/// handing each page to `out` as soon as it is rendered (so pages go to disk, not all into
/// memory). An error from `out` stops the job and is returned as [`Unsupported`] with that text.
///
/// On `Err`, pages already handed to `out` are to be thrown away. Text of [`TEXT_MAX_BYTES`] or
/// more is taken as cut short by the caller and reported as `truncated`.
///
/// Never panics on any input: the third-party decoders and renderers run under `catch_unwind`
/// as a last line of defence (a panic there still prints through the panic hook).
pub fn render(
    kind: PreviewKind,
    data: &[u8],
    limits: &Limits,
    out: &mut dyn FnMut(Page) -> Result<(), String>,
) -> Result<Rendered, Unsupported> {
    if matches!(kind, PreviewKind::Unsupported) {
        return Err(Unsupported::new("file type not supported"));
    }
    if data.is_empty() {
        return Err(Unsupported::new("empty file"));
    }
    // Unwind safety: after a panic nothing of the job is used again, only its message. (A
    // panic in `out` itself is caught too and reported the same way.)
    let job = AssertUnwindSafe(|| match kind {
        PreviewKind::Pdf => pdf::render_pdf(data, limits, out),
        PreviewKind::Image => picture::render_image(data, limits, out),
        PreviewKind::Text => text::render_text(data, limits, out),
        PreviewKind::Unsupported => unreachable!("handled above"),
    });
    match catch_unwind(job) {
        Ok(result) => result,
        Err(payload) => {
            let msg = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(Unsupported(format!("renderer panicked: {msg}")))
        }
    }
}

/// Hands one page to the caller's sink; its error ends the job.
fn emit(out: &mut dyn FnMut(Page) -> Result<(), String>, page: Page) -> Result<(), Unsupported> {
    out(page).map_err(Unsupported)
}
