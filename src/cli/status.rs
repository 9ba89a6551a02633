//! `vaultfs unmount DIR` and `vaultfs status [DIR]`: requests to a running mount over its control
//! socket.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use clap::Args;

use super::control;
use crate::fs::status::{Status, Upload, human_bytes};

#[derive(Args)]
pub struct UnmountArgs {
    /// The mount point
    mountpoint: PathBuf,
    /// Seconds to wait for the daemon to flush its uploads and exit
    #[arg(long, default_value_t = 120.0, value_name = "S")]
    wait: f64,
}

/// Asks the daemon to flush and unmount and waits for it; a mount without a daemon (stale) is
/// detached.
pub fn unmount(args: UnmountArgs) -> Result<(), Box<dyn std::error::Error>> {
    let mp = &args.mountpoint;
    match control::unmount(mp, Duration::from_secs_f64(args.wait.max(0.0))) {
        Some(Ok(done)) => {
            if done.left_in_journal > 0 {
                eprintln!(
                    "vaultfs: unmounted {}; {} file(s) not yet uploaded stay in the journal for the next mount",
                    mp.display(),
                    done.left_in_journal
                );
            } else {
                eprintln!("vaultfs: unmounted {}", mp.display());
            }
            for p in &done.pins_pending {
                eprintln!(
                    "vaultfs: pinned, not yet on disk (the next mount fetches the rest): {p}"
                );
            }
            Ok(())
        }
        Some(Err(e)) => Err(format!("unmounting {}: {e}", mp.display()).into()),
        None if crate::fs::unmount::is_stale(mp) => {
            crate::fs::unmount::detach(mp)?;
            eprintln!("vaultfs: unmounted the stale mount {}", mp.display());
            Ok(())
        }
        None => {
            // Mounted by a vaultfs without a control socket, or not mounted at all.
            let ok = Command::new("fusermount3")
                .args(["-u", "--"])
                .arg(mp)
                .stdin(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                Ok(())
            } else {
                Err(format!("{} is not mounted by a running vaultfs", mp.display()).into())
            }
        }
    }
}

#[derive(Args)]
pub struct StatusArgs {
    /// A mount point, or any path inside a mount [default: every running mount]
    mountpoint: Option<PathBuf>,
    /// Print JSON (an array of mounts without DIR, one object with it)
    #[arg(long)]
    json: bool,
    /// Keep showing the uploads with live progress bars until Ctrl-C
    #[arg(long, conflicts_with = "json")]
    watch: bool,
}

pub fn status(args: StatusArgs) -> Result<(), Box<dyn std::error::Error>> {
    let fetch = || -> Result<Vec<Status>, String> {
        match &args.mountpoint {
            Some(given) => {
                let mp = control::mount_given(given);
                match control::status(&mp) {
                    Some(r) => r.map(|s| vec![s]),
                    None => Err(format!(
                        "no running vaultfs mount at {} (no daemon answers on {})",
                        given.display(),
                        control::socket_path(&mp).display()
                    )),
                }
            }
            None => Ok(control::status_all()),
        }
    };
    let all = fetch()?;
    if args.json {
        let out = match (&args.mountpoint, all.as_slice()) {
            (Some(_), [one]) => serde_json::to_string_pretty(one)?,
            _ => serde_json::to_string_pretty(&all)?,
        };
        println!("{out}");
        return Ok(());
    }
    if all.is_empty() {
        println!("no running vaultfs mounts");
        return Ok(());
    }
    if args.watch {
        return watch(fetch);
    }
    for s in &all {
        print!("{}", render(s));
    }
    Ok(())
}

/// The human view of one mount.
fn render(s: &Status) -> String {
    let mut out = format!("{} (pid {})\n", s.mountpoint, s.pid);
    out += &format!("  backend   {}\n", s.backend);
    out += &format!(
        "  root      {}{}\n",
        s.root,
        if s.read_only { " (read-only)" } else { "" }
    );
    if s.offline {
        let since = s
            .offline_since
            .as_ref()
            .map(|t| format!(" since {t}"))
            .unwrap_or_default();
        out += &format!(
            "  state     offline{since}: backend unreachable; cached listings, writes staged\n"
        );
    }
    if let Some(t) = &s.token_expires {
        out += &format!("  token     expires {t}\n");
    }
    // Pinned files come on top of the bound.
    let bounded = s.cache.used_bytes.saturating_sub(s.cache.pinned_bytes);
    let pct = (bounded * 100).checked_div(s.cache.max_bytes).unwrap_or(0);
    let pinned = match s.cache.pinned_bytes {
        0 => String::new(),
        n => format!(", and {} pinned", human_bytes(n)),
    };
    out += &format!(
        "  cache     {} of {} ({pct}%){pinned}, {} file(s)\n",
        human_bytes(bounded),
        human_bytes(s.cache.max_bytes),
        s.cache.files
    );
    if s.open_files.bound > 0 {
        out += &format!(
            "  files     {} of {} kept open, {} opened so far\n",
            s.open_files.open, s.open_files.bound, s.open_files.opened
        );
    }
    if !s.reads.is_empty() {
        out += &format!("  reads     {}\n", s.reads);
    }
    if !s.writes.is_empty() {
        out += &format!("  writes    {}\n", s.writes);
    }
    if s.read_ahead_kb > 0 {
        out += &format!("  readahead {} KiB\n", s.read_ahead_kb);
    }
    if s.uploads_pending() == 0 {
        out += "  uploads   none pending\n";
    } else {
        let running = s.running().count();
        out += &format!(
            "  uploads   {running} running, {} waiting ({})\n",
            s.uploads_pending() - running,
            human_bytes(s.pending_bytes())
        );
        for u in &s.uploads {
            out += &format!("    {}\n", upload_line(u));
        }
        if s.unlisted_waiting() > 0 {
            out += &format!("    and {} more waiting\n", s.unlisted_waiting());
        }
    }
    if s.deletes_pending > 0 {
        out += &format!("  deletes   {} to send to the store\n", s.deletes_pending);
    }
    if !s.pins.is_empty() {
        out += &format!(
            "  pinned    {} on disk, kept outside the cache's bound\n",
            human_bytes(s.cache.pinned_bytes)
        );
        for p in &s.pins {
            let at = if p.local_path.is_empty() {
                &p.path
            } else {
                &p.local_path
            };
            out += &format!(
                "    {at}  {}: {} of {} file(s), {} of {}{}\n",
                p.state,
                p.whole_files,
                p.files,
                human_bytes(p.whole_bytes),
                human_bytes(p.bytes),
                p.problem
                    .as_ref()
                    .map(|w| format!(" ({w})"))
                    .unwrap_or_default()
            );
        }
    }
    if !s.conflicts.is_empty() {
        out += "  conflict copies (edits made here to files changed elsewhere)\n";
        for c in &s.conflicts {
            out += &format!("    {}  (of {}, {})\n", c.copy, c.original, c.at);
        }
    }
    if !s.set_aside.is_empty() {
        out += "  NOT STORED: edits the store refused, kept in lost+found (move each back into the \
                 mount under a name the store takes, or delete it, once dealt with)\n";
        for a in &s.set_aside {
            out += &format!(
                "    {}  ({}, {})\n      kept in {}\n",
                a.path, a.why, a.at, a.kept
            );
        }
    }
    if !s.errors.is_empty() {
        out += "  recent errors\n";
        for e in &s.errors {
            out += &format!("    {}  {}\n", e.at, e.message);
        }
    }
    out
}

fn upload_line(u: &Upload) -> String {
    if !u.running {
        return format!("[{:30}] waiting  {} {}", "", human_bytes(u.size), u.path);
    }
    let frac = if u.size == 0 {
        1.0
    } else {
        u.sent as f64 / u.size as f64
    };
    let filled = ((frac * 30.0) as usize).min(30);
    format!(
        "[{}{}] {:>3}%  {} of {}, {}/s {}",
        "#".repeat(filled),
        "-".repeat(30 - filled),
        (frac * 100.0) as u32,
        human_bytes(u.sent),
        human_bytes(u.size),
        human_bytes(u.rate as u64),
        u.path
    )
}

/// Live progress bars of the uploads (indicatif), refreshed twice a second.
fn watch(
    fetch: impl Fn() -> Result<Vec<Status>, String>,
) -> Result<(), Box<dyn std::error::Error>> {
    use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
    use std::collections::HashMap;
    let multi = MultiProgress::new();
    let style = ProgressStyle::with_template(
        "{prefix:.bold} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta} {msg}",
    )?
    .progress_chars("#>-");
    let header = multi.add(ProgressBar::new_spinner());
    let mut bars: HashMap<(String, String), ProgressBar> = HashMap::new();
    loop {
        let all = match fetch() {
            Ok(a) => a,
            Err(e) => {
                header.finish_with_message(e);
                return Ok(());
            }
        };
        let mut seen = Vec::new();
        let mut summary = Vec::new();
        for s in &all {
            let running = s.running().count();
            summary.push(format!(
                "{}: cache {} of {}, {running} running, {} waiting, {} error(s)",
                s.mountpoint,
                human_bytes(s.cache.used_bytes),
                human_bytes(s.cache.max_bytes),
                s.uploads_pending() - running,
                s.errors.len()
            ));
            for u in s.running() {
                let key = (s.mountpoint.clone(), u.path.clone());
                let bar = bars.entry(key.clone()).or_insert_with(|| {
                    let b = multi.add(ProgressBar::new(u.size));
                    b.set_style(style.clone());
                    b.set_prefix(u.path.clone());
                    b
                });
                bar.set_length(u.size);
                bar.set_position(u.sent);
                seen.push(key);
            }
        }
        header.set_message(summary.join("; "));
        header.tick();
        bars.retain(|k, b| {
            let keep = seen.contains(k);
            if !keep {
                b.finish_and_clear();
            }
            keep
        });
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upload_lines_show_progress() {
        let u = Upload {
            path: "/nodes/pth/a/b.bin".into(),
            size: 4 << 20,
            sent: 1 << 20,
            running: true,
            rate: 1048576.0,
            elapsed: 1.0,
        };
        let l = upload_line(&u);
        assert!(l.contains(" 25%"), "{l}");
        assert!(l.contains("1.0 MiB of 4.0 MiB, 1.0 MiB/s"), "{l}");
    }
}
