//! `vaultfs restore FILE --version V`: a file in a mount gets an earlier version's bytes back.
//!
//! Restoring is copying `DIR/.versions/FILE/V` over `DIR/FILE` through the mount: the mount
//! stores the bytes as the file's new current version, as any save, so the version they
//! replace is kept in turn, nothing is lost, and the same works on every backend that lists
//! versions (no route of its own, no second writer beside the mount).

use std::path::{Path, PathBuf};

use clap::Args;

#[derive(Args)]
pub struct RestoreArgs {
    /// The file, in a mount
    file: PathBuf,
    /// The version to bring back, as `.versions/` lists it (e.g. "2026-11-27 01.02.03.txt")
    #[arg(long, value_name = "NAME", required_unless_present = "list")]
    version: Option<String>,
    /// List the earlier versions of the file (name, size) instead
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
