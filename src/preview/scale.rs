//! Page sizes for requests, resizing and PNG encoding.

use std::io::Cursor;

use fast_image_resize::images::{Image as FirImage, ImageRef};
use fast_image_resize::{FilterType as FirFilter, PixelType, ResizeAlg, ResizeOptions, Resizer};
use image::codecs::png::{CompressionType, FilterType, PngDecoder, PngEncoder};
use image::{ColorType, DynamicImage, ExtendedColorType, ImageDecoder, ImageEncoder, RgbImage};

use crate::api::PageSize;

/// The size a page of `width` x `height` gets for a request: `scale` percent (1..=100, default
/// 100; out-of-range values are clamped) then shrunk further to satisfy `max_width` /
/// `max_height` if given; every given bound holds, aspect ratio kept (rounding), never below
/// 1x1 (so a bound of 0 acts as 1).
pub fn fit(width: u32, height: u32, size: &PageSize) -> (u32, u32) {
    let (width, height) = (width.max(1), height.max(1));
    let mut factor = f64::from(size.scale.unwrap_or(100).clamp(1, 100)) / 100.0;
    if let Some(max_w) = size.max_width {
        factor = factor.min(f64::from(max_w.max(1)) / f64::from(width));
    }
    if let Some(max_h) = size.max_height {
        factor = factor.min(f64::from(max_h.max(1)) / f64::from(height));
    }
    let side = |v: u32, bound: Option<u32>| {
        // Rounding to nearest never crosses an integer bound, but clamp in case float error did.
        let px = (f64::from(v) * factor).round() as u32;
        px.min(bound.map_or(u32::MAX, |b| b.max(1))).max(1)
    };
    (side(width, size.max_width), side(height, size.max_height))
}

/// The largest size with the aspect of `width` x `height` whose longer side is at most
/// `max_side` (the size itself when it already fits).
pub(super) fn fit_side(width: u32, height: u32, max_side: u32) -> (u32, u32) {
    let max_side = max_side.max(1);
    let longer = width.max(height);
    if longer <= max_side {
        return (width.max(1), height.max(1));
    }
    let factor = f64::from(max_side) / f64::from(longer);
    let side = |v: u32| ((f64::from(v) * factor).round() as u32).clamp(1, max_side);
    (side(width), side(height))
}

/// Resizes a page PNG to exactly `width` x `height` (fast_image_resize, Lanczos3),
/// PNG-encoded. Returns the input unchanged when the size is equal.
pub fn scale_png(png: &[u8], width: u32, height: u32) -> Result<Vec<u8>, String> {
    if width == 0 || height == 0 {
        return Err(format!("invalid target size {width}x{height}"));
    }
    let decoder = PngDecoder::new(Cursor::new(png)).map_err(|e| format!("bad page PNG: {e}"))?;
    let (src_w, src_h) = decoder.dimensions();
    if (src_w, src_h) == (width, height) {
        return Ok(png.to_vec());
    }
    let image = DynamicImage::from_decoder(decoder).map_err(|e| format!("bad page PNG: {e}"))?;
    let (pixels, pixel_type, color) = match image.color() {
        ColorType::L8 => (image.into_luma8().into_raw(), PixelType::U8, ColorType::L8),
        c if c.has_alpha() => (
            image.into_rgba8().into_raw(),
            PixelType::U8x4,
            ColorType::Rgba8,
        ),
        _ => (
            image.into_rgb8().into_raw(),
            PixelType::U8x3,
            ColorType::Rgb8,
        ),
    };
    let resized = resize(&pixels, src_w, src_h, pixel_type, width, height)?;
    encode_png(&resized, width, height, color)
}

/// Resizes 8-bit grey (`U8`), RGB (`U8x3`) or RGBA (`U8x4`) pixels.
pub(super) fn resize(
    pixels: &[u8],
    width: u32,
    height: u32,
    pixel_type: PixelType,
    new_width: u32,
    new_height: u32,
) -> Result<Vec<u8>, String> {
    let src = ImageRef::new(width, height, pixels, pixel_type).map_err(|e| e.to_string())?;
    let mut dst = FirImage::new(new_width, new_height, pixel_type);
    let options = ResizeOptions::new().resize_alg(ResizeAlg::Convolution(FirFilter::Lanczos3));
    Resizer::new()
        .resize(&src, &mut dst, &options)
        .map_err(|e| e.to_string())?;
    Ok(dst.into_vec())
}

/// A page PNG: 8-bit grey when every pixel is grey (text pages: 7x smaller, 69 KB against
/// 463 KB for a full Letter page of text, and faster to encode), else 8-bit RGB. The pixels
/// are given back for further use.
pub(super) fn encode_page(rgb: RgbImage) -> Result<(Vec<u8>, RgbImage), String> {
    let (width, height) = rgb.dimensions();
    // A sample first, so colour pages (photos) skip the full check and its buffers.
    let maybe_grey = rgb
        .as_raw()
        .chunks_exact(3)
        .step_by(97)
        .all(|p| p[0] == p[1] && p[1] == p[2]);
    let rgb = DynamicImage::ImageRgb8(rgb);
    let mut png = None;
    if maybe_grey {
        // Grey iff grey -> RGB gives the pixels back (exact: the luma weights sum to 1). Done
        // with the image crate's whole-image conversions and a memcmp: a per-pixel loop in this
        // crate takes ~90 ms a page in debug builds.
        let luma = DynamicImage::ImageLuma8(rgb.to_luma8());
        if luma.to_rgb8().as_raw() == rgb.as_bytes() {
            png = Some(encode_png(luma.as_bytes(), width, height, ColorType::L8)?);
        }
    }
    let png = match png {
        Some(png) => png,
        None => encode_png(rgb.as_bytes(), width, height, ColorType::Rgb8)?,
    };
    Ok((png, rgb.into_rgb8()))
}

/// PNG of 8-bit pixels. Deflate level 3 with adaptive filters: measured on a Letter text page,
/// 14 ms and 69 KB (grey), against 21 ms and 334 KB for `Fast` and 66 ms and 48 KB for level 9;
/// on a photo-like page it is also faster than `Fast` and a third smaller.
pub(super) fn encode_png(
    pixels: &[u8],
    width: u32,
    height: u32,
    color: ColorType,
) -> Result<Vec<u8>, String> {
    let mut png = Vec::new();
    PngEncoder::new_with_quality(&mut png, CompressionType::Level(3), FilterType::Adaptive)
        .write_image(pixels, width, height, ExtendedColorType::from(color))
        .map_err(|e| format!("PNG encoding failed: {e}"))?;
    Ok(png)
}
