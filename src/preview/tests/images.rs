//! Images: every format at its pixel size, transparency, EXIF orientation, bounds and
//! decompression bombs.

use super::*;

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
        assert_eq!(sniff("picture", &data), PreviewKind::Image, "{format:?}");
        let (rendered, pages) = render_all(PreviewKind::Image, &data, &Limits::default()).unwrap();
        assert_eq!((rendered.pages, rendered.truncated), (1, false));
        assert_eq!((pages[0].width, pages[0].height), (40, 30), "{format:?}");
        let page = decode(&pages[0]);
        let Rgb([r, _, b]) = *page.get_pixel(5, 15);
        assert!(r > 150 && b < 100, "{format:?}: left is red");
        let Rgb([r, _, b]) = *page.get_pixel(35, 15);
        assert!(b > 150 && r < 100, "{format:?}: right is blue");
        // The PDF: one page of 20 x 15 pt, whose 2 px/pt rendering is the picture again.
        let pdf = made_pdf(&rendered);
        let (_, pdf_pages) = render_all(PreviewKind::Pdf, pdf, &Limits::default()).unwrap();
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
    let (_, pages) = render_all(PreviewKind::Image, data.get_ref(), &Limits::default()).unwrap();
    let page = decode(&pages[0]);
    assert_eq!(*page.get_pixel(0, 0), Rgb([255, 255, 255]));
    assert_eq!(*page.get_pixel(1, 1), Rgb([0, 0, 0]));
    assert_eq!(*page.get_pixel(2, 2), Rgb([127, 127, 127]));
}

#[test]
fn jpeg_exif_orientation_is_applied() {
    // 40 x 20, red left half; orientation 6 = "rotate 90° clockwise to display".
    let data = jpeg_with_orientation(&test_image(40, 20), 6);
    let (rendered, pages) = render_all(PreviewKind::Image, &data, &Limits::default()).unwrap();
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
    let (_, pdf_pages) =
        render_all(PreviewKind::Pdf, made_pdf(&rendered), &Limits::default()).unwrap();
    assert_eq!(
        (pdf_pages[0].width, pdf_pages[0].height),
        (20, 40),
        "the PDF too"
    );
    // Orientation 1 leaves it alone.
    let data = jpeg_with_orientation(&test_image(40, 20), 1);
    let (_, pages) = render_all(PreviewKind::Image, &data, &Limits::default()).unwrap();
    assert_eq!((pages[0].width, pages[0].height), (40, 20));
}

#[test]
fn large_image_is_shrunk_to_max_page_side() {
    let data = encode(&test_image(500, 100), ImageFormat::Png);
    let limits = Limits {
        max_page_side: 200,
        ..Limits::default()
    };
    let (rendered, pages) = render_all(PreviewKind::Image, &data, &limits).unwrap();
    assert_eq!((pages[0].width, pages[0].height), (200, 40));
    let (_, pdf_pages) =
        render_all(PreviewKind::Pdf, made_pdf(&rendered), &Limits::default()).unwrap();
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
    assert_eq!(sniff("bomb.png", &bomb), PreviewKind::Image);
    let start = Instant::now();
    let err = render_all(PreviewKind::Image, &bomb, &Limits::default()).unwrap_err();
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
    assert!(render_all(PreviewKind::Image, &data, &tight).is_err());
    // Truncated and garbage images.
    assert!(
        render_all(
            PreviewKind::Image,
            &data[..data.len() / 2],
            &Limits::default()
        )
        .is_err()
    );
    let mut junk = b"GIF89a".to_vec();
    junk.extend(random_bytes(3000, 3));
    assert!(render_all(PreviewKind::Image, &junk, &Limits::default()).is_err());
}
