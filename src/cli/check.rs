//! `vaultfs check`: a built-in store's tree, rows and bytes verified, and with `--repair` the
//! parts of its tree no root reaches moved to `lost+found` (`store::check`).

use std::path::PathBuf;

use clap::Args;

use super::DataDir;
use crate::store::BlobLocation;

#[derive(Args)]
pub struct CheckArgs {
    /// The store to check [default: $XDG_DATA_HOME/vaultfs, or ~/.local/share/vaultfs]
    #[command(flatten)]
    data: DataDir,
    /// Its blobs, if it is served with `--blobs DIR` [default: blobs/ in the data directory]
    #[arg(long, value_name = "DIR")]
    blobs: Option<PathBuf>,
    /// Move each part of the tree that no account reaches (a cycle of parents, a missing
    /// parent), with everything in it, into `lost+found` in the first vault of its account
    #[arg(long)]
    repair: bool,
}

/// Prints what was found (and done), and exits as fsck(8) does: 0 when nothing was found, 1
/// when everything found was repaired, 4 when a problem remains, 8 when the check could not run.
pub fn check(args: CheckArgs) -> Result<(), Box<dyn std::error::Error>> {
    let dir = args.data.path();
    let location = args.blobs.map_or(BlobLocation::DataDir, BlobLocation::Dir);
    let report = match crate::store::check::run(&dir, &location, args.repair, &mut |line| {
        println!("{line}")
    }) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("vaultfs: check failed: {e}");
            std::process::exit(8);
        }
    };
    for p in &report.problems {
        println!("problem: {p}");
    }
    for r in &report.repaired {
        println!("repair: {r}");
    }
    println!(
        "{} node(s) and {} blob(s) checked: {} problem(s) found, {} remaining",
        report.nodes,
        report.blobs,
        report.problems.len(),
        report.remaining
    );
    if report.remaining > 0 {
        let hint = if args.repair {
            ""
        } else {
            " (`vaultfs check --repair` mends the tree's)"
        };
        eprintln!(
            "vaultfs: {} problem(s) in {}{hint}",
            report.remaining,
            dir.display()
        );
        std::process::exit(4);
    }
    if !report.problems.is_empty() {
        std::process::exit(1);
    }
    Ok(())
}
