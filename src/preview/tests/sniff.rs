//! Sniffing: what a file is by its content first and its name second.

use super::*;

#[test]
fn sniff_by_content_first() {
    let mut pdf_late = vec![b' '; 600];
    pdf_late.extend_from_slice(b"%PDF-1.7\n");
    assert_eq!(
        sniff("x.bin", &pdf_late),
        PreviewKind::Pdf,
        "%PDF- within the first 1 KiB"
    );
    let mut pdf_later = vec![b'\n'; 2000];
    pdf_later.extend_from_slice(b"%PDF-1.7\n");
    assert_eq!(
        sniff("x.pdf", &pdf_later),
        PreviewKind::Pdf,
        ".pdf with the magic further in"
    );
    assert_eq!(
        sniff("x.pdf", b"hello, not a pdf"),
        PreviewKind::Text,
        "content wins over the name"
    );
    assert_eq!(
        sniff("a.jpg", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR"),
        PreviewKind::Image
    );
    assert_eq!(
        sniff("noext", &[0xFF, 0xD8, 0xFF, 0xE0, 0, 0x10]),
        PreviewKind::Image
    );
    assert_eq!(sniff("a", b"GIF89a\x01\0\x01\0"), PreviewKind::Image);
    assert_eq!(sniff("a", b"RIFF\x10\0\0\0WEBPVP8L"), PreviewKind::Image);
    assert_eq!(sniff("a", b"II*\0\x08\0\0\0"), PreviewKind::Image);
    assert_eq!(sniff("a", b"MM\0*\0\0\0\x08"), PreviewKind::Image);
    let mut bmp = b"BM".to_vec();
    bmp.extend_from_slice(&[0; 12]);
    bmp.extend_from_slice(&40u32.to_le_bytes());
    assert_eq!(sniff("a", &bmp), PreviewKind::Image);
    assert_eq!(
        sniff("a.txt", b"BMW and Audi are car makers"),
        PreviewKind::Text,
        "BM is not enough"
    );
    for name in [
        "a.txt", "a.md", "a.csv", "a.rs", "a.log", "README", ".bashrc",
    ] {
        assert_eq!(
            sniff(name, "plain text, é ü € Привет\n".as_bytes()),
            PreviewKind::Text,
            "{name}"
        );
    }
    assert_eq!(
        sniff("latin1", b"caf\xe9 na\xefve \x80 12,50\n"),
        PreviewKind::Text
    );
    assert_eq!(
        sniff("utf16", b"\xff\xfeh\0i\0 \0\xac\x20"),
        PreviewKind::Text
    );
    assert_eq!(sniff("a.txt", b""), PreviewKind::Unsupported, "empty file");
    assert_eq!(
        sniff("a.zip", b"PK\x03\x04\x14\0\0\0\x08\0"),
        PreviewKind::Unsupported
    );
    assert_eq!(
        sniff("a.docx", b"PK\x03\x04\x14\0\x06\0\x08\0\0\0!\0"),
        PreviewKind::Unsupported
    );
    assert_eq!(
        sniff("a.bin", &random_bytes(8192, 1)),
        PreviewKind::Unsupported
    );
    // A head cut in the middle of a UTF-8 character is still text.
    let cut = "ab€".as_bytes();
    assert_eq!(sniff("a", &cut[..cut.len() - 1]), PreviewKind::Text);
    // Control characters: few are fine, many are binary unless the name says text.
    let mut noisy = b"log line\n".repeat(20);
    noisy.extend_from_slice(&[0x01; 8]);
    assert_eq!(sniff("a", &noisy), PreviewKind::Unsupported);
    assert_eq!(sniff("a.log", &noisy), PreviewKind::Text);
}

/// A name's class is all `sniff` reads of it: the store keys previews by the kind so chosen.
#[test]
fn a_name_counts_only_by_its_class() {
    let mut noisy = b"log line\n".repeat(20);
    noisy.extend_from_slice(&[0x01; 8]);
    let mut pdf_later = vec![b'\n'; 2000];
    pdf_later.extend_from_slice(b"%PDF-1.7\n");
    let heads: [&[u8]; 6] = [
        &noisy,
        &pdf_later,
        b"plain text\n",
        b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR",
        b"",
        b"PK\x03\x04\x14\0\0\0\x08\0",
    ];
    let names = [
        "a.pdf",
        "a.PDF",
        "a.txt",
        "a.csv",
        "a.log",
        "a",
        "a.bin",
        "a.pdf.bin",
        ".pdf",
        "b.Md",
    ];
    for head in heads {
        for name in names {
            assert_eq!(
                sniff(name, head),
                kinds(head)[name_class(name)],
                "{name} {head:?}"
            );
        }
    }
    assert_eq!(
        kinds(&noisy),
        [
            PreviewKind::Unsupported,
            PreviewKind::Text,
            PreviewKind::Unsupported
        ]
    );
    for k in [
        PreviewKind::Pdf,
        PreviewKind::Image,
        PreviewKind::Text,
        PreviewKind::Unsupported,
    ] {
        assert_eq!(PreviewKind::parse(k.as_str()), Some(k));
    }
}
