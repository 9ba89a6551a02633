"""scale: many files (issue 46). --counts files of 4 KiB (10,000 and 100,000; --quick 2,000 and
10,000) in one folder and in a tree of 1,000 folders, on the native disk, the null FUSE file
system (create, ls, find, rm only), `vaultfs mount` on the built-in store and on `vaultfs serve`:
create until stored, `ls -l` cold and warm, `find`, `tar c`, `rsync -a` out, `rm -rf`, each
timed per file; the daemons' peak RSS and the mount daemon's peak open descriptors. Then each
vaultfs mount under `ulimit -n 1024`: --files files in 1,000 folders written, synced, read back
by `tar c` and `rsync -a`, `vaultfs status` asked throughout, unmounted, remounted, read again."""

import json
import os
import shutil
import signal
import statistics
import subprocess
import threading
import time

from .contenders import Native, Vaultfs, does
from .fixtures import create_files
from .pages import Page, met
from .reads import NullReads
from .setup import stop_proc
from .util import Fail, commas, count_tree, human, log, mounted, proc_kib
from .workloads import Bench

FILE_SIZE = 4096
FOLDERS = 1000
LAYOUTS = (("flat", "one folder"), ("tree", "%s folders" % commas(FOLDERS)))
LIMIT = 1024           # the mount daemon's open-files limit (soft and hard) in the limited run
FD_POLL = 0.05         # seconds between two counts of /proc/PID/fd
STORED_CAP = 290       # one wait for "stored" at the most (under contenders.STORED_TIMEOUT)
STORED_CAP_PER_FILE = 0.01  # create until stored is cut after 10 ms a file (at least STORED_CAP)
RM_CAP_PER_FILE = 0.003  # rm -rf cut after 3 ms a file (at least 30 s): 10x the built-in's bound
STATUS_EVERY = 1.0     # seconds between two `vaultfs status` in the limited run
UNMOUNT_WITHIN = 10.0  # the issue's bound, seconds
WORKLOADS = [  # metric, what, cold (a restart of the mount and the page cache dropped first)
    ("create_close", "create, until last close", False),
    ("create_stored", "create, until stored", False),
    ("ls_cold", "`ls -l`, cold (the tree: `ls -lR`)", True),
    ("ls_warm", "`ls -l`, warm (median of 3)", False),
    ("find_cold", "`find -type f`, cold", True),
    ("tar_cold", "`tar -cf -`, cold", True),
    ("rsync_cold", "`rsync -a` out to the native disk, cold", True),
    ("rm", "`rm -rf`, until it exits", False),
]


class NullScale(NullReads):
    """The null file system in the write and metadata workloads; cold: the page cache dropped
    (a restart would forget its files)."""
    metrics = frozenset(("create_close", "ls_cold", "ls_warm", "find_cold", "rm", "rss_mount"))


class ScaleVaultfs(Vaultfs):
    """vaultfs whose mount daemon runs under an open-files limit (soft and hard) when NOFILE is
    set: `ulimit -n NOFILE` for it alone (prlimit execs the daemon: the PID stays its own)."""
    nofile = None

    def mount_cmd(self):
        cmd = super().mount_cmd()
        if self.nofile:
            cmd = ["prlimit", "--nofile=%d:%d" % (self.nofile, self.nofile), "--"] + cmd
        return cmd


class FdPeak:
    """The most descriptors the mount daemon of C held while the block ran, /proc/PID/fd counted
    every FD_POLL s from another thread (the daemon may be restarted meanwhile)."""

    def __init__(self, c):
        self.c, self.peak, self.done = c, 0, threading.Event()
        self.thread = threading.Thread(target=self.poll, daemon=True)

    def poll(self):
        while True:
            p = self.c.proc
            if p is not None:
                try:
                    self.peak = max(self.peak, len(os.listdir("/proc/%d/fd" % p.pid)))
                except OSError:
                    pass
            if self.done.wait(FD_POLL):
                return

    def __enter__(self):
        if self.c.is_mount:
            self.thread.start()
        return self

    def __exit__(self, *_exc):
        self.done.set()
        if self.thread.is_alive():
            self.thread.join()


class StatusPoll(threading.Thread):
    """`vaultfs status DIR --json` every STATUS_EVERY s until halt(): the answers, what failed,
    the slowest answer."""

    def __init__(self, c):
        super().__init__(daemon=True)
        self.c, self.answers, self.failures, self.slowest = c, 0, [], 0.0
        self.done = threading.Event()

    def run(self):
        while not self.done.wait(STATUS_EVERY):
            t0 = time.perf_counter()
            try:
                p = subprocess.run([self.c.bin, "status", self.c.dir, "--json"],
                                   env=self.c.env(), capture_output=True, text=True, timeout=10)
                ok = p.returncode == 0 and isinstance(json.loads(p.stdout), dict)
                why = "exit %d: %s" % (p.returncode, p.stderr.strip()[-200:])
            except (subprocess.TimeoutExpired, ValueError) as e:
                ok, why = False, str(e)[:200]
            self.slowest = max(self.slowest, time.perf_counter() - t0)
            if ok:
                self.answers += 1
            else:
                self.failures.append(why)

    def halt(self):
        self.done.set()
        if self.is_alive():
            self.join()


def timed(cmd, cap, env=None):
    """Runs CMD in a process group of its own for at most CAP s: (seconds, exit status, stdout,
    stderr); the status is None when the cap cut it (the whole group killed, as on Ctrl-C)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, errors="replace", env=env,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=cap)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        rc = None
    except BaseException:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        raise
    return time.perf_counter() - t0, rc, out, err


def last_line(text):
    lines = (text or "").strip().splitlines()
    return lines[-1][:200] if lines else ""


def layout_names(layout, n):
    """The N files' paths: one folder, or FOLDERS folders filled in turn."""
    if layout == "flat":
        return ["f-%06d" % i for i in range(n)]
    return ["d%03d/f-%06d" % (i % FOLDERS, i) for i in range(n)]


class ScaleBench(Bench):
    TOOLS = ("fusermount3", "ls", "find", "tar", "rsync", "rm", "prlimit", "bash", "wc")

    def wants_nullfs(self):
        return True

    @staticmethod
    def mk(metric, layout, n):
        return "%s:%s:%d" % (metric, layout, n)

    def rec(self, c, metric, layout, n, value, capped=False):
        k = (c.key, self.mk(metric, layout, n))
        self.res.setdefault(k, []).append(value)
        if capped:
            self.capped.setdefault(k, set()).add(len(self.res[k]) - 1)
        log("  %-14s %-28s %s%.4g" % (c.key, k[1], "cut at " if capped else "", value))

    def main(self):
        a = self.a
        self.contenders = [Native(self), NullScale(self), ScaleVaultfs(self, False),
                           ScaleVaultfs(self, True)]
        self.out = os.path.join(self.work, "rsync-out")
        for r in range(a.runs):
            k = r % len(self.contenders)
            for n in a.counts:
                for c in self.contenders[k:] + self.contenders[:k]:
                    log("run %d/%d, %s files: %s" % (r + 1, a.runs, commas(n), c.label))
                    self.at_count(c, n, r)
                    self.trim()
        for c in self.contenders[2:]:
            log("%s: under ulimit -n %d, %s files in %s folders" % (
                c.label, LIMIT, commas(a.files), commas(FOLDERS)))
            self.limited(c, a.files)
            self.trim()
        self.page()

    def at_count(self, c, n, r):
        """C started afresh, every workload on N files, one layout after the other (run R)."""
        self.a.nfiles = n  # what Bench.ls and Bench.find count
        c.start()
        try:
            for layout, _ in LAYOUTS:
                self.at_layout(c, n, layout, r)
        finally:
            c.stop()
        for role, kib in c.rss.items():
            if kib:
                self.rec(c, "rss_" + role, "all", n, kib / 1024)

    def at_layout(self, c, n, layout, r):
        d = os.path.join(c.dir, "%s-%d-%d" % (layout, n, r))  # a cut rm -rf leaves files
        state = {}

        def create():
            t0, t1 = create_files(d, n, FILE_SIZE, layout_names(layout, n))
            state["t0"] = t0
            return t1 - t0

        def stored():
            # Waits of STORED_CAP at most one after another (each one dies at STORED_TIMEOUT).
            t, end = None, time.perf_counter() + stored_cap(n)
            while t is None and time.perf_counter() < end:
                t = c.wait_stored(d, cap=max(0.1, min(STORED_CAP, end - time.perf_counter())))
            if t is None:
                state["capped"] = True
                return time.perf_counter() - state["t0"]
            return t - state["t0"]

        steps = {
            "create_close": create,
            "create_stored": stored,
            "ls_cold": lambda: self.ls(d, recursive=layout == "tree"),
            "ls_warm": lambda: statistics.median(self.ls(d, recursive=layout == "tree")
                                                 for _ in range(3)),
            "find_cold": lambda: self.find(d),
            "tar_cold": lambda: self.tar_out(d, n),
            "rsync_cold": lambda: self.rsync_out(d, n),
            "rm": lambda: self.rm(c, d, n, state),
        }
        for metric, _, cold in WORKLOADS:
            if not does(c, metric):
                continue
            if cold:
                c.cold()
            state.pop("capped", None)
            state.pop("left", None)
            with FdPeak(c) as fp:
                try:
                    secs = steps[metric]()
                except (Fail, OSError, subprocess.TimeoutExpired) as e:
                    self.fail(c, self.mk(metric, layout, n), str(e)[-300:])
                    secs = None
            if secs is not None:
                self.rec(c, metric, layout, n, secs, state.get("capped", False))
            if "left" in state:
                self.rec(c, metric + "_left", layout, n, state["left"])
            if c.is_mount:
                self.rec(c, "fd_" + metric, layout, n, fp.peak)
            if metric == "create_close" and secs is None:
                return  # nothing else to measure on files that are not there

    def tar_out(self, d, n, cap=600):
        """`tar -cf - -C D .` into `wc -c`: seconds; a failure if tar says anything, exits
        non-zero or writes fewer bytes than the files hold."""
        secs, rc, out, err = timed(["bash", "-c", 'set -o pipefail; tar -cf - -C "$1" . | wc -c',
                                    "tar", d], cap)
        if rc is None:
            raise Fail("cut after %d s" % cap)
        errors = [x for x in err.splitlines() if x.strip()]
        if rc != 0 or errors or int(out.strip() or 0) < n * FILE_SIZE:
            raise Fail("exit %s, %s bytes, %d error line(s)%s" % (
                rc, commas(int(out.strip() or 0)), len(errors),
                ": " + errors[-1][:200] if errors else ""))
        return secs

    def rsync_out(self, d, n, cap=600, keep=False):
        """`rsync -a D/ OUT/` onto the native disk: seconds; a failure unless it exits 0 with
        every file and byte there. OUT is removed afterwards (untimed) unless KEEP."""
        shutil.rmtree(self.out, ignore_errors=True)
        secs, rc, _out, err = timed(["rsync", "-a", d + "/", self.out + "/"], cap)
        got = count_tree(self.out)
        if not keep:
            shutil.rmtree(self.out, ignore_errors=True)
        if rc != 0 or got != (n, n * FILE_SIZE):
            raise Fail("exit %s, %s files of %s: %s" % (rc, commas(got[0]), commas(n),
                                                         last_line(err)))
        return secs

    def rm(self, c, d, n, state):
        """`rm -rf D`, cut after RM_CAP_PER_FILE a file (at least 30 s): seconds; then, untimed,
        the mount's deletes left to store (at most a minute)."""
        cap = max(30.0, n * RM_CAP_PER_FILE)
        secs, rc, _out, err = timed(["rm", "-rf", d], cap)
        if rc is None:
            state["capped"], state["left"] = True, count_tree(d)[0]
            log("  %s: rm -rf cut after %.0f s, %s files left" % (c.label, cap,
                                                                   commas(state["left"])))
        elif rc != 0:
            raise Fail("rm exited with %d: %s" % (rc, last_line(err)))
        if c.is_mount:
            c.wait_stored(c.dir, cap=60)
        return secs

    def limited(self, c, n):
        """Under `ulimit -n LIMIT` for the mount daemon: N files in FOLDERS folders written,
        `vaultfs sync`, `tar c`, `rsync -a` out, `vaultfs status` every second meanwhile, `vaultfs
        unmount` (timed until the daemon is gone), a mount again and every file read and compared
        with the rsync copy. The outcome of each step goes to info["limit_" + key]."""
        d = os.path.join(c.dir, "limit-%d" % n)
        res = {}
        c.nofile = LIMIT
        c.start()
        poll = StatusPoll(c)
        poll.start()
        try:
            with FdPeak(c) as fp:
                try:
                    t0, t1 = create_files(d, n, FILE_SIZE, layout_names("tree", n))
                    res["write"] = (True, "%.1f s" % (t1 - t0))
                except OSError as e:
                    res["write"] = (False, "failed after %s files: %s" % (
                        commas(count_tree(d)[0]), e))
                secs, rc, _o, err = timed([c.bin, "sync", c.dir, "--quiet"], stored_cap(n),
                                          env=c.env())
                res["sync"] = (rc == 0, "%.1f s%s" % (secs, "" if rc == 0 else
                                                      ", exit %s: %s" % (rc, last_line(err))))
                for step, fn in (("tar", self.tar_out),
                                 ("rsync", lambda d, n: self.rsync_out(d, n, keep=True))):
                    try:
                        res[step] = (True, "%.1f s" % fn(d, n))
                    except Fail as e:
                        res[step] = (False, str(e))
            poll.halt()
            res["status"] = (poll.answers > 0 and not poll.failures, "%d answers%s, slowest "
                             "%.0f ms" % (poll.answers, ", **%d failed** (%s)" % (
                                 len(poll.failures), poll.failures[-1]) if poll.failures else "",
                                 poll.slowest * 1000))
            c.rss["mount"] = max(c.rss["mount"], proc_kib(c.proc.pid, "VmHWM"))
            t0 = time.perf_counter()
            _secs, rc, _o, err = timed([c.bin, "unmount", c.dir], 60, env=c.env())
            if rc == 0:
                stop_proc(c.proc, grace=60)
            secs_gone = time.perf_counter() - t0 if rc == 0 and not mounted(c.dir) else None
            c.unmount()  # whatever is left (a failed unmount: fusermount3, SIGTERM)
            res["unmount"] = (secs_gone is not None and secs_gone <= UNMOUNT_WITHIN,
                              "%.1f s" % secs_gone if secs_gone is not None else
                              "failed (exit %s: %s)" % (rc, last_line(err)))
            c.mount()
            with FdPeak(c) as fp2:
                res["remount"] = self.read_back(d, n)
            res["fds"] = (max(fp.peak, fp2.peak) < LIMIT, commas(max(fp.peak, fp2.peak)))
        finally:
            poll.halt()
            c.stop()
            c.nofile = None
            shutil.rmtree(self.out, ignore_errors=True)
        res["rss"] = (None, "%.1f" % (c.rss["mount"] / 1024))
        for k, (ok, text) in res.items():
            log("  %-8s %s %s" % (k, {True: "ok", False: "FAILED", None: ""}[ok], text))
        self.info["limit_" + c.key] = res

    def read_back(self, d, n):
        """Every file of D read through the remounted mount, compared with the rsync copy."""
        read = same = 0
        errors = []
        for rel in layout_names("tree", n):
            try:
                with open(os.path.join(d, rel), "rb") as f:
                    data = f.read()
            except OSError as e:
                errors.append(e)
                continue
            read += len(data) == FILE_SIZE
            try:
                with open(os.path.join(self.out, rel), "rb") as f:
                    same += f.read() == data
            except OSError:
                pass
        text = "%s of %s files read whole, %s identical to the `rsync -a` copy" % (
            commas(read), commas(n), commas(same))
        if errors:
            text += "; %s errors (%s)" % (commas(len(errors)), errors[-1])
        return (read == n and same == n, text)

    # The page.

    def val(self, c, metric, layout, n):
        v = self.res.get((c.key, self.mk(metric, layout, n)))
        if not v:
            return None
        # peaks: the largest of the runs; times: the median
        return max(v) if metric.startswith(("rss_", "fd_")) else statistics.median(v)

    def is_capped(self, c, metric, layout, n):
        return (c.key, self.mk(metric, layout, n)) in self.capped

    def cell(self, c, metric, layout, n):
        """Seconds, and the time per file."""
        if not does(c, metric):
            return "n/a"
        why = self.failed.get((c.key, self.mk(metric, layout, n)))
        if why:
            return "**failed**: %s" % why[0][:160]
        x = self.val(c, metric, layout, n)
        if x is None:
            return "-"
        ge = "≥ " if self.is_capped(c, metric, layout, n) else ""
        secs = "%.1f" % x if x >= 10 else "%.2f" % x if x >= 1 else "%.3f" % x
        left = self.val(c, metric + "_left", layout, n)
        if left is not None and left < n:
            return "≥ %s s (cut: %s of %s files left; %s for those removed)" % (
                secs, commas(int(left)), commas(n), per_file(x, n - int(left)))
        return "%s%s s (%s%s)" % (ge, secs, ge, per_file(x, n))

    def per_file_secs(self, c, metric, layout, n):
        """Seconds a file, and how sure: "=" measured, ">=" a lower bound (cut at the cap), "~"
        estimated from the files a cut `rm -rf` removed; (None, "?") when unknown."""
        x = self.val(c, metric, layout, n)
        if not x:
            return None, "?"
        if not self.is_capped(c, metric, layout, n):
            return x / n, "="
        left = self.val(c, metric + "_left", layout, n)
        if left is not None and left < n:
            return x / (n - left), "~"
        return x / n, ">="

    def growth(self, c, metric, layout):
        """The time per file at the largest count over that at the smallest: (ratio, how sure:
        "=" measured, "~" estimated, ">=" a lower bound, "<=" an upper bound, "?" unknown)."""
        n1, n2 = self.a.counts[0], self.a.counts[-1]
        (x1, h1), (x2, h2) = (self.per_file_secs(c, metric, layout, n) for n in (n1, n2))
        if x1 is None or x2 is None or n1 == n2:
            return None, "?"
        how = {("=", "="): "=", ("=", ">="): ">=", (">=", "="): "<="}.get(
            (h1, h2), "~" if ">=" not in (h1, h2) else "?")
        return x2 / x1, how

    def page(self):
        a, cs = self.a, self.contenders
        n1, n2 = a.counts[0], a.counts[-1]
        issue_counts = a.counts == [10000, 100000]
        P = Page(self, "Many files", "%s files of %s (distinct random bytes) in one folder and "
                 "in %s folders: the native disk, the null FUSE file system (`examples/nullfs.rs`"
                 ", in create, `ls`, `find` and `rm` only), `vaultfs mount` on the built-in store "
                 "(local) and on `vaultfs serve` over loopback (remote), each started afresh at "
                 "each count; then the vaultfs mounts under `ulimit -n %d`. Issue 46." % (
                     " and ".join(commas(n) for n in a.counts), human(FILE_SIZE),
                     commas(FOLDERS), LIMIT))
        for layout, where in LAYOUTS:
            P.w("## %s" % where[0].upper() + where[1:], "")
            rows = []
            for metric, what, _ in WORKLOADS:
                for n in a.counts:
                    rows.append([what, commas(n)] + [self.cell(c, metric, layout, n)
                                                     for c in cs])
                if len(a.counts) > 1:
                    row = [what, "per file: %s / %s" % (commas(n2), commas(n1))]
                    for c in cs:
                        g, how = self.growth(c, metric, layout)
                        row.append("-" if g is None else "%s%.2fx" % (
                            HOW[how], g))
                    rows.append(row)
            P.table(["Workload", "Files"] + [c.label for c in cs], rows, right=2)
        P.w("- Each cell: the time for all the files, and per file in brackets%s. ≥: the step "
            "was cut at its cap (create until stored: 10 ms a file, at least %d s; `rm -rf`: "
            "3 ms a file, at least 30 s), the figure is a bound; a cut `rm -rf` also gives the "
            "time per file of the files it removed, and the ratio of the counts from it is an "
            "estimate (~)." % (
                "; the medians of the %d runs (interleaved, the contenders' order rotating)" %
                a.runs if a.runs > 1 else "", STORED_CAP), "")
        P.w("## Daemons", "")
        rows = []
        mounts = [c for c in cs if c.is_mount]
        for n in a.counts:
            rows.append(["Peak RSS of the mount daemon, MiB", commas(n)] + [
                self.rss_cell(c, "rss_mount", n) for c in mounts])
            rows.append(["Peak RSS of the server, MiB", commas(n)] + [
                self.rss_cell(c, "rss_server", n) for c in mounts])
        for metric, what, _ in WORKLOADS:
            for n in a.counts:
                row = ["Peak open descriptors of the mount daemon: %s" % what, commas(n)]
                for c in mounts:
                    v = [self.val(c, "fd_" + metric, lay, n) for lay, _ in LAYOUTS]
                    row.append("-" if not does(c, metric) or None in v else
                               " / ".join(commas(x) for x in v))
                rows.append(row)
        P.table(["", "Files"] + [c.label for c in mounts], rows, right=2)
        P.w("- Peak RSS: VmHWM of each daemon before it stops, the largest over its restarts "
            "at that count (both layouts%s). Descriptors: one folder / %s folders, "
            "`/proc/PID/fd` counted every %d ms during the step." % (
                ", every run" if a.runs > 1 else "", commas(FOLDERS), FD_POLL * 1000), "")
        limited = [c for c in cs if "limit_" + c.key in self.info]
        if limited:
            P.w("## Under `ulimit -n %d`" % LIMIT, "")
            rows = []
            for k, what in (("write", "%s files of %s in %s folders written" % (
                                commas(a.files), human(FILE_SIZE), commas(FOLDERS))),
                            ("sync", "`vaultfs sync DIR`"), ("tar", "`tar -cf -`, no error"),
                            ("rsync", "`rsync -a` out, exit 0, every file"),
                            ("status", "`vaultfs status DIR --json` every %g s meanwhile" %
                             STATUS_EVERY),
                            ("unmount", "`vaultfs unmount DIR` until the daemon is gone"),
                            ("remount", "mounted again, every file read"),
                            ("fds", "peak open descriptors of the mount daemon"),
                            ("rss", "peak RSS of the mount daemon, MiB")):
                row = [what]
                for c in limited:
                    ok, text = self.info["limit_" + c.key].get(k, (False, "not reached"))
                    row.append({True: "yes: ", False: "**no**: ", None: ""}[ok] + text)
                rows.append(row)
            P.table(["Step"] + [c.label for c in limited], rows, right=1)
        self.targets(P, cs, n1, n2, issue_counts)
        P.write(self.how())

    def rss_cell(self, c, metric, n):
        v = self.val(c, metric, "all", n)
        return "-" if v is None else "%.1f" % v

    def targets(self, P, cs, n1, n2, issue_counts):
        a = self.a
        by = {c.key: c for c in cs}
        local, remote, null = by["vaultfs-local"], by["vaultfs-remote"], by["null"]
        counts = "" if issue_counts else " (this run: %s → %s files, not the issue's 10,000 → " \
            "100,000)" % (commas(n1), commas(n2))
        rows = []
        for metric, what in (("create_stored", "create until stored"), ("rm", "`rm -rf`"),
                             ("ls_cold", "`ls -l` cold"), ("ls_warm", "`ls -l` warm")):
            for c in (local, remote):
                gs = [self.growth(c, metric, lay) for lay, _ in LAYOUTS]
                text = ", ".join("%s %s" % (where, "-" if g is None else "%s%.2fx" % (
                    HOW[how], g))
                                 for (g, how), (_, where) in zip(gs, LAYOUTS))
                oks = [None if g is None or how == "?" or (how == ">=" and g <= 1.5) or
                       (how == "<=" and g > 1.5) else g <= 1.5 for g, how in gs]
                rows.append(["%s: per-file cost of %s at 100,000 files ≤ 1.5x at 10,000%s" % (
                    c.label, what, counts), text, verdict(oks)])
        for c, bound in ((local, 30), (remote, 90)):
            xs = [self.val(c, "rm", lay, n2) for lay, _ in LAYOUTS]
            capped = any(self.is_capped(c, "rm", lay, n2) for lay, _ in LAYOUTS)
            text = ", ".join("%s %s" % (where, "-" if x is None else "%s%.1f s" % (
                "≥ " if self.is_capped(c, "rm", lay, n2) else "", x))
                for x, (lay, where) in zip(xs, LAYOUTS))
            ok = None if None in xs or n2 != 100000 else max(xs) <= bound
            if ok and capped:
                ok = None
            rows.append(["%s: `rm -rf` of 100,000 files ≤ %d s" % (c.label, bound), text,
                         "not judged (%s files)" % commas(n2) if n2 != 100000 else verdict([ok])])
        oks, texts = [], []
        for lay, where in LAYOUTS:
            x, y = self.val(local, "create_stored", lay, n2), self.val(null, "create_close",
                                                                        lay, n2)
            ok = None if not x or not y else (y / x) >= 0.5
            if ok is False and self.is_capped(local, "create_stored", lay, n2):
                ok = False
            elif ok and self.is_capped(local, "create_stored", lay, n2):
                ok = None
            oks.append(ok)
            texts.append("%s %s" % (where, "-" if ok is None and (not x or not y) else
                                    "%.2fx (local %s vs null %s files/s)" % (
                                        y / x, commas(round(n2 / x)), commas(round(n2 / y)))))
        rows.append(["vaultfs local: create until stored of %s files ≥ 0.5x the null file "
                     "system's rate (until last close)" % commas(n2), ", ".join(texts),
                     verdict(oks)])
        oks, texts = [], []
        for lay, where in LAYOUTS:
            x, y = self.val(remote, "create_stored", lay, n2), self.val(local, "create_stored",
                                                                         lay, n2)
            ok = None if not x or not y else x / y <= 3
            if self.is_capped(remote, "create_stored", lay, n2) and ok:
                ok = None
            oks.append(ok)
            texts.append("%s %s" % (where, "-" if not x or not y else
                                    "%.2fx (remote %.1f s vs local %.1f s)" % (x / y, x, y)))
        rows.append(["vaultfs remote: create until stored of %s files within 3x vaultfs "
                     "local's time" % commas(n2), ", ".join(texts), verdict(oks)])
        for c in (local, remote):
            x = self.val(c, "rss_mount", "all", n2)
            rows.append(["%s: peak RSS of the mount daemon through the %s-file run < 200 MiB" %
                         (c.label, commas(n2)), "-" if x is None else "%.1f MiB" % x,
                         met(x, "<", 200)])
        size = "" if a.files == 50000 else " (this run: %s files, not the issue's 50,000)" % \
            commas(a.files)
        for c in (local, remote):
            r = self.info.get("limit_" + c.key)
            if not r:
                continue
            for keys, what in ((("write", "sync", "tar", "rsync"), "written, synced, read back "
                                "by `tar c` and `rsync -a` with no error"),
                               (("status",), "`vaultfs status` answering throughout"),
                               (("unmount",), "unmount within %g s" % UNMOUNT_WITHIN),
                               (("remount",), "remount reads all")):
                oks = [r.get(k, (False, ""))[0] for k in keys]
                rows.append(["%s, under `ulimit -n %d`, %s files in %s folders: %s%s" % (
                    c.label, LIMIT, commas(a.files), commas(FOLDERS), what, size),
                    "; ".join("%s: %s" % (k, r.get(k, (False, "not reached"))[1])
                              for k in keys) if len(keys) > 1 else
                    r.get(keys[0], (False, "not reached"))[1], verdict(oks)])
        P.targets(rows)

    def how(self):
        a = self.a
        return [
            "At each count (%s) each contender is started afresh (mount daemon, and server for "
            "vaultfs remote), runs every workload on one folder, then on %s folders, and is "
            "stopped; the contenders one after another (native, null, local, remote)%s." % (
                ", ".join(commas(n) for n in a.counts), commas(FOLDERS),
                "; %d runs, each in a new folder, the order rotating from run to run" % a.runs
                if a.runs > 1 else "; one run"),
            "**Create**: one Python process creates the files of %s (distinct random bytes, "
            "made before the clock starts): `open(O_CREAT|O_EXCL)`, `write`, `close`, in the "
            "tree each folder made (`mkdir`) before its first file, the folders filled in turn. "
            "*Until stored*: as in docs/benchmarks.md (vaultfs: its upload journal has no open "
            "entry and its status lists no upload; native: `syncfs`), cut after 10 ms a file "
            "(at least %d s); the null file system has nothing to store." % (
                human(FILE_SIZE), STORED_CAP),
            "**Cold**: the page cache dropped (`syncfs`, `drop_caches`); for vaultfs also the "
            "mount restarted with its read cache deleted (the server keeps running); for the "
            "null file system the page cache only (a restart forgets its files). `ls -l` "
            "of the folder, `ls -lR` of the tree (the files counted); warm: the median of 3 "
            "right after. `find DIR -type f` (counted). `tar -cf - -C DIR . | wc -c` (no "
            "message from tar, every byte). `rsync -a DIR/ OUT/` with OUT on the native disk "
            "(every file and byte there, then removed, untimed). `rm -rf DIR` until it exits, "
            "cut after 3 ms a file (at least 30 s); then, untimed, at most a minute for the "
            "mount to store the deletes.",
            "**Peak RSS**: VmHWM of each daemon just before it is stopped or restarted, the "
            "largest at that count. **Descriptors**: entries of `/proc/PID/fd` of the mount "
            "daemon, counted every %d ms from a thread of the harness during each step." % (
                FD_POLL * 1000),
            "**Under `ulimit -n %d`**: the mount daemon runs under `prlimit --nofile=%d:%d` "
            "(soft and hard: it cannot raise it); %s files of %s in %s folders written as in "
            "*create*, then `vaultfs sync DIR --quiet` (cut as *until stored*), `tar -cf -` "
            "and `rsync -a` out (as above, warm), with `vaultfs status DIR --json` run every "
            "%g s from the first write to the end of rsync (an answer: exit 0 and a JSON "
            "object, within 10 s); `vaultfs unmount DIR` timed until it returned with the "
            "daemon gone; mounted again (same limit) and every file read and compared with the "
            "rsync copy." % (
                LIMIT, LIMIT, LIMIT, commas(a.files), human(FILE_SIZE), commas(FOLDERS),
                STATUS_EVERY),
        ]


def stored_cap(n):
    """The longest wait until N new files are stored."""
    return max(STORED_CAP, n * STORED_CAP_PER_FILE)


HOW = {"=": "", "~": "~", ">=": "≥ ", "<=": "≤ ", "?": "? "}


def per_file(secs, n):
    us = secs / n * 1e6
    return "%.0f µs/file" % us if us < 1000 else "%.1f ms/file" % (us / 1000)


def verdict(oks):
    """Met when every part is; not met when one is not; unknown otherwise."""
    if False in oks:
        return "**no**"
    if None in oks or not oks:
        return "unknown"
    return "yes"
