//! Files the preview tests and examples/preview_bench render: text with long lines and
//! non-ASCII, PDFs written by hand (a producer other than the store's own), and a PNG reader.
#![allow(dead_code)]

/// Width and height of a PNG, from its IHDR chunk.
#[track_caller]
pub fn png_size(png: &[u8]) -> (u32, u32) {
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    let be = |o: usize| u32::from_be_bytes(png[o..o + 4].try_into().unwrap());
    (be(16), be(20))
}

/// About three Letter pages of text, with long lines and non-ASCII.
pub fn sample_text() -> Vec<u8> {
    let mut t = String::new();
    for i in 1..=160 {
        t.push_str(&format!(
            "line {i}: Grüße, naïve café — {}\n",
            "word ".repeat(i % 37)
        ));
    }
    t.into_bytes()
}

/// A PDF of US Letter pages, one per content stream given (PDF drawing operators; `/F1` is
/// Helvetica), with a correct cross-reference table.
pub fn pdf(contents: &[String]) -> Vec<u8> {
    let pages = contents.len();
    let mut objects: Vec<String> = vec![
        "<< /Type /Catalog /Pages 2 0 R >>".into(),
        format!(
            "<< /Type /Pages /Kids [{}] /Count {pages} >>",
            (0..pages)
                .map(|i| format!("{} 0 R", 4 + 2 * i))
                .collect::<Vec<_>>()
                .join(" ")
        ),
        "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>".into(),
    ];
    for (i, content) in contents.iter().enumerate() {
        objects.push(format!(
            "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] \
             /Resources << /Font << /F1 3 0 R >> >> /Contents {} 0 R >>",
            5 + 2 * i
        ));
        objects.push(format!(
            "<< /Length {} >>\nstream\n{content}\nendstream",
            content.len()
        ));
    }
    let objects: Vec<Vec<u8>> = objects.into_iter().map(String::into_bytes).collect();
    pdf_of_objects(&objects)
}

/// A PDF file of these objects (numbered from 1; the first is the catalog), with a correct
/// cross-reference table.
pub fn pdf_of_objects(objects: &[Vec<u8>]) -> Vec<u8> {
    let mut out = b"%PDF-1.4\n".to_vec();
    let mut offsets = Vec::new();
    for (i, o) in objects.iter().enumerate() {
        offsets.push(out.len());
        out.extend_from_slice(format!("{} 0 obj\n", i + 1).as_bytes());
        out.extend_from_slice(o);
        out.extend_from_slice(b"\nendobj\n");
    }
    let xref = out.len();
    out.extend_from_slice(
        format!("xref\n0 {}\n0000000000 65535 f \n", objects.len() + 1).as_bytes(),
    );
    for off in offsets {
        out.extend_from_slice(format!("{off:010} 00000 n \n").as_bytes());
    }
    out.extend_from_slice(
        format!(
            "trailer\n<< /Size {} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n",
            objects.len() + 1
        )
        .as_bytes(),
    );
    out
}

/// `pages` pages with shapes and a line of text each; `tag` makes the bytes differ.
pub fn shapes_pdf(pages: usize, tag: usize) -> Vec<u8> {
    let contents: Vec<String> = (0..pages)
        .map(|i| {
            format!(
                "0.2 0.3 0.8 rg {x} 500 200 150 re f 0.9 0.4 0.1 rg 100 100 {w} 80 re f \
                 BT /F1 24 Tf 72 700 Td (Page {n} of {tag}) Tj ET",
                x = 72 + 10 * i,
                w = 100 + 5 * i,
                n = i + 1
            )
        })
        .collect();
    pdf(&contents)
}
