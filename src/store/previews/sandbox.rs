//! Rendering in a child process with a memory and CPU bound (issue 31). A hostile file can make
//! the renderer allocate without end (a PDF page of 60,000 page-sized fills: 2.5 GB; a content
//! stream inflating to 8 GiB: the allocator aborts), and `catch_unwind` cannot catch an
//! allocation failure: in the server's own process that is the server gone, and after a restart
//! the same job again. So each job runs in `vaultfs render-preview` (this binary, a hidden
//! command), under `setrlimit` (data [`memory_limit`], CPU [`CPU_SECONDS`], no core file), and is
//! killed by its parent at [`KILL_AFTER`] or when the parent goes. Whatever it does, the server
//! only loses the job: a child that dies is a file without a preview, recorded so.
//!
//! The protocol: the parent writes the file's bytes (for text, the first
//! [`preview::TEXT_MAX_BYTES`]) to the child's standard input; the child writes the pages into
//! the folder it is given (`page-0001.png`..., `document.pdf` when it made one, each synced) and
//! one line per page on standard output (`page WIDTH HEIGHT BYTES`), then `done OWN_PDF
//! TRUNCATED` or `unsupported REASON`. Its standard error (a panic's or the allocator's message)
//! becomes the reason when it dies.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::{JOB_TIME, MAX_INPUT, page_file};
use crate::preview::{self, DocumentPdf, Limits, PreviewKind};

/// Memory of a job besides its input: a 4096 px page's pixmap and PNG, an image of the
/// largest size decoded (64 Mpx), hayro's caches, the text layout. The input is added twice
/// (read, and the copy hayro owns).
const BASE_MEMORY: u64 = 1 << 30;
/// CPU seconds of one job: the SIGXCPU at this many, SIGKILL a few later.
pub(super) const CPU_SECONDS: u64 = 120;
/// The parent kills a child still running this long after it started (its own deadline,
/// [`JOB_TIME`], is only checked between pages).
pub(super) const KILL_AFTER: Duration = Duration::from_secs(JOB_TIME.as_secs() + 30);
/// How often the parent looks at the clock and, for a background job, at the store's activity.
const TICK: Duration = Duration::from_millis(200);
/// Bytes of the child's standard error kept for the reason of its death.
const STDERR_TAIL: usize = 2048;

/// The data bound of a job reading `input` bytes.
pub(super) fn memory_limit(input: u64) -> u64 {
    BASE_MEMORY + 2 * input
}

/// The program that renders: this very binary. On Linux `/proc/self/exe`, which still runs the
/// binary this process started from when a package upgrade has replaced it on disk (a new binary
/// could speak another protocol).
pub fn this_program() -> PathBuf {
    if cfg!(target_os = "linux") {
        PathBuf::from("/proc/self/exe")
    } else {
        std::env::current_exe().unwrap_or_else(|_| PathBuf::from("vaultfs"))
    }
}

/// How a child's job ended.
pub(in crate::store) enum Ended {
    /// Rendered: its pages (size, PNG bytes) are in the folder.
    Done {
        pages: Vec<(u32, u32, u64)>,
        own_pdf: bool,
        truncated: bool,
    },
    /// The renderer said why there is no preview.
    Unsupported(String),
    /// The parent stopped it: the store got busy (a background job).
    Stopped,
    /// Still running at [`KILL_AFTER`]: killed.
    TimedOut,
    /// It died (a bound reached, a crash): why, as well as it can be told.
    Died(String),
}

/// The job of the search indexer (`store::search`): a PDF's text layer, written to
/// `DIR/`[`TEXT_FILE`] under the same bounds as a rendering, then `done 0 0`.
pub(in crate::store) const PDF_TEXT: &str = "pdf-text";
pub(in crate::store) const TEXT_FILE: &str = "text.txt";

/// Runs one job in a child: `program render-preview KIND DIR` (or [`PDF_TEXT`]), fed `input`.
/// `stop` is asked between pages and every [`TICK`]; true kills the child ([`Ended::Stopped`]).
pub(in crate::store) fn run(
    program: &Path,
    kind: &str,
    dir: &Path,
    input: &mut (dyn Read + Send),
    input_len: u64,
    stop: &dyn Fn() -> bool,
) -> std::io::Result<Ended> {
    let mut cmd = Command::new(program);
    cmd.arg("render-preview")
        .arg(kind)
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env_remove("RUST_LOG")
        // The reason of a death is the last line it writes, not a backtrace.
        .env("RUST_BACKTRACE", "0");
    limit(&mut cmd, memory_limit(input_len));
    let mut child = cmd.spawn()?;
    let started = Instant::now();
    let (mut stdin, stdout, mut stderr) = (
        child.stdin.take().expect("piped"),
        child.stdout.take().expect("piped"),
        child.stderr.take().expect("piped"),
    );
    let (tx, rx) = mpsc::channel::<String>();
    let ended = std::thread::scope(|s| {
        // A child that dies or is killed closes its end: the copy then ends with an error.
        s.spawn(move || {
            let _ = std::io::copy(input, &mut stdin);
        });
        s.spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let tail = s.spawn(move || {
            let mut tail = Vec::new();
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = stderr.read(&mut buf) {
                tail.extend_from_slice(&buf[..n]);
                let extra = tail.len().saturating_sub(STDERR_TAIL);
                tail.drain(..extra);
            }
            String::from_utf8_lossy(&tail).trim().to_string()
        });
        let mut pages = Vec::new();
        let ended = loop {
            if stop() {
                break Some(Ended::Stopped);
            }
            if started.elapsed() >= KILL_AFTER {
                break Some(Ended::TimedOut);
            }
            match rx.recv_timeout(TICK) {
                Ok(line) => match parse(&line) {
                    Some(Line::Page(w, h, n)) => pages.push((w, h, n)),
                    Some(Line::Done(own_pdf, truncated)) => {
                        break Some(Ended::Done {
                            pages: std::mem::take(&mut pages),
                            own_pdf,
                            truncated,
                        });
                    }
                    Some(Line::Unsupported(why)) => break Some(Ended::Unsupported(why)),
                    None => break Some(Ended::Died(format!("renderer said {line:?}"))),
                },
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                // Its output closed without an ending: it died.
                Err(mpsc::RecvTimeoutError::Disconnected) => break None,
            }
        };
        if !matches!(ended, Some(Ended::Done { .. } | Ended::Unsupported(_))) {
            let _ = child.kill();
        }
        let status = child.wait();
        let tail = tail.join().unwrap_or_default();
        match (ended, status) {
            (Some(Ended::Done { .. }), Ok(st)) if !st.success() => {
                Ok(Ended::Died(death(st, &tail, input_len)))
            }
            (Some(e), _) => Ok(e),
            (None, Ok(st)) => Ok(Ended::Died(death(st, &tail, input_len))),
            (None, Err(e)) => Err(e),
        }
    });
    if let Ok(Ended::Died(why)) = &ended {
        log::warn!(
            "preview renderer died after {:.1}s: {why}",
            started.elapsed().as_secs_f64()
        );
    }
    ended
}

/// Why a child died, from its exit status and the end of its standard error (its last line
/// that is not a note about backtraces: the panic's or the allocator's message).
fn death(status: ExitStatus, stderr: &str, input_len: u64) -> String {
    use std::os::unix::process::ExitStatusExt;
    let mib = memory_limit(input_len) >> 20;
    let said = stderr
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty() && !l.starts_with("note: "))
        .unwrap_or("");
    if said.starts_with("memory allocation of") {
        return format!("the renderer needed more than its {mib} MiB ({said})");
    }
    match status.signal() {
        Some(libc::SIGXCPU) | Some(libc::SIGKILL) => {
            format!("the renderer used more than {CPU_SECONDS} s of CPU (or was killed)")
        }
        // An allocation refused in C code, or a crash.
        Some(sig) => format!("the renderer died of signal {sig} (memory bound {mib} MiB): {said}"),
        None => format!("the renderer failed ({status}): {said}"),
    }
}

enum Line {
    Page(u32, u32, u64),
    Done(bool, bool),
    Unsupported(String),
}

fn parse(line: &str) -> Option<Line> {
    let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
    let mut nums = rest.split(' ').map(str::parse::<u64>);
    let mut next = || nums.next()?.ok();
    Some(match word {
        "page" => Line::Page(
            u32::try_from(next()?).ok()?,
            u32::try_from(next()?).ok()?,
            next()?,
        ),
        "done" => Line::Done(next()? == 1, next()? == 1),
        "unsupported" => Line::Unsupported(rest.to_string()),
        _ => return None,
    })
}

/// The child's bounds, set between fork and exec (so they hold from its first instruction):
/// data (private writable memory: heap and anonymous mappings) at `memory`; address space a
/// little over it, for kernels whose data bound leaves out mappings; CPU time; no core file (an
/// abort at the bound would dump gigabytes); killed when the thread that started it ends.
fn limit(cmd: &mut Command, memory: u64) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id() as libc::pid_t;
    let set = move |resource, soft: u64, hard: u64| {
        let lim = libc::rlimit {
            rlim_cur: soft as libc::rlim_t,
            rlim_max: hard as libc::rlim_t,
        };
        // SAFETY: setrlimit is async-signal-safe and reads only `lim`.
        if unsafe { libc::setrlimit(resource, &lim) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    };
    // SAFETY: only async-signal-safe calls (setrlimit, prctl, getppid) between fork and exec,
    // no allocation.
    unsafe {
        cmd.pre_exec(move || {
            set(libc::RLIMIT_DATA, memory, memory)?;
            let space = memory + (1 << 30);
            set(libc::RLIMIT_AS, space, space)?;
            set(libc::RLIMIT_CPU, CPU_SECONDS, CPU_SECONDS + 5)?;
            set(libc::RLIMIT_CORE, 0, 0)?;
            #[cfg(target_os = "linux")]
            {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                // The parent gone before the prctl: nobody would kill this child.
                if libc::getppid() != parent {
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
            }
            let _ = parent;
            Ok(())
        });
    }
}

/// `vaultfs render-preview KIND DIR`: the child's side (see the module's note). Exits 0 when it
/// said how the job ended, whatever that was.
pub fn child_main(kind: &str, dir: &Path) -> ExitCode {
    if kind == PDF_TEXT {
        return text_child(dir);
    }
    let Some(kind) = PreviewKind::parse(kind) else {
        eprintln!("render-preview: unknown kind {kind:?}");
        return ExitCode::from(2);
    };
    let cap = match kind {
        PreviewKind::Text => preview::TEXT_MAX_BYTES as u64,
        _ => MAX_INPUT,
    };
    let mut data = Vec::new();
    if let Err(e) = std::io::stdin().lock().take(cap).read_to_end(&mut data) {
        eprintln!("render-preview: reading the input: {e}");
        return ExitCode::from(2);
    }
    let limits = Limits {
        deadline: Some(Instant::now() + JOB_TIME),
        ..Limits::default()
    };
    let mut out = std::io::stdout().lock();
    let mut n = 0;
    let mut write_page = |page: preview::Page| -> Result<(), String> {
        n += 1;
        write_synced(&dir.join(page_file(n)), &page.png)
            .map_err(|e| format!("writing a page: {e}"))?;
        writeln!(
            out,
            "page {} {} {}",
            page.width,
            page.height,
            page.png.len()
        )
        .and_then(|()| out.flush())
        .map_err(|e| format!("telling a page: {e}"))
    };
    let line = match preview::render(kind, &data, &limits, &mut write_page) {
        Ok(rendered) => {
            let own_pdf = match rendered.pdf {
                DocumentPdf::Made(pdf) => {
                    if let Err(e) = write_synced(&dir.join("document.pdf"), &pdf) {
                        eprintln!("render-preview: writing the PDF: {e}");
                        return ExitCode::from(2);
                    }
                    true
                }
                DocumentPdf::Original => false,
            };
            format!(
                "done {} {}",
                u8::from(own_pdf),
                u8::from(rendered.truncated)
            )
        }
        Err(why) => format!("unsupported {}", why.0.replace('\n', " ")),
    };
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
        return ExitCode::from(2);
    }
    ExitCode::SUCCESS
}

/// Writes a file the child made and syncs it, so a page the parent is told of is on disk.
fn write_synced(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::File::create(path)?;
    f.write_all(data)?;
    f.sync_all()
}

/// The child's side of [`PDF_TEXT`].
fn text_child(dir: &Path) -> ExitCode {
    let mut data = Vec::new();
    if let Err(e) = std::io::stdin()
        .lock()
        .take(MAX_INPUT)
        .read_to_end(&mut data)
    {
        eprintln!("render-preview: reading the input: {e}");
        return ExitCode::from(2);
    }
    let limits = Limits {
        deadline: Some(Instant::now() + JOB_TIME),
        ..Limits::default()
    };
    let line = match preview::extract_text(PreviewKind::Pdf, &data, &limits) {
        Ok(text) => match std::fs::write(dir.join(TEXT_FILE), text) {
            Ok(()) => "done 0 0".to_string(),
            Err(e) => {
                eprintln!("render-preview: writing the text: {e}");
                return ExitCode::from(2);
            }
        },
        Err(why) => format!("unsupported {}", why.0.replace('\n', " ")),
    };
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
        return ExitCode::from(2);
    }
    ExitCode::SUCCESS
}
