"""The page of the main comparison: the results table, ratios, targets, fsx, the machine and
how it was measured, a chart (gnuplot), written to --out (docs/benchmarks.md by default), and
the raw results as JSON (--report-from rewrites the page from them)."""

import json
import os
import re
import sys
import tempfile
import time

from .contenders import NullFs
from .figures import CHART_LABELS, METRICS, View
from .targets import EARLIER, ISSUE21, TARGETS, target_row
from .util import (FSX_SEED, MIB, ROOT, T_START, VAULT_ROOT, commas, cpu_and_memory, human, log,
                   run, write_kept)


def machine_info(b):
    """Lines describing the machine and the versions, and the disk."""
    cpu, mem = cpu_and_memory()
    df = run(["df", "-PT", b.work]).stdout.splitlines()[1].split()
    disk = getattr(b, "loop_desc", None) or "%s (%s) on %s, %s free" % (
        b.work, df[1], df[0], human(int(df[4]) * 1024))
    githash = run(["git", "-C", ROOT, "rev-parse", "--short=12", "HEAD"],
                  check=False).stdout.strip()
    dirty = run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no", "--", "src",
                 "Cargo.toml", "Cargo.lock"], check=False).stdout.strip()
    vver = run([b.bin, "--version"], check=False).stdout.strip()
    rver = run(["rclone", "--version"], check=False).stdout.splitlines()[0]
    fver = run(["fio", "--version"], check=False).stdout.strip()
    gver = run(["git", "--version"], check=False).stdout.strip()
    gpver = run(["gnuplot", "--version"], check=False).stdout.strip()
    fuse = run(["fusermount3", "--version"], check=False)
    fuse = (fuse.stdout + fuse.stderr).strip()
    osname = run(["sh", "-c", ". /etc/os-release && echo $PRETTY_NAME"],
                 check=False).stdout.strip()
    nullfs = []
    if getattr(b, "nullfs_bin", None):
        fuser = "?"
        try:
            with open(os.path.join(ROOT, "Cargo.lock")) as f:
                m = re.search(r'name = "fuser"\nversion = "([^"]+)"', f.read())
                fuser = m.group(1) if m else "?"
        except OSError:
            pass
        nullfs = ["null FUSE: `examples/nullfs.rs` of the same tree (fuser %s, as vaultfs), %d "
                  "FUSE threads, release build" % (fuser, NullFs.THREADS)]
    return disk, [
        "%d CPUs (`nproc`), %s, %s RAM; %s, kernel %s (%s)" % (
            os.cpu_count(), cpu, human(mem), osname, os.uname().release, os.uname().machine),
        "Scratch file system: %s" % disk,
        "vaultfs %s, git `%s`%s, release build (`cargo build --release --locked`)" % (
            vver.split()[-1] if vver else "?", githash or "?",
            " with uncommitted changes in src/" if dirty else ""),
        "%s (Debian package); %s; %s; %s; %s; Python %s" % (
            rver, fver, gver, gpver, fuse, sys.version.split()[0]),
    ] + nullfs


def results(b):
    """Everything the page is made of, as JSON-able data (see --report-from)."""
    a = b.a
    nf, nb, tsz, (gn, gb) = b.info["repo"]
    disk, machine = machine_info(b)
    return {
        "version": 2,
        "command": " ".join(["scripts/bench"] + sys.argv[1:]),
        "started": T_START, "elapsed": b.elapsed,
        "args": {k: getattr(a, k) for k in ("quick", "runs", "size", "dd_size", "creates",
                                            "nfiles", "rand_runtime", "seq_runtime",
                                            "stored_cap", "fsx_ops", "loop")},
        "contenders": [[c.key, c.label] for c in b.contenders],
        # The metrics of the contenders that take part in some only (the others: "n/a"), and
        # those whose "until stored" is their "until close" (see STORED_AS).
        "takes_part": {c.key: sorted(c.metrics) for c in b.contenders if c.metrics is not None},
        "stored_is_close": [c.key for c in b.contenders if c.stored_is_close],
        "res": {"%s|%s" % k: v for k, v in b.res.items()},
        "capped": {"%s|%s" % k: sorted(v) for k, v in b.capped.items()},
        "failed": {"%s|%s" % k: v for k, v in b.failed.items()},
        "fsx": {k[4:]: v for k, v in b.info.items() if k.startswith("fsx_")},
        "repo": {"files": nf, "bytes": nb, "tar": tsz, "git_files": gn, "git_bytes": gb,
                 "clone_files": b.clone_files},
        "disk": disk, "machine": machine,
        "load0": b.load0, "load1": b.load1, "loads": b.loads,
    }


def page(R, png_name):
    v = View(R)
    a, keys, labels = v.a, v.keys, v.labels
    rp = R["repo"]
    dd_size = getattr(a, "dd_size", 512 * MIB)
    subst = dict(size=human(a.size), creates=commas(a.creates), nfiles=commas(a.nfiles),
                 repo="%s-file repository" % commas(rp["files"]), dd=human(dd_size),
                 ddcount=dd_size // MIB)
    L = []
    w = L.append
    w("# Benchmarks")
    w("")
    w("vaultfs against the native disk and against rclone, side by side: same machine, same "
      "disk, same files, one run of `%s` (%s; %d run%s per contender, interleaved; %d "
      "minute%s in all). Figures are medians of the runs with the minimum and maximum in "
      "brackets; ratios are ratios of medians. The machine is shared with engineers who "
      "compile: see the load averages below." % (
          R["command"], time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(R["started"])),
          a.runs, "s" if a.runs > 1 else "", max(1, round(R["elapsed"] / 60)),
          "s" if round(R["elapsed"] / 60) > 1 else ""))
    w("")
    w("Contenders: **native** (a plain directory: the physical limit), **vaultfs local** "
      "(`vaultfs mount` on the built-in store), **vaultfs remote** (`vaultfs mount --server` on "
      "`vaultfs serve` over loopback), **rclone local** (`rclone mount` of a plain directory) "
      "and **rclone webdav** (`rclone mount :webdav:` on `rclone serve webdav` over loopback), "
      "both rclone mounts with `--vfs-cache-mode writes`.%s" % (
          " **null FUSE (ceiling)** is `examples/nullfs.rs`, a FUSE file system that keeps "
          "names and sizes and drops the bytes, mounted like vaultfs: what the kernel and the "
          "FUSE channel cost alone, the ceiling of any FUSE file system on this machine." if
          "null" in keys else ""))
    w("")
    w("## Results")
    w("")
    w("| Workload | " + " | ".join(labels[k] for k in keys) + " |")
    w("|---|" + "---:|" * len(keys))
    for m, label, unit, hb in METRICS:
        if not any((k, m) in v.res or (k, m) in v.failed for k in keys):
            continue
        w("| %s (%s, %s is better) | %s |" % (label.format(**subst), unit,
                                              "higher" if hb else "lower",
                                              " | ".join(v.cell(k, m) for k in keys)))
    w("")
    if "null" in keys:
        w("The null file system takes part only in the writes that make sense for a file system "
          "that forgets the bytes, and everything else when unmounted: sequential write until "
          "close, dd, create until last close, untar until tar exits; *n/a* elsewhere. It has "
          "nothing to store, so its *until stored* is its *until close*: no figure is reported "
          "for it in the *until stored* rows (n/a), and where a figure *until stored* is "
          "compared with it (*Ratios*, *Targets*) it is compared with its figure *until "
          "close*. Its dd figure is until dd exits (its fsync returns at once).")
        w("")
    notes = []
    for (c, m), whys in sorted(v.failed.items()):
        notes.append("- %s, %s: %s." % (labels[c], CHART_LABELS[m], whys[0]))
    if notes:
        w("Failures:")
        w("")
        L.extend(notes)
        if any(c.startswith("rclone") and m.startswith("clone") for c, m in v.failed):
            w("  git's lock files (`config.lock` written, then renamed over `config`) trip "
              "rclone's VFS; a known rclone limitation "
              "([rclone#5853](https://github.com/rclone/rclone/issues/5853)).")
        w("")
    if v.capped:
        w("Capped: a wait for *stored* longer than %d s is cut there (the figure is then a "
          "bound: ≤ for a rate, ≥ for a time) and the mount is reset (rclone: stopped, its "
          "upload queue dropped with its cache dir, mounted again), so that one slow "
          "contender cannot take the whole time budget." % a.stored_cap)
        w("")
    w("## Ratios")
    w("")
    w("Speed ratios (above 1: the first is faster; for times, the second's time over the "
      "first's).")
    w("")
    pairs = [(c, "native") for c in keys if c != "native"] + \
        [(c, r) for c, r in (("vaultfs-local", "rclone-local"),
                             ("vaultfs-remote", "rclone-webdav"),
                             ("vaultfs-remote", "vaultfs-local"),
                             ("vaultfs-local", "null")) if c in keys and r in keys]
    w("| Workload | " + " | ".join("%s / %s" % (labels[c], labels[r]) for c, r in pairs) + " |")
    w("|---|" + "---:|" * len(pairs))
    for m, label, unit, hb in METRICS:
        if m.startswith("rss") or not any((k, m) in v.res for k in keys):
            continue
        w("| %s | %s |" % (CHART_LABELS[m], " | ".join(v.ratio_cell(m, c, r)
                                                      for c, r in pairs)))
    w("")
    w("![Speed relative to native, per workload and contender (log scale)](%s)" % png_name)
    w("")
    w("## Targets")
    w("")
    w("For vaultfs local unless the workload names another contender; ratios as in *Ratios*, "
      "with the figures compared in brackets.")
    w("")
    missed_any = False
    for group in (ISSUE21, EARLIER):
        rows = [r for r in (target_row(v, t) for t in TARGETS if t.group == group) if r]
        if not rows:
            continue
        w("### " + group)
        w("")
        w("| Target | Workload | Against | Needed | Measured | Met |")
        w("|---|---|---|---:|---:|---|")
        for r in rows:
            w("| %(why)s | %(workload)s | %(against)s | %(needed)s | %(measured)s | %(met)s |" % r)
        w("")
        missed = [r["miss"] for r in rows if r["ok"] is False]
        if missed:
            missed_any = True
            w("Missed in this run, by how much:")
            w("")
            L.extend(missed)
        else:
            w("None missed in this run.")
        w("")
    if missed_any:
        w("Where the time goes: see *Profile* below.")
        w("")
    if R["fsx"]:
        w("## fsx")
        w("")
        for key in ("native", "vaultfs-local"):
            f = R["fsx"].get(key, "absent")
            if f == "absent":
                continue
            if f is None:
                w("- %s: fsx is not installed (`cargo install --locked fsx`): skipped." %
                  labels[key])
                continue
            ok, t, tail = f
            w("- %s: `fsx -N %d -S %d -f tests/fsx/fsx.toml` (the configuration of "
              "tests/suites.rs, mmap included): %s operations **%s** in %.1f s (%s "
              "operations/s)." % (labels[key], a.fsx_ops, FSX_SEED, commas(a.fsx_ops),
                                   "passed" if ok else "FAILED", t, commas(int(a.fsx_ops / t))))
            if not ok:
                w("")
                w("  ```")
                L.extend("  " + x for x in tail)
                w("  ```")
        w("")
    w("## Machine and versions")
    w("")
    for line in R["machine"]:
        w("- " + line)
    w("- Load average (1, 5, 15 min): %s before the run, %s after; 1-minute load at the start "
      "of each contender's run: %s." % (R["load0"], R["load1"],
                                          ", ".join(x.split()[0] for x in R["loads"])))
    w("")
    w("## How it was measured")
    w("")
    loop = ""
    if a.loop:
        loop = (" It is a fresh ext4 (default options) in a loop device over an image file on "
                "the machine's disk: the disk's own file system is mounted with `discard`, "
                "which makes every unlink of a non-empty file cost ~3 ms here (2,000 files of "
                "4 KiB take 6.7 s to delete; 0.03 s on the loop file system), which would "
                "have made the clean-up alone exceed the time budget; `fstrim` after each "
                "contender's run (not timed) gives freed blocks back to the image file. "
                "`--no-loop` measures the directory's own file system instead.")
    T = []
    T.append("Every contender lives on the same scratch file system (native folder, stores, "
             "caches, rclone's backing folders)." + loop + " Each run of each contender "
             "starts its daemons afresh (mount, and server for the remote ones) and stops "
             "them at its end; the order of the contenders rotates from run to run.")
    T.append("Mount options are the defaults except: vaultfs `--root \"%s\"` and private "
             "cache, config and runtime dirs; rclone `--vfs-cache-mode writes "
             "--vfs-write-back 0s` (upload as soon as the last handle is closed instead of "
             "5 s later) and `--rc` on loopback (to read its upload queue). Defaults that "
             "matter: vaultfs attribute TTL 1 s and listing TTL 10 s; rclone attribute "
             "timeout 1 s and directory cache 5 min." % VAULT_ROOT)
    T.append("**Until stored.** native: `fsync` of the file (`syncfs` for many files). "
             "vaultfs: its upload journal (`journal/log` in its cache dir: an entry is "
             "written when a file starts being staged and ended once the store has its "
             "bytes) has no open entry, and then "
             "the mount's status (what `vaultfs status DIR --json` prints, read from its "
             "control socket) lists no upload, waiting or running; the status is not polled "
             "while journal entries are open, because a status snapshot lists every pending "
             "upload and polling it 50 times a second with thousands pending slows the "
             "daemon down (see *Profile*). rclone: `vfs/stats` (rc) shows no upload in "
             "progress or queued, and then the backing folder holds every file, with all the "
             "bytes where they are known. Polled every 20 ms; the moment is the first poll "
             "where it holds, confirmed by two more. Note that vaultfs's *stored* is durable "
             "(it fsyncs each blob, its folder and the database commit) while rclone's local "
             "backend does not fsync (see *Profile*).")
    T.append("**Cold.** `syncfs` of the scratch file system, then `echo 3 > "
             "/proc/sys/vm/drop_caches`; for a mount, also unmount, delete its read cache "
             "(vaultfs: the `cache` folder of its cache dir; rclone: its whole cache dir, "
             "every upload being done by then) and mount again. Servers keep running, but "
             "their store's pages are dropped too. **Warm**: right after a full read, same "
             "mount.")
    T.append("**Sequential write.** `fio --rw=write --bs=1M --ioengine=psync --direct=0 "
             "--fallocate=none --size=%dM --runtime=%d` on a new file; *until close* is fio's "
             "bandwidth, *until stored* is the same bytes over fio's job time plus the time "
             "from fio's exit to stored. **Reads** on that file: time to first byte (`open` + "
             "4 KiB `pread` at offset 0, cold, from the harness process), fio `--rw=read "
             "--bs=1M` cold then warm, `--rw=randread --bs=4k --time_based --runtime=%d` warm "
             "then cold; psync, one job, `--invalidate=0`. The %s x %d contenders x %d "
             "run%s fit in the time because fio's runs are bounded (`--runtime`) and each "
             "random-read phase lasts %d s." % (
                 a.size // MIB, a.seq_runtime, a.rand_runtime, human(a.size),
                 len([k for k in keys if v.does(k, "seq_r_cold")]), a.runs,
                 "s" if a.runs > 1 else "", a.rand_runtime))
    if any(m.startswith("dd") for _, m in v.res):
        T.append("**dd.** `dd if=SRC of=FILE bs=1M count=%d conv=fsync` on a new file, "
                 "SRC being %s of `/dev/urandom` bytes made once on the scratch file "
                 "system (random, so that no contender can take a shortcut on zeros) and "
                 "read into the page cache just before (not timed). MiB/s: the size over the "
                 "time until dd exits, and until stored. With `conv=fsync` dd fsyncs the file "
                 "before it exits: native's and vaultfs's fsync return once the bytes are "
                 "durable (stored), so for them both figures are the same moment; rclone's "
                 "fsync does not upload (its upload starts after the close)." % (
                     dd_size // MIB, human(dd_size)))
    if "null" in keys:
        T.append("**null FUSE (ceiling).** `examples/nullfs.rs`, built from the same tree: "
                 "a FUSE file system (fuser, as vaultfs) that keeps names and sizes, drops "
                 "every byte written (reads would return zeros) and forgets everything when "
                 "unmounted; mounted with vaultfs's mount options (`default_permissions`, "
                 "`nodev`, `nosuid`, `auto_unmount`, root and owner) and vaultfs's %d FUSE "
                 "threads, started afresh for each run like the others. It takes part in the "
                 "sequential write until close, dd until it exits, create until last close "
                 "and untar until tar exits: nothing else makes sense for it. Its *until "
                 "stored* is its *until close* (nothing to store): not reported in the *until "
                 "stored* rows, and used in their place where another contender's *until "
                 "stored* is compared with it." % NullFs.THREADS)
    T.append("**Create.** One Python process creates %s files of 4 KiB (distinct random "
             "contents): `open(O_CREAT|O_EXCL)`, `write`, `close`; files per second from the "
             "first open to the last close, and to stored." % commas(a.creates))
    T.append("**Untar, git clone.** A repository made by the script: %s files (%s) of "
             "generated source text and some binary files in nested folders, three commits, "
             "packed (`.git`: %s files, %s). `tar -xf` of its %s tarball (working tree "
             "only), and `git clone -q --no-local` (pack transfer, then checkout; git fsyncs "
             "what its defaults say), both from the native disk into the contender; until "
             "the command exits, and until stored." % (
                 commas(rp["files"]), human(rp["bytes"]), commas(rp["git_files"]),
                 human(rp["git_bytes"]), human(rp["tar"])))
    T.append("**Metadata.** A folder of %s empty files (`ls -l`, output checked) and a tree "
             "of %s empty files in 10 x 10 folders (lstat of every file and folder from "
             "`os.walk` in the harness; `find TREE -type f`), made once per contender "
             "straight into its store (vaultfs: through the server's API, `create_file` with "
             "1,000 names a request; rclone: in its backing folder), so that they are files "
             "already there. Cold: the first run after a restart; warm: the median of the "
             "3 runs that follow." % (commas(a.nfiles), commas(a.nfiles)))
    T.append("**Peak RSS**: VmHWM of each daemon, read just before it is stopped; the "
             "largest over the restarts of a run.")
    for t in T:
        w("- " + t)
    w("")
    return "\n".join(L) + "\n", v


def write_chart(v, png, tmp):
    keys = [k for k in v.keys if k != "native"]
    dat = os.path.join(tmp, "chart.dat")
    rows = []
    for m, _, _, _ in METRICS:
        if m.startswith("rss") or not any((k, m) in v.res for k in keys):
            continue
        vals = [v.speed(m, k, "native") for k in keys]
        rows.append("\"%s\"\t%s" % (CHART_LABELS[m], "\t".join(
            "%.4g" % x if x else "?" for x in vals)))
    with open(dat, "w") as f:
        f.write("workload\t%s\n" % "\t".join('"%s"' % v.labels[k] for k in keys))
        f.write("\n".join(rows) + "\n")
    colors = {"null": "#555555", "vaultfs-local": "#1f5fa8", "vaultfs-remote": "#7fb2e5",
              "rclone-local": "#c0392b", "rclone-webdav": "#f1948a"}
    gp = os.path.join(tmp, "chart.gp")
    plots = ", ".join("'%s' using %d:xtic(1) title columnheader(%d) lc rgb '%s'" % (
        dat, i + 2, i + 2, colors.get(k, "gray")) for i, k in enumerate(keys))
    with open(gp, "w") as f:
        f.write("""set terminal pngcairo size 1500,650 font "DejaVu Sans,11"
set output '%s'
set title "Speed relative to native (1 = native, higher is better, log scale), %s"
set datafile separator "\\t"
set datafile missing "?"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.9 border rgb "#333333"
set boxwidth 0.9
set logscale y 10
set format y "%%g"
set grid ytics
set xtics rotate by -35 left nomirror
set key top right
set ylabel "speed / native speed"
set bmargin 7
plot %s, 1 with lines dt 2 lc rgb "black" lw 1.5 notitle
""" % (png, time.strftime("%Y-%m-%d", time.gmtime(v.R["started"])), plots))
    run(["gnuplot", gp])


def publish(R, out):
    out = os.path.abspath(out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    png = os.path.splitext(out)[0] + ".png"
    text, v = page(R, os.path.basename(png))
    with tempfile.TemporaryDirectory() as tmp:
        write_chart(v, png, tmp)
    write_kept(out, text)
    print(text)
    log("wrote %s and %s" % (out, png))


def report(b):
    R = results(b)
    js = os.path.join(tempfile.gettempdir(), "vaultfs-bench-%s.json" %
                      time.strftime("%Y%m%d-%H%M%S", time.localtime(T_START)))
    with open(js, "w") as f:
        json.dump(R, f, indent=1)
    log("raw results in %s (scripts/bench --report-from FILE rewrites the page from them)" % js)
    publish(R, b.a.out)
