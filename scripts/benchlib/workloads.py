"""The workloads of the main comparison (scripts/bench with no mode, --quick, and the `mount`
mode): sequential and random I/O, dd, small files, untar, git clone, metadata, fsx."""

import json
import os
import re
import statistics
import time

from .contenders import Native, NullFs, Rclone, Vaultfs, does
from .fixtures import create_files, make_repo
from .report import report
from .setup import Harness
from .util import FSX_SEED, MIB, ROOT, T_START, commas, count_tree, die, loadavg, log, run


class Bench(Harness):
    """The main comparison: every contender through the same workloads, the runs interleaved,
    then fsx on the local mount; written to --out by report.publish."""

    TOOLS = ("fio", "rclone", "gnuplot", "git", "tar", "fusermount3", "find", "ls", "dd")

    def put(self, c, metric, value):
        if not does(c, metric):
            die("%s takes no part in %s" % (c.label, metric))
        self.res.setdefault((c.key, metric), []).append(value)
        log("  %-14s %-16s %s" % (c.key, metric, ("%.4g" % value) if isinstance(value, float)
                                   else value))

    # fio: returns the section (read/write) of its one job
    def fio(self, name, path, rw, size, runtime, time_based=False, bs="1M"):
        out = os.path.join(self.work, "fio.json")
        cmd = ["fio", "--name=" + name, "--filename=" + path, "--rw=" + rw, "--bs=" + bs,
               "--size=%d" % size, "--ioengine=psync", "--direct=0", "--invalidate=0",
               "--fallocate=none", "--runtime=%d" % runtime, "--output-format=json",
               "--output=" + out]
        if time_based:
            cmd.append("--time_based")
        t0 = time.perf_counter()
        run(cmd, timeout=runtime + 120)
        wall = time.perf_counter() - t0
        with open(out) as f:
            text = f.read()
        job = json.loads(text[text.index("{"):])["jobs"][0]
        sec = job["write" if "write" in rw else "read"]
        if job.get("error"):
            die("fio %s on %s: error %s" % (name, path, job["error"]))
        return sec, wall

    def one_run(self, c, r):
        a = self.a
        d = c.dir
        self.loads.append(loadavg())
        c.start()
        try:
            self.big_file(c)
            self.dd(c)
            # Small files, untar, git clone: until the command is done, and until stored (the
            # wait capped at --stored-cap seconds).
            sub = "create-%d" % r
            t0, t1 = create_files(os.path.join(d, sub), a.creates, 4096)
            self.put(c, "create_close", a.creates / (t1 - t0))
            if does(c, "create_stored"):
                self.stored(c, "create_stored", sub, t0, (sub, a.creates, a.creates * 4096),
                            lambda t: a.creates / t)
            for metric, cmd, expect in (
                    ("untar", ["tar", "-xf", self.tar, "-C"], (self.repo_files, self.repo_bytes)),
                    ("clone", ["git", "clone", "-q", "--no-local", self.repo],
                     (self.clone_files, None))):
                if not does(c, metric):
                    continue
                sub = "%s-%d" % (metric, r)
                dest = os.path.join(d, sub)
                if metric == "untar":
                    os.mkdir(dest)
                t0 = time.perf_counter()
                p = run(cmd + [dest], timeout=600, check=False)
                t1 = time.perf_counter()
                if p.returncode != 0:
                    self.fail(c, metric, "%s exited with %d: %s" % (
                        cmd[0], p.returncode, (p.stderr or p.stdout).strip().splitlines()[-1]))
                    c.wait_stored(d)
                    continue
                self.put(c, metric, t1 - t0)
                if does(c, metric + "_stored"):
                    self.stored(c, metric + "_stored", sub, t0, (sub,) + expect, lambda t: t)

            # Metadata: ls -l of the flat folder, lstat of every file of the tree, find.
            if not does(c, "ls_cold"):
                return
            flat, tree = os.path.join(d, "flat"), os.path.join(d, "tree")
            c.cold()
            self.put(c, "ls_cold", self.ls(flat) * 1000)
            self.put(c, "stat_cold", self.stat_walk(tree) * 1000)
            self.put(c, "ls_warm", statistics.median(self.ls(flat) for _ in range(3)) * 1000)
            self.put(c, "stat_warm",
                     statistics.median(self.stat_walk(tree) for _ in range(3)) * 1000)
            c.cold()
            self.put(c, "find_cold", self.find(tree) * 1000)
            self.put(c, "find_warm", statistics.median(self.find(tree) for _ in range(3)) * 1000)
        finally:
            c.stop()
        for role, kib in c.rss.items():
            if kib and does(c, "rss_" + role):
                self.put(c, "rss_" + role, kib / 1024)

    def big_file(self, c):
        """Sequential write, first byte, sequential and random reads of one SIZE file."""
        a = self.a
        f = os.path.join(c.dir, "seq.bin")
        sec, _ = self.fio("seqwrite", f, "write", a.size, a.seq_runtime)
        t_end = time.perf_counter()
        written = sec["io_bytes"]
        run_s = sec["runtime"] / 1000
        t_stored = c.wait_stored(f, ("seq.bin", 1, written))
        self.put(c, "seq_w_close", written / run_s / MIB)
        if does(c, "seq_w_stored"):
            self.put(c, "seq_w_stored", written / (run_s + t_stored - t_end) / MIB)
        if does(c, "seq_r_cold"):
            self.reads(c, f, written)
        os.unlink(f)
        c.wait_stored(c.dir)

    def reads(self, c, f, written):
        """First byte, sequential and random reads of F, just written."""
        a = self.a
        c.cold()
        t0 = time.perf_counter()
        fd = os.open(f, os.O_RDONLY)
        got = os.pread(fd, 4096, 0)
        t1 = time.perf_counter()
        os.close(fd)
        if len(got) != 4096:
            die("%s: short first read" % c.label)
        self.put(c, "ttfb", (t1 - t0) * 1000)
        sec, _ = self.fio("seqread", f, "read", written, a.seq_runtime)
        self.put(c, "seq_r_cold", sec["bw_bytes"] / MIB)
        sec, _ = self.fio("seqread", f, "read", written, a.seq_runtime)
        self.put(c, "seq_r_warm", sec["bw_bytes"] / MIB)
        sec, _ = self.fio("randread", f, "randread", written, a.rand_runtime, True, "4k")
        self.put(c, "rand_warm", sec["iops"])
        c.cold()
        sec, _ = self.fio("randread", f, "randread", written, a.rand_runtime, True, "4k")
        self.put(c, "rand_cold", sec["iops"])

    def dd(self, c):
        """`dd bs=1M conv=fsync` of DD_SIZE bytes of random data (512 MiB; 256 with --quick):
        until dd exits (which is until stored where fsync means stored), and until stored."""
        size = self.a.dd_size
        f = os.path.join(c.dir, "dd.bin")
        # The source in the page cache (untimed): the writes are measured, not the source disk.
        with open(self.dd_src, "rb") as src:
            while src.read(8 * MIB):
                pass
        t0 = time.perf_counter()
        p = run(["dd", "if=" + self.dd_src, "of=" + f, "bs=1M", "count=%d" % (size // MIB),
                 "conv=fsync", "status=none"], timeout=1800, check=False)
        t1 = time.perf_counter()
        if p.returncode != 0:
            self.fail(c, "dd", "dd exited with %d: %s" % (
                p.returncode, ((p.stderr or p.stdout).strip().splitlines() or ["?"])[-1]))
        elif os.stat(f).st_size != size:
            self.fail(c, "dd", "dd wrote %s bytes, not %s" % (commas(os.stat(f).st_size),
                                                              commas(size)))
        else:
            self.put(c, "dd", size / (t1 - t0) / MIB)
            if does(c, "dd_stored"):
                t = c.wait_stored(f, ("dd.bin", 1, size))
                self.put(c, "dd_stored", size / (t - t0) / MIB)
        if os.path.exists(f):
            os.unlink(f)
        c.wait_stored(c.dir)

    def stored(self, c, metric, sub, t0, expect, value):
        """Waits (at most --stored-cap s) until SUB is stored; records VALUE(seconds since T0),
        or VALUE(cap) marked as capped, after which the contender is reset."""
        t = c.wait_stored(os.path.join(c.dir, sub), expect, cap=self.a.stored_cap)
        if t is None and hasattr(c, "backing") and self.stuck(c, expect):
            # Nothing moves and nothing is queued, yet the backing folder differs from what was
            # written (rclone after some git clones): not slow but wrong.
            rel, nfiles, nbytes = expect
            n, nb = count_tree(os.path.join(c.backing, rel))
            self.fail(c, metric, "nothing left to upload, but the backing folder holds %d files "
                      "(%s bytes) where %d%s were written" % (
                          n, commas(nb), nfiles,
                          "" if nbytes is None else " (%s bytes)" % commas(nbytes)))
            c.reset(c.dir)
            return
        if t is None:
            self.capped.setdefault((c.key, metric), set()).add(len(self.res.get((c.key, metric),
                                                                                 [])))
            self.put(c, metric, value(time.perf_counter() - t0))
            log("  %s: %s not stored within %d s: capped; resetting" % (
                c.label, sub, self.a.stored_cap))
            c.reset(c.dir)
        else:
            self.put(c, metric, value(t - t0))

    def stuck(self, c, expect):
        """Whether the backing folder stays unlike EXPECT for 3 s with nothing queued (rclone's
        queue counts alone are not enough: they read empty at times while webdav uploads are
        still coming in)."""
        path = os.path.join(c.backing, expect[0])
        before = count_tree(path)
        for _ in range(6):
            time.sleep(0.5)
            if not c.queue_empty() or c.backing_ok(expect) or count_tree(path) != before:
                return False
        return True

    def fail(self, c, metric, why):
        self.failed.setdefault((c.key, metric), []).append(why)
        log("  %s: %s FAILED: %s" % (c.label, metric, why))

    def ls(self, path, recursive=False):
        """`ls -l` of PATH (`ls -lR` of a tree), its files counted: seconds."""
        t0 = time.perf_counter()
        p = run(["ls", "-lR" if recursive else "-l", path], timeout=600)
        t = time.perf_counter() - t0
        n = sum(1 for line in p.stdout.splitlines() if line.startswith("-"))
        if n != self.a.nfiles:
            die("ls -l %s listed %d files, expected %d" % (path, n, self.a.nfiles))
        return t

    def find(self, path):
        t0 = time.perf_counter()
        p = run(["find", path, "-type", "f"], timeout=300)
        t = time.perf_counter() - t0
        n = p.stdout.count("\n")
        if n != self.a.nfiles:
            die("find %s found %d files, expected %d" % (path, n, self.a.nfiles))
        return t

    def stat_walk(self, path):
        t0 = time.perf_counter()
        n = 0
        for dirpath, dirs, files in os.walk(path):
            for name in dirs:
                os.lstat(os.path.join(dirpath, name))
            for name in files:
                os.lstat(os.path.join(dirpath, name))
                n += 1
        t = time.perf_counter() - t0
        if n != self.a.nfiles:
            die("walking %s found %d files, expected %d" % (path, n, self.a.nfiles))
        return t

    def fixtures(self, c):
        """The folder and the tree of N files, made once per contender straight into its store
        (not timed: these are the files that are already there)."""
        t0 = time.perf_counter()
        c.make_fixtures(self.a.nfiles)
        log("  %s: %s fixture files in %.1f s" % (c.label, commas(2 * self.a.nfiles),
                                                  time.perf_counter() - t0))

    def fsx(self, c):
        fsx = self.fsx_bin
        if not fsx:
            log("fsx is not installed (cargo install --locked fsx): skipped")
            self.info["fsx_" + c.key] = None
            return
        c.start()
        try:
            art = os.path.join(self.work, "fsx-" + c.key)
            os.makedirs(art)
            cmd = [fsx, "-N", str(self.a.fsx_ops), "-S", str(FSX_SEED), "-f",
                   os.path.join(ROOT, "tests/fsx/fsx.toml"), "-P", art,
                   os.path.join(c.dir, "fsx.dat")]
            t0 = time.perf_counter()
            p = run(cmd, timeout=1200, check=False)
            t = time.perf_counter() - t0
            out = re.sub(r"\x1b\[[0-9;]*m", "", (p.stdout or "") + (p.stderr or ""))
            self.info["fsx_" + c.key] = (p.returncode == 0, t, out.strip().splitlines()[-3:])
            log("  fsx on %s: %s, %d ops in %.1f s" % (c.label, "passed" if p.returncode == 0
                                                       else "FAILED", self.a.fsx_ops, t))
            if c.is_mount:
                c.wait_stored(c.dir)
        finally:
            c.stop()

    def wants_nullfs(self):
        return "null" in self.a.only

    def main(self):
        a = self.a
        log("making the repository fixture (%d files)" % a.repo_files)
        fx = os.path.join(self.work, "fixtures")
        os.makedirs(fx)
        self.repo, self.tar, self.repo_files, self.repo_bytes, self.clone_files = \
            make_repo(fx, a.repo_files)
        self.info["repo"] = (self.repo_files, self.repo_bytes,
                             os.path.getsize(self.tar),
                             count_tree(os.path.join(self.repo, ".git")))
        # dd's source: random bytes (no contender may take a shortcut on zeros).
        self.dd_src = os.path.join(fx, "dd-src.bin")
        with open(self.dd_src, "wb") as f:
            for _ in range(a.dd_size // MIB):
                f.write(os.urandom(MIB))

        self.contenders = [Native(self)]
        for key in a.only:
            if key == "null":
                self.contenders.append(NullFs(self))
            elif key == "vaultfs-local":
                self.contenders.append(Vaultfs(self, False))
            elif key == "vaultfs-remote":
                self.contenders.append(Vaultfs(self, True))
            elif key == "rclone-local":
                self.contenders.append(Rclone(self, False))
            elif key == "rclone-webdav":
                self.contenders.append(Rclone(self, True))

        log("fixtures: %s files in a folder and in a tree, on each contender" %
            commas(a.nfiles))
        for c in self.contenders:
            if does(c, "ls_cold"):
                self.fixtures(c)
        for r in range(a.runs):
            order = self.contenders[r % len(self.contenders):] + \
                self.contenders[:r % len(self.contenders)]
            for c in order:
                log("run %d/%d: %s" % (r + 1, a.runs, c.label))
                self.one_run(c, r)
                self.trim()
        if a.fsx_ops:
            log("fsx, %s operations" % commas(a.fsx_ops))
            for c in self.contenders:
                if c.key == "vaultfs-local":
                    self.fsx(c)
        self.load1 = loadavg()
        self.elapsed = time.time() - T_START
        report(self)
