//! The mount's virtual `.preview/` tree on both backends, and a preview asked for there made first.

use std::fs;
use std::time::Instant;

use super::{put, rows, sha256, small_text, status, vault};
use crate::common::env::{Env, Via};
use crate::common::fixtures::{png_size, sample_text, shapes_pdf};
use crate::common::mount::{names, wait_for};
use vaultfs::backend::Backend;

both!(
    previews_in_the_mount,
    a_preview_asked_for_in_the_mount_goes_first,
);

#[track_caller]
fn assert_erofs<T: std::fmt::Debug>(r: std::io::Result<T>, what: &str) {
    let e = r.expect_err(what);
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{what}: {e}");
}

fn previews_in_the_mount(via: Via) {
    let Some(env) = Env::new(via) else { return };
    // A real `.preview` already in the store, at the top and inside a folder.
    let b = env.backend();
    env.rt.block_on(async {
        let hidden = vault().child(".preview").unwrap();
        b.create_folder(&hidden).await.unwrap();
        put(&b, &hidden, "keep.txt", b"not to be touched").await;
        let sub = vault().child("sub").unwrap();
        b.create_folder(&sub).await.unwrap();
        let sub_hidden = sub.child(".preview").unwrap();
        b.create_folder(&sub_hidden).await.unwrap();
        put(&b, &sub_hidden, "keep.txt", b"nor this").await;
    });

    let m = env.mount(&[]);
    let v = env.vault();
    let pdf = shapes_pdf(3, 0);
    fs::write(v.join("notes.txt"), sample_text()).unwrap();
    fs::write(v.join("paper.pdf"), &pdf).unwrap();
    let junk: Vec<u8> = (0..5000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    fs::write(v.join("data.bin"), &junk).unwrap();
    env.wait_uploaded();

    // Reached by name, not listed (so cp -r, rm -r, find and git do not walk into it).
    assert_eq!(names(&v), ["data.bin", "notes.txt", "paper.pdf", "sub"]);
    let pv = v.join(".preview");
    assert!(pv.is_dir());
    let (notes, paper) = (pv.join("notes.txt"), pv.join("paper.pdf"));
    let started = Instant::now();
    wait_for(60, "both previews to be ready", || {
        status(&notes) == "Ready\n" && status(&paper) == "Ready\n"
    });
    eprintln!("previews ready {:?} after the uploads", started.elapsed());
    // Files with no preview have no entry; the real `.preview` stays hidden.
    assert_eq!(names(&pv), ["notes.txt", "paper.pdf"]);
    assert!(!pv.join("data.bin").exists());
    assert!(!pv.join("keep.txt").exists());

    let items = names(&notes);
    let pages = items.iter().filter(|n| n.starts_with("page-")).count();
    assert!(pages >= 2, "{items:?}");
    assert_eq!(
        items.iter().filter(|n| n.starts_with("thumb-")).count(),
        pages
    );
    assert!(items.contains(&"document.pdf".to_string()) && items.contains(&"status".to_string()));
    for n in 1..=pages {
        for (name, size) in [
            (format!("page-{n:04}.png"), (1224, 1584)),
            (format!("thumb-{n:04}.png"), (306, 396)),
        ] {
            let p = notes.join(&name);
            let bytes = fs::read(&p).unwrap();
            // The size `ls -l` shows is the size of what is read.
            assert_eq!(
                fs::metadata(&p).unwrap().len(),
                bytes.len() as u64,
                "{name}"
            );
            assert_eq!(png_size(&bytes), size, "{name}");
        }
    }
    let made = fs::read(notes.join("document.pdf")).unwrap();
    assert!(made.starts_with(b"%PDF-"));
    // The preview PDF of a PDF is the file itself; its pages are rendered from it.
    assert_eq!(fs::read(paper.join("document.pdf")).unwrap(), pdf);
    assert_eq!(
        names(&paper)
            .iter()
            .filter(|n| n.starts_with("page-"))
            .count(),
        3
    );
    assert_eq!(
        png_size(&fs::read(paper.join("page-0002.png")).unwrap()),
        (1224, 1584)
    );
    assert!(!notes.join(format!("page-{:04}.png", pages + 1)).exists());
    assert!(!notes.join("page-1.png").exists());

    // Read-only, all of it.
    assert_erofs(fs::write(notes.join("status"), "x"), "write status");
    assert_erofs(fs::write(notes.join("new.png"), "x"), "create in a preview");
    assert_erofs(
        fs::remove_file(notes.join("page-0001.png")),
        "unlink a page",
    );
    assert_erofs(fs::create_dir(pv.join("new")), "mkdir in .preview");
    assert_erofs(fs::rename(notes.join("status"), v.join("s")), "move out");
    assert_erofs(fs::rename(v.join("data.bin"), notes.join("d")), "move in");
    assert_erofs(fs::rename(&pv, v.join("p")), "rename .preview");
    assert_erofs(fs::remove_dir(&notes), "rmdir a preview");
    assert!(fs::remove_dir_all(&pv).is_err());
    assert!(fs::write(v.join(".preview"), "x").is_err());
    // A folder holding a hidden `.preview` is not empty; it is kept, with it.
    let e = fs::remove_dir(v.join("sub")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTEMPTY), "{e}");
    assert_eq!(names(&v), ["data.bin", "notes.txt", "paper.pdf", "sub"]);

    // A new version gets its own preview.
    fs::write(v.join("notes.txt"), "one short line\n").unwrap();
    env.wait_uploaded();
    wait_for(60, "the new version's preview", || {
        status(&notes) == "Ready\n" && !notes.join("page-0002.png").exists()
    });
    assert_eq!(
        png_size(&fs::read(notes.join("page-0001.png")).unwrap()),
        (1224, 1584)
    );
    m.unmount();

    // Nothing the mount did touched the real `.preview` folders.
    env.rt.block_on(async {
        for dir in [".preview", "sub/.preview"] {
            let p = dir
                .split('/')
                .fold(vault(), |p, s| p.child(s).unwrap())
                .child("keep.txt")
                .unwrap();
            let node = b.node(&p).await.unwrap();
            assert!(node.size.unwrap() > 0, "{dir}/keep.txt is gone");
        }
    });
}

/// After a burst of small files written through the mount, the one asked for under `.preview/`
/// is rendered at once, on the store's side (over a server too), and nothing else is.
fn a_preview_asked_for_in_the_mount_goes_first(via: Via) {
    let Some(env) = Env::new(via) else { return };
    let m = env.mount(&[]);
    let v = env.vault();
    let n = 200;
    let start = Instant::now();
    for i in 0..n {
        fs::write(v.join(format!("f{i:03}.txt")), small_text(i)).unwrap();
    }
    fs::write(v.join("notes.txt"), sample_text()).unwrap();
    env.wait_uploaded();
    eprintln!(
        "{} files written and stored in {:?}",
        n + 1,
        start.elapsed()
    );
    let notes = v.join(".preview/notes.txt");
    let asked = Instant::now();
    wait_for(60, "the preview asked for", || status(&notes) == "Ready\n");
    eprintln!("asked for: Ready after {:?}", asked.elapsed());
    assert!(names(&notes).contains(&"page-0001.png".to_string()));
    let r = rows(&env.data);
    assert_eq!(r[&sha256(&sample_text())].2, 1, "rendered as asked for");
    let unasked = (0..n)
        .filter(|&i| r.get(&sha256(&small_text(i))).is_some_and(|x| x.0 != 0))
        .count();
    assert_eq!(unasked, 0, "small files rendered without being asked for");
    m.unmount();
}
