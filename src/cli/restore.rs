//! `vaultfs restore FILE --version V`: a file in a mount gets an earlier version's bytes back.
//! `vaultfs restore PATH` (a file or folder removed from a mount): it comes back.
//!
//! Restoring a version is copying `DIR/.versions/FILE/V` over `DIR/FILE` through the mount: the
//! mount stores the bytes as the file's new current version, as any save, so the version they
//! replace is kept in turn, nothing is lost, and the same works on every backend that lists
//! versions (no route of its own, no second writer beside the mount).
//!
//! Bringing back what was removed is the store's (the built-in one, or our server's route): the
//! command asks the mount where its store is (`mounted`) and restores the most recently deleted
//! file or folder of that name there, a folder with its tree and what was removed with it
//! (`rm -rf`); the mount sees it come back as any change made elsewhere.

use std::path::{Path, PathBuf};

use clap::Args;

use super::mounted::{Client, Mounted};

#[derive(Args)]
pub struct RestoreArgs {
    /// A file in a mount (with --version), or the path a file or folder was removed from
    file: PathBuf,
    /// The version to bring back, as `.versions/` lists it (e.g. "2026-11-27 01.02.03.txt")
    #[arg(long, value_name = "NAME")]
    version: Option<String>,
    /// List instead: a file's earlier versions (name, size), or what was removed from a
    /// folder and can be brought back (name, a folder's ending in /, when it was deleted)
    #[arg(long, conflicts_with = "version")]
    list: bool,
}

/// Where the earlier versions of `file` are listed.
fn versions_dir(file: &Path) -> Option<PathBuf> {
    let name = file.file_name()?;
    let parent = match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    Some(parent.join(".versions").join(name))
}

/// Exits 0 when restored (or listed), 1 when the file or the version is not there, 2 when the
/// file is not in a mount that lists versions.
pub fn restore(args: RestoreArgs) -> Result<(), Box<dyn std::error::Error>> {
    let file = &args.file;
    if file.is_dir() && args.list {
        return list_removed(file);
    }
    if !file.exists() && !args.list && args.version.is_none() {
        return bring_back(file);
    }
    if file.is_file() && !args.list && args.version.is_none() {
        eprintln!(
            "vaultfs: {} is there: give --version NAME for an earlier version (--list lists them)",
            file.display()
        );
        std::process::exit(1);
    }
    let Some(dir) = versions_dir(file) else {
        eprintln!("vaultfs: {} is not a file", file.display());
        std::process::exit(1);
    };
    if !dir.parent().is_some_and(Path::is_dir) {
        eprintln!(
            "vaultfs: {} is not in a vaultfs mount (no .versions/ beside it)",
            file.display()
        );
        std::process::exit(2);
    }
    let mut versions: Vec<(String, u64)> = match std::fs::read_dir(&dir) {
        Ok(entries) => entries
            .filter_map(|e| {
                let e = e.ok()?;
                Some((
                    e.file_name().to_string_lossy().into_owned(),
                    e.metadata().ok()?.len(),
                ))
            })
            .collect(),
        // A file with no earlier version has no entry.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(format!("cannot list {}: {e}", dir.display()).into()),
    };
    versions.sort();
    if args.list {
        for (name, size) in &versions {
            println!("{name}\t{size}");
        }
        return Ok(());
    }
    let want = args.version.unwrap_or_default();
    if !versions.iter().any(|(n, _)| *n == want) {
        eprintln!(
            "vaultfs: {} has no version {want:?}; it has: {}",
            file.display(),
            if versions.is_empty() {
                "none".to_string()
            } else {
                versions
                    .iter()
                    .map(|(n, _)| format!("{n:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        );
        std::process::exit(1);
    }
    let n = std::fs::copy(dir.join(&want), file)
        .map_err(|e| format!("cannot restore {}: {e}", file.display()))?;
    println!("restored {} to {want} ({n} bytes)", file.display());
    Ok(())
}

/// `path` in a mount, and that mount's store; exits 2 where it is in none.
fn mounted(path: &Path) -> Result<(Mounted, Client), Box<dyn std::error::Error>> {
    let Some(m) = Mounted::of(path)? else {
        let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
        if parent.is_some_and(|p| !p.exists()) {
            eprintln!(
                "vaultfs: the folder of {} is not there: restore that folder first",
                path.display()
            );
            std::process::exit(1);
        }
        eprintln!(
            "vaultfs: {} is not in a running vaultfs mount",
            path.display()
        );
        std::process::exit(2);
    };
    let client = Client::open(&m.store)?;
    Ok((m, client))
}

/// `--list` of a folder: what was removed from it and can be brought back.
fn list_removed(dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let (m, client) = mounted(dir)?;
    let rt = tokio::runtime::Runtime::new()?;
    for d in rt.block_on(client.deleted_files(&m.path))? {
        let slash = if d.folder { "/" } else { "" };
        println!(
            "{}{slash}\tdeleted {}",
            super::terminal::escaped(&d.name),
            super::terminal::escaped(&d.deleted_on)
        );
    }
    Ok(())
}

/// The file or folder removed from `path` most recently comes back (a folder with its tree).
fn bring_back(path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let (m, client) = mounted(path)?;
    let (Some(folder), Some(name)) = (m.path.parent(), m.path.name()) else {
        eprintln!("vaultfs: {} is not a file or folder", path.display());
        std::process::exit(1);
    };
    let rt = tokio::runtime::Runtime::new()?;
    let removed = rt.block_on(client.deleted_files(&folder))?;
    let Some(d) = removed.iter().find(|d| d.name == name) else {
        eprintln!(
            "vaultfs: nothing named {name:?} was removed from {} and kept (`vaultfs restore \
             --list {}` lists what was)",
            path.parent().unwrap_or(Path::new(".")).display(),
            path.parent().unwrap_or(Path::new(".")).display()
        );
        std::process::exit(1);
    };
    let node = rt.block_on(client.restore_deleted(&d.id))?;
    let what = if d.folder {
        "folder, with what was removed with it"
    } else {
        "file, with its versions"
    };
    let restored = super::terminal::escaped(&m.local(&node.uri));
    println!("restored {restored} ({what})");
    Ok(())
}
