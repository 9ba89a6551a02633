"""reads: the read path, side by side in one run: the native disk, the null FUSE file system
(reads zeros of the same sizes), `vaultfs mount` on the built-in store with passthrough (the
default) and without, and an earlier build (VAULTFS_BEFORE) on the same files: sequential reads
cold and warm (fio, as the comparison), `grep -r` of small files warm, `stat` of each after the
kernel's TTL, the daemon's peak RSS."""

import os
import random
import shutil
import subprocess
import time

from .contenders import Native, NullFs, Vaultfs
from .pages import Page, cell, med
from .setup import drop_caches
from .util import MIB, commas, die, human, log, run
from .workloads import Bench

READ_METRICS = ("seq_r_cold", "seq_r_warm", "grep_warm", "stat_ttl", "rss_mount")
WORDS = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod".split()


class NullReads(NullFs):
    """The null file system in the reads: its reads are zeros; its cold is the page cache
    dropped only (a restart would forget the files, and it keeps no bytes to cache)."""
    metrics = frozenset(READ_METRICS)

    def cold(self):
        drop_caches()


class ReadsBench(Bench):
    TOOLS = ("fio", "grep", "fusermount3", "ls")

    def wants_nullfs(self):
        return True

    def main(self):
        a = self.a
        rnd = random.Random(1)
        self.small = [(" ".join(rnd.choice(WORDS) for _ in range(rnd.randint(350, 1000))) +
                       "\n").encode() for _ in range(a.files)]
        self.big = os.path.join(self.work, "src.bin")
        with open(self.big, "wb") as f:
            for _ in range(a.size // MIB):
                f.write(os.urandom(MIB))
        self.contenders = [Native(self), NullReads(self), Vaultfs(self, False),
                           Vaultfs(self, False, key="vaultfs-no-pt",
                                   label="vaultfs --no-passthrough",
                                   mount_flags=["--no-passthrough"])]
        if os.environ.get("VAULTFS_BEFORE"):
            self.contenders.append(Vaultfs(self, False, key="vaultfs-before",
                                           label="vaultfs before",
                                           binary=os.path.abspath(os.environ["VAULTFS_BEFORE"])))
        log("the files: %s and %s small files, through each contender" % (
            human(a.size), commas(a.files)))
        for c in self.contenders:
            if c.key == "null":
                continue
            c.start()
            try:
                self.fill(c)
                if c.is_mount:
                    c.wait_stored(c.dir)
                # Read once before the runs: on a virtual machine the host caches the disk, and
                # a file read for the first time there is slower whatever reads it.
                with open(os.path.join(c.dir, "big.bin"), "rb") as f:
                    while f.read(8 * MIB):
                        pass
            finally:
                c.stop()
        for r in range(a.runs):
            order = self.contenders[r % len(self.contenders):] + \
                self.contenders[:r % len(self.contenders)]
            for c in order:
                log("run %d/%d: %s" % (r + 1, a.runs, c.label))
                self.reads_run(c)
        self.page()

    def fill(self, c):
        shutil.copyfile(self.big, os.path.join(c.dir, "big.bin"))
        for i, body in enumerate(self.small):
            d = os.path.join(c.dir, "small", "d%02d" % (i % 50))
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "f%05d.txt" % i), "wb") as f:
                f.write(body)

    def reads_run(self, c):
        a = self.a
        c.start()
        try:
            if c.key == "null":
                self.fill(c)  # it keeps names and sizes only, and forgets them when unmounted
            f = os.path.join(c.dir, "big.bin")
            c.cold()
            sec, _ = self.fio("seqread", f, "read", a.size, a.seq_runtime)
            self.put(c, "seq_r_cold", sec["bw_bytes"] / MIB)
            sec, _ = self.fio("seqread", f, "read", a.size, a.seq_runtime)
            self.put(c, "seq_r_warm", sec["bw_bytes"] / MIB)
            small = os.path.join(c.dir, "small")
            self.put(c, "grep_warm", self.grep(small))
            names = [os.path.join(d, x) for d, _, xs in os.walk(small) for x in xs]
            time.sleep(1.2)  # the kernel's attribute and name TTL (1 s, every contender)
            t0 = time.perf_counter()
            for p in names:
                os.stat(p)
            self.put(c, "stat_ttl", len(names) / (time.perf_counter() - t0))
        finally:
            c.stop()
        if c.is_mount and c.key != "null":
            self.put(c, "rss_mount", c.rss["mount"] / 1024)

    def grep(self, path):
        """`grep -r` of every small file, warm (a first pass untimed): files per second."""
        cmd = ["grep", "-r", "-c", "no such words here", path]
        subprocess.run(cmd, stdout=subprocess.DEVNULL, check=False)
        t0 = time.perf_counter()
        p = run(cmd, check=False)
        t = time.perf_counter() - t0
        if p.stdout.count("\n") != self.a.files:
            die("grep -r %s read %d files of %d" % (path, p.stdout.count("\n"), self.a.files))
        return self.a.files / t

    def page(self):
        a, cs = self.a, self.contenders
        s = human(a.size)
        m = lambda c, k: med(self.res.get((c.key, k)))  # noqa: E731
        P = Page(self, "Reads", "The read path on the built-in store: the native disk, the "
                 "null FUSE file system, vaultfs with passthrough (the default) and without%s, "
                 "the contenders interleaved in a rotating order." % (
                     ", and an earlier build" if len(cs) > 4 else ""))
        rows = []
        for key, what, unit in (("seq_r_cold", "Sequential read %s, cold, MiB/s" % s, "MiB/s"),
                                ("seq_r_warm", "Sequential read %s, warm, MiB/s" % s, "MiB/s"),
                                ("grep_warm", "`grep -r` over %s small files, warm, files/s" %
                                 commas(a.files), "files/s"),
                                ("stat_ttl", "`stat` of %s files after the TTL, files/s" %
                                 commas(a.files), "files/s"),
                                ("rss_mount", "Peak RSS of the daemon, MiB", "MiB")):
            row = [what]
            for c in cs:
                v = self.res.get((c.key, key))
                x = cell(v, unit)
                if v and unit != "MiB" and c.key != "native":
                    x += " (%.2fx native%s)" % (m(c, key) / m(cs[0], key), "" if c.key == "null"
                                                 else ", %.2fx null" % (m(c, key) / m(cs[1], key)))
                row.append(x)
            rows.append(row)
        P.table(["Workload"] + [c.label for c in cs], rows, right=1)
        P.write([
            "The files are written once through each contender (the null file system: at the "
            "start of each of its runs; it keeps names and sizes and reads zeros), then read "
            "once (untimed): on a virtual machine the host caches the disk, and a file read "
            "for the first time there is slower whatever reads it.",
            "**Cold**: for a mount, unmount, its read cache deleted, the page cache dropped "
            "(`syncfs`, `drop_caches`), mount again (the null file system: the page cache "
            "dropped only); native: the page cache dropped. **Sequential read**: fio "
            "`--rw=read --bs=1M --ioengine=psync` of the %s file, cold, then warm." % s,
            "**grep -r**: `grep -r -c` of a phrase in none of the %s text files of 2-6 KiB (50 "
            "folders), after an untimed pass. **stat after the TTL**: 1.2 s after the listing, "
            "`stat` of every file by name from the harness: one LOOKUP each, which vaultfs "
            "answers from the folder's listing. **RSS**: VmHWM of the daemon at the end of its "
            "run." % commas(a.files)])
