//! Text: laid out on Letter pages with real text, encodings, page breaks, bounds, CJK and
//! controls.

use super::*;

#[test]
fn text_is_laid_out_on_letter_pages_with_real_text() {
    let text = long_text();
    let (rendered, pages) =
        render_all(PreviewKind::Text, text.as_bytes(), &Limits::default()).unwrap();
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
        let img = grey_letter_page(page);
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
    let (rendered, _) = render_all(PreviewKind::Text, latin1, &Limits::default()).unwrap();
    let copied = extract_text(made_pdf(&rendered));
    assert!(
        copied[0].contains("café naïve € 12,50 “quoted”"),
        "{}",
        copied[0]
    );
    let mut utf16 = vec![0xFF, 0xFE];
    utf16.extend("Grüße, Ελλάδα\n".encode_utf16().flat_map(u16::to_le_bytes));
    let (rendered, _) = render_all(PreviewKind::Text, &utf16, &Limits::default()).unwrap();
    assert!(extract_text(made_pdf(&rendered))[0].contains("Grüße, Ελλάδα"));
}

#[test]
fn form_feed_starts_a_page_and_whitespace_gives_one_blank_page() {
    let (rendered, _) = render_all(
        PreviewKind::Text,
        b"one\n\x0ctwo\n\x0cthree",
        &Limits::default(),
    )
    .unwrap();
    let copied = extract_text(made_pdf(&rendered));
    assert_eq!(copied.len(), 3);
    assert!(copied[1].starts_with("two\n"));
    let (rendered, pages) =
        render_all(PreviewKind::Text, b"\n\n   \n", &Limits::default()).unwrap();
    assert_eq!((rendered.pages, pages.len()), (1, 1));
}

#[test]
fn text_beyond_max_pages_is_dropped() {
    let text = "line\n".repeat(geometry::LINES * 10);
    let limits = Limits {
        max_pages: 3,
        ..Limits::default()
    };
    let (rendered, pages) = render_all(PreviewKind::Text, text.as_bytes(), &limits).unwrap();
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
    let (rendered, _) = render_all(PreviewKind::Text, text.as_bytes(), &limits).unwrap();
    assert_eq!((rendered.pages, rendered.truncated), (3, false));
}

#[test]
fn cjk_and_controls_do_not_break_layout() {
    let text = "漢字かな交じり文 and \x1b[31mred\x1b[0m and a bell \x07\n".repeat(5);
    let (rendered, _) = render_all(PreviewKind::Text, text.as_bytes(), &Limits::default()).unwrap();
    let copied = extract_text(made_pdf(&rendered));
    // CJK glyphs are missing from DejaVu: .notdef boxes, whose text is in /ActualText.
    assert!(
        copied[0].contains("漢字かな交じり文 and red and a bell \u{FFFD}"),
        "{}",
        copied[0]
    );
    assert_eq!(copied[0].matches("漢字かな交じり文").count(), 5);
}

#[test]
fn stacked_combining_marks_are_capped() {
    // 2 MB of combining accents (1 M of U+0301), after one letter and alone: before the cap
    // one line of a million characters, 0.8 GB to shape.
    let mut text = "e".to_string();
    text.push_str(&"\u{301}".repeat(1 << 20));
    text.push_str("\nnext line e\u{301}\u{302}\n");
    let (rendered, _) = render_all(PreviewKind::Text, text.as_bytes(), &Limits::default()).unwrap();
    assert_eq!(rendered.pages, 1);
    let copied = extract_text(made_pdf(&rendered));
    let marks = copied[0].matches('\u{301}').count();
    // Eight on the first letter, one on the second line's.
    assert_eq!(marks, 9, "{}", copied[0]);
    // (The extracted text splits a run before its marks.)
    assert!(copied[0].contains("next line"), "{}", copied[0]);
    assert!(copied[0].contains("e\u{301}\u{302}"), "{}", copied[0]);
}
