"""vaultfs's one benchmark harness: against the native disk, the null FUSE file system and rclone,
side by side, on the same files, in one run; and the modes below, on the same setup.

  scripts/bench [--quick] [--runs N] [--size SIZE] [--dir DIR] [--out FILE.md] [--only NAMES]
                [--stored-cap S] [--fsx-ops N | --no-fsx] [--no-loop] [--keep]
  scripts/bench --report-from RESULTS.json [--out FILE.md]
  scripts/bench mount  [the options above]          native, vaultfs local and vaultfs remote
  scripts/bench reads  [--runs N] [--size SIZE] [--files N]
  scripts/bench server [--size SIZE] [--files N] [--clients C] [--client-files F]
                       [--client-size B] [--runs N]
  scripts/bench shared [--servers 1,2,4] [--engines sqlite,pg] [--s3 s3s-fs|moto]
                       [--accounts 1,2] [--serve-arg ARG]... [the options of server]
  scripts/bench follow [--rounds N] [--link RTT] [--link-mbit M]
  scripts/bench link RTTS [--link-mbit M] [--runs N]   (also: scripts/bench --link RTTS)
  scripts/bench search [N]                             (also: scripts/bench --search [N])
  scripts/bench scale  [--counts N,M] [--files N] [--runs N]
  scripts/bench dav    [--files N] [--size SIZE] [--runs N]
Every mode takes --quick (its smallest setting), --dir, --out, --no-loop and --keep.

Every mode has one setup: the files live in a fresh ext4 on a loop device over an image file in
--dir (same disk): this machine's / is mounted with `discard`, where each unlink of a non-empty
file costs ~3 ms, which would make removing the run's ~200,000 files alone take longer than the
run; fstrim after each contender's run keeps the sparse image small (--no-loop: measure --dir's
own file system). A private HOME and XDG dirs; the page cache dropped (syncfs of the scratch
file system, then drop_caches) where a figure is cold; vaultfs servers started with a user of
account Local signed in through the pin page (the credentials file `vaultfs login` writes).
Every mount, daemon, loop device and scratch file it made is removed on exit, Ctrl-C included
(unless --keep). Needs root (FUSE mounts, dropping the page cache, the loop device), /dev/fuse
and: apt-get install -y fuse3 fio rclone gnuplot-nox git curl; cargo install --locked fsx.
Each mode writes one Markdown page (the command, its date, tables of medians with min-max,
ratios, the targets of the issues, the machine, how it was measured; whatever is below the
"keeps" marker line is written by hand and kept on rewrite), and its raw results to
$TMPDIR/vaultfs-bench-*.json.

The comparison (no mode). Contenders:
  native          a plain directory: the physical limit;
  null            "null FUSE (ceiling)": examples/nullfs.rs, a FUSE file system that keeps names
                  and sizes and drops every byte, mounted with vaultfs's mount options and its 4
                  FUSE threads: the machine's ceiling for a FUSE file system. It takes part only
                  in the writes: sequential write until close, dd, create until last close,
                  untar until tar exits ("n/a" elsewhere; its "until stored" is its "until
                  close": see the page's notes);
  vaultfs local   `vaultfs mount` on the built-in store;
  vaultfs remote  `vaultfs mount --server` on `vaultfs serve` over loopback;
  rclone local    `rclone mount` of a plain directory, --vfs-cache-mode writes;
  rclone webdav   `rclone mount :webdav:` on `rclone serve webdav` over loopback, same mode.
Mount options are the defaults except: vaultfs --root "Local/My First Vault" and private
cache/config/runtime dirs; rclone --vfs-cache-mode writes --vfs-write-back 0s (upload right after
the last close instead of 5 s later) and --rc on loopback (to read its upload queue).

Workloads, every run, every contender (null: the writes named above only; the runs interleave
the contenders, rotating the order; every run starts the contender's daemons afresh):
  - sequential write of SIZE (fio, bs=1M, psync, buffered): until close, and until stored
    (native: fsync; vaultfs: its status lists no upload and no upload journal entry is open; rclone: rc
    vfs/stats shows no upload and the backing folder holds the bytes);
  - `dd if=SRC of=FILE bs=1M count=512 conv=fsync` (256 with --quick), SRC a file of
    /dev/urandom bytes made once in the scratch dir (and read into the page cache before each
    dd, untimed): until dd exits (for native and vaultfs that is until stored: their fsync
    returns once the bytes are durable), and until stored (rclone uploads after the close);
  - time to first byte (open + 4 KiB read, cold), sequential read cold and warm (fio), random
    4 KiB reads warm and cold (fio, time-bounded). Cold: page cache dropped, and a mount is
    restarted with its read cache deleted (servers keep running);
  - creating 5,000 files of 4 KiB from one process, untar of a mid-size repository tree and
    `git clone --no-local` of that repository (made by this script, no network): until done,
    and until stored (waits capped at --stored-cap seconds, then the figure is a bound);
  - `ls -l` of a folder of 10,000 files, `find -type f` and lstat of every file of a tree of
    10,000 files: cold and warm (median of 3);
  - peak RSS (VmHWM) of each daemon (mount, server);
then once: fsx (--fsx-ops operations, the configuration of tests/suites.rs) on the vaultfs local
mount. Results: medians of the runs with min-max, ratios to native, to rclone and to the null
file system, the targets of the issues (issue 21's first), a PNG bar chart (gnuplot), the machine and the versions, written to
docs/benchmarks.md and docs/benchmarks.png.

Options of the comparison:
  --quick          ~2 minutes: SIZE 256M, 1 run, a 256 MiB dd, 1,000 created files, fixtures
                   of 2,000 files,
                   a 400-file repository, 2 s random reads, 20 s cap, 5,000 fsx operations;
                   writes $TMPDIR/vaultfs-bench-quick.md (+ .png) unless --out is given
  --runs N         runs per contender [3]
  --size SIZE      sequential file size, K/M/G suffixes (binary) [1G]
  --dir DIR        where the scratch dir goes: the disk measured [$TMPDIR or /tmp]
  --out FILE       the page to write; the chart goes beside it (.png) [docs/benchmarks.md]
  --only NAMES     comma-separated subset of null,vaultfs-local,vaultfs-remote,rclone-local,
                   rclone-webdav [all] (native is always there: the ratios need it)
  --stored-cap S   the longest wait for "stored" of the small-file workloads [45]
  --fsx-ops N      fsx operations [50000]; --no-fsx skips fsx
  --no-loop        no loop file system: measure --dir's own file system
  --keep           keep the scratch dir (stores, caches, logs) for inspection
  --report-from F  only rewrite the page (and chart) from the raw results F of a run

Modes (each page: docs/benchmarks-MODE.md, or $TMPDIR/vaultfs-bench-MODE-quick.md with --quick):
  mount            the comparison's workloads on native, vaultfs local and vaultfs remote only
                   (--only vaultfs-local,vaultfs-remote): the mount's writes, reads, metadata
                   and RSS against the disk under it, with the mount issue's targets
  reads            the read path: native, the null file system (reads zeros of the same sizes),
                   vaultfs local with passthrough (the default) and --no-passthrough, and an
                   earlier build (VAULTFS_BEFORE=BINARY) on the same files: sequential read of
                   SIZE [1G] cold and warm (fio, as the comparison), `grep -r` over --files [5000]
                   small text files (2-6 KiB) warm, `stat` of each by name once the kernel's 1 s
                   TTL ran out (one LOOKUP each), the daemon's peak RSS; --runs [3] interleaved
  server           `vaultfs serve` on the built-in store against the raw disk under it: the
                   upload of SIZE [1G] (three steps, step 3 `curl -T`) against `dd conv=fsync`,
                   its download (curl) cold and warm against reads, the md5 of the bytes back,
                   the server's peak RSS, creating and listing --files [10000] names
                   (`GET ?children=1`, median of 5); the same upload, downloads and 2,000 stats
                   through the client (`RemoteBackend`, examples/remote_bench) beside curl's; and
                   uploads per second of --clients [16] clients each uploading --client-files
                   [40] new files of --client-size [64K] (examples/upload_clients)
  shared           the server's transfers, listing and concurrent uploads on each store engine
                   (--engines): `sqlite` (the built-in store, one machine) and `pg` (PostgreSQL
                   started here, as user nobody, durable defaults, and an S3-compatible server
                   started here: --s3 s3s-fs (Rust, files on the scratch disk: `cargo install
                   --locked s3s-fs@0.14.1 --features binary`; the default when installed) or
                   moto (the one .ci/run installs), or --database URL / --blobs s3://B/P
                   --s3-endpoint URL of your own); on `pg` the uploads also against 2 and 4
                   servers of the store (--servers [1,2,4]); SIZE [256M]; --serve-arg ARG is
                   passed to every server; with issue 34's targets. --accounts [1]: the
                   uploads also with the same clients spread over N users of accounts of their
                   own, side by side (issue 46, item 4: accounts do not wait for each other);
                   on `pg` PostgreSQL's lock waits are sampled meanwhile (pg_locks, every
                   100 ms) and sorted by whose lock a waiting writer waits for
  follow           how soon one mount sees another's changes (issue 32): two mounts of one
                   account on `vaultfs serve` (and of VAULTFS_BEFORE's build beside), maybe
                   through a link proxy of --link RTT ms; --rounds [10] of a new file, a change,
                   a rename, a delete on A, each timed until B shows it (polled every 5 ms,
                   capped at 15 s)
  link RTTS        over a link (issue 33), at each round trip in ms (e.g. 20,50,150):
                   vaultfs remote and rclone webdav each mounted through its own link proxy
                   (scripts/linkproxy.py) in front of its server; copy 200 documents of 4 KiB
                   in until stored, cold `cat` of them, cold `ls -l` of 1,000 files, cold read
                   of 32 MiB, copy of 16 MiB until stored; writes docs/benchmarks-link.md
                   (--link-mbit M: the link's bandwidth each way, Mbit/s [100])
  search [N]       full-text search (issue 35) of a vault of N [10000] documents (text,
                   Markdown, code, CSV, ~10% PDFs with a text layer; words from a fixed seed with
                   Zipf-like frequencies) uploaded to a fresh built-in store through `vaultfs
                   serve`, and 20 of a second account: the indexing time, then a rare word, a
                   common word, two words and a prefix `stem*`, each through the search route
                   (median of 20), `vaultfs search --server` (5), `ls` of `.search/QUERY/` in a
                   mount of the server (5), the web page (5) and, server stopped, `vaultfs search
                   --data-dir` (5); checks the same files come back every way, as many as
                   written, and none of the other account's; writes docs/benchmarks-search.md
  scale            many files (issue 46): --counts [10000,100000] (--quick: 2000,10000) files of
                   4 KiB in one folder and in 1,000 folders, on native, the null file system
                   (create, ls, find, rm only), vaultfs local and vaultfs remote, each started
                   afresh at each count: create until last close and until stored (capped at 10 ms
                   a file, at least 290 s), `ls -l` (of the tree `ls -lR`) cold and warm,
                   `find -type f` cold, `tar -cf -` cold, `rsync -a` out to the native disk cold,
                   `rm -rf` (capped at 3 ms a file, at least 30 s: today's deletes over the server
                   would take an hour); time per file at each count, peak RSS of the daemons, peak
                   open descriptors of the mount daemon (/proc/PID/fd counted every 50 ms during
                   each workload); then on both vaultfs mounts under `ulimit -n 1024` (prlimit,
                   soft and hard, for the mount daemon) --files [50000] (--quick: 10000) files in
                   1,000 folders written, `vaultfs sync`, `tar -cf -`, `rsync -a` out,
                   `vaultfs status` asked every second throughout, unmount (timed), remount, every
                   file read back and compared; --runs [1] runs interleaved, their medians; with
                   issue 46's targets; writes docs/benchmarks-scale.md (--quick: about 9 minutes
                   on 2 shared cores)
  dav              WebDAV through rclone's webdav client (issue 50): `vaultfs serve` (/dav/, an
                   app password) against `rclone serve webdav` of a plain folder, both on
                   loopback: --files [200] documents of 2-60 KiB (text, Markdown, PDFs, images)
                   PUT (`rclone copy` in) and GET (out, cold, every byte compared), and a SIZE
                   [256M] file of random bytes PUT and GET (size and md5); --runs [3]
                   interleaved; with issue 50's targets; writes docs/benchmarks-dav.md
Environment: VAULTFS_BIN (use this binary instead of `cargo build --release --locked`),
NULLFS_BIN, REMOTE_BENCH_BIN, UPLOAD_CLIENTS_BIN (likewise for examples/nullfs, remote_bench,
upload_clients), VAULTFS_BEFORE (reads, follow: an earlier build beside), VAULTFS_PG_BIN (the
folder of initdb and postgres), S3S_FS_BIN and VAULTFS_MOTO_SERVER (the S3-compatible servers),
CARGO_TARGET_DIR (honoured by the builds), BENCH_DEBUG=1 (more log lines).
"""

import argparse
import json
import os
import signal
import sys
import tempfile

from .setup import cleanup, on_signal
from .util import MIB, ROOT, Fail, parse_size

MODES = ("mount", "reads", "server", "shared", "follow", "link", "search", "scale", "dav")
KNOWN = ["null", "vaultfs-local", "vaultfs-remote", "rclone-local", "rclone-webdav"]


def parse_args(argv):
    mode = argv[0] if argv and argv[0] in MODES else None
    if mode:
        argv = argv[1:]
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--runs", type=int)
    p.add_argument("--size", type=parse_size)
    p.add_argument("--dir", default=os.environ.get("TMPDIR") or "/tmp")
    p.add_argument("--out")
    p.add_argument("--only", default=",".join(KNOWN))
    p.add_argument("--fsx-ops", type=int)
    p.add_argument("--stored-cap", type=int)
    p.add_argument("--no-fsx", action="store_true")
    p.add_argument("--keep", action="store_true")
    p.add_argument("--report-from")
    p.add_argument("--no-loop", dest="loop", action="store_false")
    p.add_argument("--link", type=lambda s: [float(x) for x in s.split(",")])
    p.add_argument("--link-mbit", type=float, default=100.0)
    p.add_argument("--search", type=int, nargs="?", const=10000)
    # reads, server, shared, follow
    p.add_argument("--files", type=int)
    p.add_argument("--clients", type=int)
    p.add_argument("--client-files", type=int)
    p.add_argument("--client-size", type=parse_size)
    p.add_argument("--servers", type=lambda s: sorted({int(x) for x in s.split(",")}))
    p.add_argument("--engines", type=lambda s: [x.strip() for x in s.split(",") if x.strip()])
    p.add_argument("--accounts", type=lambda s: sorted({int(x) for x in s.split(",")}))
    p.add_argument("--s3", choices=("s3s-fs", "moto"))
    p.add_argument("--database")
    p.add_argument("--blobs")
    p.add_argument("--s3-endpoint")
    p.add_argument("--serve-arg", action="append", default=[])
    p.add_argument("--rounds", type=int)
    p.add_argument("--counts", type=lambda s: sorted({int(x) for x in s.split(",")}))
    p.add_argument("-h", "--help", action="store_true")
    if mode in ("link", "search"):
        p.add_argument("arg", nargs="?")
    a = p.parse_args(argv)
    if a.help:
        print(__doc__.strip())
        sys.exit(0)
    if mode == "link":
        if not a.arg:
            p.error("link needs the round trips in ms, e.g. scripts/bench link 20,50,150")
        a.link = [float(x) for x in a.arg.split(",")]
    if mode == "search":
        a.search = int(a.arg) if a.arg else 10000
    a.mode = mode or ("link" if a.link else "search" if a.search else "compare")
    a.size_given, a.runs_given = a.size, a.runs
    q = a.quick
    a.runs = a.runs or (1 if q else 3)
    a.size = a.size or (256 * MIB if q else 1024 * MIB)
    a.size = max(MIB, a.size // MIB * MIB)
    a.dd_size = (256 if q else 512) * MIB
    a.creates = 1000 if q else 5000
    a.nfiles = 2000 if q else 10000
    a.repo_files = 400 if q else 1000
    a.rand_runtime = 2 if q else 3
    a.seq_runtime = 30 if q else 60
    a.stored_cap = a.stored_cap or (20 if q else 45)
    a.fsx_ops = 0 if a.no_fsx else (a.fsx_ops or (5000 if q else 50000))
    default_out = None
    if a.mode == "link":
        from .link import LINK_LS_FILES
        a.size, a.dd_size, a.nfiles = 64 * MIB, 0, LINK_LS_FILES
        default_out = os.path.join(ROOT, "docs", "benchmarks-link.md")
        a.only = a.only if a.only != p.get_default("only") else "vaultfs-remote,rclone-webdav"
    elif a.mode == "search":
        a.size, a.dd_size, a.loop, a.only = MIB, 0, False, "vaultfs-remote"
        default_out = os.path.join(ROOT, "docs", "benchmarks-search.md")
    elif a.mode == "mount":
        a.only = "vaultfs-local,vaultfs-remote"
    elif a.mode != "compare":
        mode_defaults(a)
    if a.mode not in ("compare", "link", "search"):
        default_out = os.path.join(tempfile.gettempdir(), "vaultfs-bench-%s-quick.md" % a.mode) \
            if q else os.path.join(ROOT, "docs", "benchmarks-%s.md" % a.mode)
    if not a.out:
        a.out = default_out or (os.path.join(tempfile.gettempdir(), "vaultfs-bench-quick.md")
                                if q else os.path.join(ROOT, "docs", "benchmarks.md"))
    only = [s.strip() for s in a.only.split(",") if s.strip() and s.strip() != "native"]
    bad = [s for s in only if s not in KNOWN]
    if bad:
        p.error("unknown contender(s): %s" % ", ".join(bad))
    a.only = [k for k in KNOWN if k in only]
    return a


def mode_defaults(a):
    """The sizes of reads, server, shared, follow, scale and dav (smaller with --quick)."""
    q, m = a.quick, a.mode
    given = a.size_given
    if m == "reads":
        a.size = given or (64 * MIB if q else 1024 * MIB)
        a.files = a.files or (500 if q else 5000)
        a.seq_runtime = 30 if q else 60
    elif m in ("server", "shared"):
        a.size = given or (64 * MIB if q else (1024 if m == "server" else 256) * MIB)
        a.files = a.files or (1000 if q else 10000)
        a.clients = a.clients or (4 if q else 16)
        a.client_files = a.client_files or (10 if q else 40)
        a.client_size = a.client_size or 64 * 1024
        a.servers = a.servers or [1, 2, 4]
        a.engines = a.engines or ["sqlite", "pg"]
        a.accounts = a.accounts or [1]
        bad = [e for e in a.engines if e not in ("sqlite", "pg")]
        if bad:
            sys.exit("bench: unknown engine(s) %s (sqlite, pg)" % ", ".join(bad))
        if m == "server":
            a.runs = a.runs_given or 1
    elif m == "follow":
        a.rounds = a.rounds or (2 if q else 10)
        a.size, a.runs = MIB, 1
    elif m == "scale":
        from .scale import FILE_SIZE
        a.counts = a.counts or ([2000, 10000] if q else [10000, 100000])
        a.files = a.files or (10000 if q else 50000)
        # the loop file system's size follows (setup): room, and inodes, for every copy
        a.size, a.runs = max(a.counts + [a.files]) * 4 * FILE_SIZE, a.runs_given or 1
    elif m == "dav":
        a.size = given or 256 * MIB
        a.files = a.files or 200
    a.dd_size = 0


def main():
    a = parse_args(sys.argv[1:])
    if a.report_from:
        from .report import publish
        with open(a.report_from) as f:
            publish(json.load(f), a.out)
        return
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_signal)
    b = mode_class(a.mode)(a)
    rc = 0
    try:
        b.setup()
        b.main()
    except Fail as e:
        print("bench: %s" % e, file=sys.stderr)
        rc = 1
    except KeyboardInterrupt:
        print("bench: interrupted, cleaning up", file=sys.stderr)
        rc = 130
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # finish the clean-up whatever happens
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        cleanup()
    sys.exit(rc)


def mode_class(mode):
    if mode in ("compare", "mount"):
        from .workloads import Bench
        return Bench
    if mode == "link":
        from .link import LinkBench
        return LinkBench
    if mode == "search":
        from .search import Search
        return Search
    if mode == "reads":
        from .reads import ReadsBench
        return ReadsBench
    if mode == "server":
        from .server import ServerBench
        return ServerBench
    if mode == "shared":
        from .shared import SharedBench
        return SharedBench
    if mode == "scale":
        from .scale import ScaleBench
        return ScaleBench
    if mode == "dav":
        from .dav import DavBench
        return DavBench
    from .follow import FollowBench
    return FollowBench
