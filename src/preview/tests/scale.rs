//! `fit` and `scale_png`: the sizes pages are scaled to.

use super::*;

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
    let (_, pages) = render_all(PreviewKind::Text, b"grey text\n", &Limits::default()).unwrap();
    let thumb = scale_png(&pages[0].png, 306, 396).unwrap();
    let thumb = image::load_from_memory(&thumb).unwrap();
    assert_eq!(
        (thumb.width(), thumb.height(), thumb.color()),
        (306, 396, image::ColorType::L8)
    );
    assert!(scale_png(&page, 0, 10).is_err());
}
