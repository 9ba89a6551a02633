//! Thumbnails for file managers (issue 35 item 2): a folder of PDFs listed in the mount gets, in
//! the shared thumbnail cache, the entries the freedesktop standard names, from the store's
//! previews, with none of the files' bytes downloaded; a new version gets its entry again, a
//! renamed file its new name's, a deleted file (here or elsewhere) loses them.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{put, vault};
use crate::common::env::{Env, Via, put_elsewhere};
use crate::common::fixtures::shapes_pdf;
use crate::common::mount::{names, wait_for};
use vaultfs::backend::Backend;

both!(listed_pdfs_get_thumbnails_without_downloads);

/// The file URI as the standard has it (percent-encoded path; the vault's name has spaces).
fn uri_of(p: &Path) -> String {
    let mut uri = String::from("file://");
    for &b in p.to_str().unwrap().as_bytes() {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'/' | b'-' | b'.' | b'_' | b'~' => {
                uri.push(b as char)
            }
            _ => uri.push_str(&format!("%{b:02X}")),
        }
    }
    uri
}

fn md5_hex(s: &str) -> String {
    use md5::Digest;
    vaultfs::api::checksum::hex(&md5::Md5::digest(s.as_bytes()))
}

/// An entry read back: its tEXt keys and its size in pixels.
struct Entry {
    uri: Option<String>,
    mtime: Option<String>,
    width: u32,
    height: u32,
}

fn read_entry(p: &Path) -> Option<Entry> {
    let bytes = fs::read(p).ok()?;
    let mut reader = png::Decoder::new(std::io::Cursor::new(bytes))
        .read_info()
        .ok()?;
    let get = |k: &str| {
        let text = &reader.info().uncompressed_latin1_text;
        text.iter().find(|c| c.keyword == k).map(|c| c.text.clone())
    };
    let (uri, mtime) = (get("Thumb::URI"), get("Thumb::MTime"));
    // Decodable whole, not only its header.
    let mut buf = vec![0; reader.output_buffer_size()?];
    let info = reader.next_frame(&mut buf).ok()?;
    Some(Entry {
        uri,
        mtime,
        width: info.width,
        height: info.height,
    })
}

/// Where `file`'s entries of both sizes go.
fn entries_of(cache: &Path, file: &Path) -> [PathBuf; 2] {
    let name = format!("{}.png", md5_hex(&uri_of(file)));
    ["normal", "large"].map(|d| cache.join(d).join(&name))
}

/// Whether `file`'s entries of both sizes are there and valid for it as `stat` shows it now.
fn valid_entries(cache: &Path, file: &Path) -> bool {
    let uri = uri_of(file);
    let mtime = fs::metadata(file).unwrap().mtime().to_string();
    [("normal", 128), ("large", 256)].iter().all(|(dir, px)| {
        let p = cache.join(dir).join(format!("{}.png", md5_hex(&uri)));
        read_entry(&p).is_some_and(|e| {
            e.uri.as_deref() == Some(uri.as_str())
                && e.mtime.as_deref() == Some(mtime.as_str())
                && (1..=*px).contains(&e.width.max(e.height))
        })
    })
}

fn listed_pdfs_get_thumbnails_without_downloads(via: Via) {
    let Some(mut env) = Env::new(via) else { return };
    let n = 6;
    let b = env.backend();
    let docs = vault().child("docs").unwrap();
    env.rt.block_on(async {
        b.create_folder(&docs).await.unwrap();
        for i in 0..n {
            put(&b, &docs, &format!("doc-{i:02}.pdf"), &shapes_pdf(2, i)).await;
        }
    });
    let xdg: PathBuf = env._tmp.path().join("xdg-cache");
    let m = env.mount_with_env(&[], &[("XDG_CACHE_HOME", &xdg)]);
    // Every byte the mount sends the server from now on (remote, in front of the address the
    // mount was given): a download would show as its GET.
    let sent = (via == Via::Remote).then(|| env.record_requests(Duration::ZERO));
    let cache = xdg.join("thumbnails");
    let dir = env.vault().join("docs");
    let files: Vec<PathBuf> = names(&dir).iter().map(|f| dir.join(f)).collect();
    assert_eq!(files.len(), n);

    let started = Instant::now();
    wait_for(60, "every PDF's entries", || {
        files.iter().all(|f| valid_entries(&cache, f))
    });
    eprintln!("{n} PDFs' thumbnails in {:?}", started.elapsed());
    // Nothing else there: one entry a file and size, no temporary files left.
    for d in ["normal", "large"] {
        assert_eq!(fs::read_dir(cache.join(d)).unwrap().count(), n, "{d}");
        let mode = fs::metadata(cache.join(d)).unwrap().mode();
        assert_eq!(mode & 0o777, 0o700, "{d}");
    }
    gio_finds_them_valid(&xdg, &files);
    shared_entries_hold_for_tumbler(&dir, &files);
    let one = cache
        .join("normal")
        .join(format!("{}.png", md5_hex(&uri_of(&files[0]))));
    assert_eq!(fs::metadata(&one).unwrap().mode() & 0o777, 0o600);
    let downloads = || {
        let sent = sent.as_ref().unwrap().lock().unwrap();
        sent.windows(23)
            .filter(|w| *w == b"GET /files/id/Document/")
            .count()
    };
    if via == Via::Remote {
        assert_eq!(downloads(), 0, "files downloaded to make thumbnails");
    }

    // A new version written here, a new file copied in, a version stored elsewhere and a
    // rename: their entries follow, with the names and times `stat` shows now.
    let (mine, theirs, new) = (&files[0], &files[1], dir.join("new.pdf"));
    fs::write(&new, shapes_pdf(1, 102)).unwrap();
    let old = fs::metadata(mine).unwrap().modified().unwrap();
    fs::write(mine, shapes_pdf(3, 100)).unwrap();
    // Another second than the old version's for certain, as an editor keeping times sets it.
    let f = fs::File::options().write(true).open(mine).unwrap();
    f.set_modified(old + Duration::from_secs(60)).unwrap();
    drop(f);
    env.wait_uploaded();
    assert_eq!(
        fs::metadata(mine).unwrap().modified().unwrap(),
        old + Duration::from_secs(60)
    );
    // This mount's own uploads queue them: no listing needed.
    wait_for(60, "the entries of what was written here", || {
        valid_entries(&cache, mine) && valid_entries(&cache, &new)
    });
    put_elsewhere(&env, "docs/doc-01.pdf", &shapes_pdf(3, 101));
    wait_for(60, "the entries of the version stored elsewhere", || {
        // As a file manager told of the change lists the folder again.
        names(&dir);
        valid_entries(&cache, theirs)
    });
    assert!(valid_entries(&cache, mine));

    // Renamed: the new name gets its entries, the old name's go.
    let (before, after) = (&files[2], dir.join("renamed.pdf"));
    let old_entry = cache
        .join("normal")
        .join(format!("{}.png", md5_hex(&uri_of(before))));
    assert!(old_entry.exists());
    fs::rename(before, &after).unwrap();
    wait_for(60, "the renamed file's entries, the old ones gone", || {
        names(&dir);
        valid_entries(&cache, &after) && !old_entry.exists()
    });

    // Deleted here, and deleted elsewhere (seen at the next listing): their entries go, the
    // others' stay.
    let (here, there) = (&files[3], &files[4]);
    assert!(valid_entries(&cache, here) && valid_entries(&cache, there));
    fs::remove_file(here).unwrap();
    wait_for(60, "the entries of the file deleted here gone", || {
        entries_of(&cache, here).iter().all(|e| !e.exists())
    });
    let theirs_path = docs
        .child(there.file_name().unwrap().to_str().unwrap())
        .unwrap();
    env.rt.block_on(b.delete(&theirs_path)).unwrap();
    wait_for(60, "the entries of the file deleted elsewhere gone", || {
        names(&dir);
        entries_of(&cache, there).iter().all(|e| !e.exists())
    });
    assert!(valid_entries(&cache, &files[5]) && valid_entries(&cache, &after));
    for d in ["normal", "large"] {
        // doc-00, doc-01, doc-05, new.pdf and renamed.pdf.
        assert_eq!(fs::read_dir(cache.join(d)).unwrap().count(), 5, "{d}");
    }
    if via == Via::Remote {
        assert_eq!(downloads(), 0, "files downloaded to make thumbnails");
    }
    drop(m);
}

/// Thunar's: the folder's shared repository (`.sh_thumbnails/`, reached by name, never listed)
/// holds each file's entries where tumbler looks for them (libxfce4util's
/// `xfce_create_shared_thumbnail_path`: the md5 of `./` and the name as its URI spells it), with
/// the time as tumbler compares it (`sec.usec`, as GIO gives it); nothing in it can be written.
fn shared_entries_hold_for_tumbler(dir: &Path, files: &[PathBuf]) {
    let shared = dir.join(".sh_thumbnails");
    assert!(!names(dir).contains(&".sh_thumbnails".to_string()));
    assert_eq!(names(&shared), ["large", "normal"]);
    for f in files {
        let uri = uri_of(f);
        let rel = format!("./{}", &uri[uri.rfind('/').unwrap() + 1..]);
        let m = fs::metadata(f).unwrap();
        let mtime = format!("{}.{:06}", m.mtime(), m.mtime_nsec() / 1000);
        for (size, px) in [("normal", 128), ("large", 256)] {
            let p = shared.join(size).join(format!("{}.png", md5_hex(&rel)));
            let e = read_entry(&p).unwrap_or_else(|| panic!("no entry {}", p.display()));
            assert_eq!(e.uri.as_deref(), Some(rel.as_str()));
            assert_eq!(e.mtime.as_deref(), Some(mtime.as_str()), "{}", f.display());
            assert!((1..=px).contains(&e.width.max(e.height)));
        }
    }
    let one = shared
        .join("normal")
        .join(format!("{}.png", md5_hex("./doc-00.pdf")));
    let e = fs::write(&one, b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    assert!(!shared.join("normal").join("nothing.png").exists());
}

/// What GLib itself (GIO, under Nautilus, Nemo and Thunar) makes of the entries: `gio info`'s
/// `thumbnail::path` and `thumbnail::is-valid`, the attributes a file manager reads before it
/// would thumbnail a file itself. Where `gio` is not installed, said and left out.
fn gio_finds_them_valid(xdg: &Path, files: &[PathBuf]) {
    let Ok(out) = std::process::Command::new("gio")
        .args(["info", "-a", "thumbnail::path,thumbnail::is-valid"])
        .args(files)
        .env("XDG_CACHE_HOME", xdg)
        .output()
    else {
        eprintln!("gio not installed: GLib's own check of the entries left out");
        return;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let valid = text.matches("thumbnail::is-valid: TRUE").count();
    let paths = text
        .matches(&format!("thumbnail::path: {}", xdg.display()))
        .count();
    assert_eq!((valid, paths), (files.len(), files.len()), "{text}");
}
