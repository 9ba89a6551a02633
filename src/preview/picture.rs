//! Raster images: one page of the picture, and a one-page PDF holding it.

use std::io::Cursor;

use fast_image_resize::PixelType;
use image::codecs::jpeg::JpegEncoder;
use image::metadata::Orientation;
use image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader, RgbImage};
use krilla::Document;
use krilla::geom::Size;
use krilla::image::{BitsPerComponent, CustomImage, Image as PdfImage, ImageColorspace};
use krilla::page::PageSettings;

use super::scale::{encode_page, fit_side, resize};
use super::sniff::image_format;
use super::{DocumentPdf, Limits, PX_PER_PT, Page, Rendered, Unsupported, emit};

/// Bytes per pixel the decoders may allocate: RGBA8 output plus slack for their own buffers.
/// A 16-bit RGBA image near max_image_pixels is refused, which is fine for a preview.
const ALLOC_BYTES_PER_PIXEL: u64 = 5;

pub(super) fn render_image(
    data: &[u8],
    limits: &Limits,
    out: &mut dyn FnMut(Page) -> Result<(), String>,
) -> Result<Rendered, Unsupported> {
    limits.check_deadline()?;
    let format = image_format(data).ok_or_else(|| Unsupported::new("not a supported image"))?;
    let picture = decode(data, format, limits)?;
    let (width, height) = picture.dimensions();
    let (width, height) = fit_side(width, height, limits.max_page_side);
    let picture = if (width, height) == picture.dimensions() {
        picture
    } else {
        let pixels = resize(
            picture.as_raw(),
            picture.width(),
            picture.height(),
            PixelType::U8x3,
            width,
            height,
        )
        .map_err(Unsupported)?;
        RgbImage::from_raw(width, height, pixels)
            .ok_or_else(|| Unsupported::new("resize produced a wrong buffer"))?
    };
    let (png, picture) = encode_page(picture).map_err(Unsupported)?;
    // The PDF is made before the page goes out so a failure leaves no page behind.
    let pdf = make_pdf(picture, format)?;
    emit(out, Page { width, height, png })?;
    Ok(Rendered {
        pdf: DocumentPdf::Made(pdf),
        pages: 1,
        truncated: false,
    })
}

/// Decodes the first frame, upright (EXIF orientation applied), on white.
fn decode(data: &[u8], format: ImageFormat, limits: &Limits) -> Result<RgbImage, Unsupported> {
    let bad =
        |e: image::ImageError| Unsupported(format!("{format:?} image could not be decoded: {e}"));
    let mut reader = ImageReader::with_format(Cursor::new(data), format);
    let mut decoder_limits = image::Limits::default();
    decoder_limits.max_alloc = Some(
        limits
            .max_image_pixels
            .saturating_mul(ALLOC_BYTES_PER_PIXEL),
    );
    reader.limits(decoder_limits);
    let mut decoder = reader.into_decoder().map_err(bad)?;
    // The header's claim, checked before any pixel is decoded: a bomb stops here.
    let (w, h) = decoder.dimensions();
    if u64::from(w) * u64::from(h) > limits.max_image_pixels {
        return Err(Unsupported(format!(
            "image too large: {w}x{h} pixels (limit {})",
            limits.max_image_pixels
        )));
    }
    if w == 0 || h == 0 {
        return Err(Unsupported::new("image has no pixels"));
    }
    let orientation = decoder.orientation().unwrap_or(Orientation::NoTransforms);
    let mut picture = DynamicImage::from_decoder(decoder).map_err(bad)?;
    picture.apply_orientation(orientation);
    Ok(on_white(picture))
}

/// Composites transparency onto white (pages and PDF are opaque); 8-bit RGB out.
fn on_white(picture: DynamicImage) -> RgbImage {
    if !picture.color().has_alpha() {
        return picture.into_rgb8();
    }
    let rgba = picture.into_rgba8();
    let (w, h) = rgba.dimensions();
    let pixels = rgba
        .into_raw()
        .chunks_exact(4)
        .flat_map(|p| {
            let a = u16::from(p[3]);
            let blend = |c: u8| ((u16::from(c) * a + 255 * (255 - a) + 127) / 255) as u8;
            [blend(p[0]), blend(p[1]), blend(p[2])]
        })
        .collect();
    RgbImage::from_raw(w, h, pixels).expect("3 bytes per pixel of a w x h image")
}

/// Decoded RGB pixels for krilla (deflated into the PDF losslessly).
#[derive(Clone, Hash)]
struct Rgb8 {
    pixels: std::sync::Arc<Vec<u8>>,
    width: u32,
    height: u32,
}

impl CustomImage for Rgb8 {
    fn color_channel(&self) -> &[u8] {
        &self.pixels
    }
    fn alpha_channel(&self) -> Option<&[u8]> {
        None
    }
    fn bits_per_component(&self) -> BitsPerComponent {
        BitsPerComponent::Eight
    }
    fn size(&self) -> (u32, u32) {
        (self.width, self.height)
    }
    fn icc_profile(&self) -> Option<&[u8]> {
        None
    }
    fn color_space(&self) -> ImageColorspace {
        ImageColorspace::Rgb
    }
}

/// One page of width/2 x height/2 points filled by the picture, so the PDF at 2 px/pt shows it
/// pixel for pixel. Photos (JPEG sources) go in as JPEG, everything else losslessly.
fn make_pdf(picture: RgbImage, format: ImageFormat) -> Result<Vec<u8>, Unsupported> {
    let (width, height) = picture.dimensions();
    let pdf_image = if format == ImageFormat::Jpeg {
        let mut jpeg = Vec::new();
        JpegEncoder::new_with_quality(&mut jpeg, 90)
            .encode_image(&picture)
            .map_err(|e| Unsupported(format!("JPEG encoding failed: {e}")))?;
        PdfImage::from_jpeg(jpeg.into(), true)
    } else {
        let pixels = std::sync::Arc::new(picture.into_raw());
        PdfImage::from_custom(
            Rgb8 {
                pixels,
                width,
                height,
            },
            true,
        )
    }
    .map_err(|e| Unsupported(format!("PDF image: {e}")))?;
    let size = Size::from_wh(width as f32 / PX_PER_PT, height as f32 / PX_PER_PT)
        .ok_or_else(|| Unsupported::new("invalid page size"))?;
    let mut document = Document::new();
    {
        let mut page = document.start_page_with(PageSettings::new(size));
        let mut surface = page.surface();
        surface.draw_image(pdf_image, size);
        surface.finish();
        page.finish();
    }
    document
        .finish()
        .map_err(|e| Unsupported(format!("PDF writing failed: {e:?}")))
}
