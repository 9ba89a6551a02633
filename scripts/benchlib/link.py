"""--link RTTS: vaultfs remote and rclone webdav, each through its own link proxy
(scripts/linkproxy.py) in front of its server, at each round trip time (issue 33)."""

import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import time

from .contenders import Rclone, Vaultfs
from .fixtures import WORDS
from .setup import Reg, kill_proc
from .util import MIB, ROOT, commas, die, log, write_kept
from .workloads import Bench

LINK_DOCS = 200
LINK_LS_FILES = 1000


def start_proxy(port, rtt, mbit):
    """A link proxy (scripts/linkproxy.py: RTT ms round trip, MBIT Mbit/s each way) in front of
    127.0.0.1:PORT: (its process, its base URL)."""
    proxy = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "scripts", "linkproxy.py"), "--listen",
         "127.0.0.1:0", "--upstream", "127.0.0.1:%d" % port, "--rtt-ms", str(rtt),
         "--mbit", str(mbit)], stdout=subprocess.PIPE, text=True, start_new_session=True)
    Reg.procs.append(proxy)
    proxy.is_server = True
    line = proxy.stdout.readline()
    m = re.match(r"listening on ([\d.]+):(\d+)", line)
    if not m:
        die("the link proxy did not start: %r" % line)
    return proxy, "http://%s:%s" % m.groups()


class LinkBench(Bench):
    TOOLS = ("rclone", "fusermount3", "ls")

    def wants_nullfs(self):
        return False

    def main(self):
        """vaultfs remote and rclone webdav, each through its own link proxy
        (scripts/linkproxy.py) in front of its server, at each round trip time: the workloads of
        issue 33, medians of --runs, written to --out."""
        a = self.a
        fx = os.path.join(self.work, "fixtures")
        os.makedirs(fx)
        docs = os.path.join(fx, "docs")
        rnd = random.Random(7)
        os.makedirs(docs)
        self.doc_bytes = 0
        for i in range(LINK_DOCS):
            # Documents as people write them: prose-like text of about 4 KiB each.
            text = " ".join(rnd.choice(WORDS) for _ in range(700))[:4096] + "\n"
            with open(os.path.join(docs, "note-%03d.txt" % i), "w") as f:
                f.write(text)
            self.doc_bytes += len(text)
        self.docs = docs
        self.big = {}
        for mib in (16, 32):
            path = os.path.join(fx, "scan-%d.pdf" % mib)  # incompressible, as a scan's pages
            with open(path, "wb") as f:
                f.write(os.urandom(mib * MIB))
            self.big[mib] = path
        contenders = [c for c in (Vaultfs(self, True) if "vaultfs-remote" in a.only else None,
                                  Rclone(self, True) if "rclone-webdav" in a.only else None) if c]
        for c in contenders:
            c.make_fixtures(LINK_LS_FILES)
        self.link_res = {}  # (rtt, contender key, metric) -> [values]
        for rtt in a.link:
            for r in range(a.runs):
                for c in (contenders if r % 2 == 0 else contenders[::-1]):
                    log("link %g ms, run %d/%d: %s" % (rtt, r + 1, a.runs, c.label))
                    self.link_run(c, rtt, r)
        self.link_report(contenders)

    def link_put(self, rtt, c, metric, value):
        self.link_res.setdefault((rtt, c.key, metric), []).append(value)
        log("  %-14s %-16s %.4g" % (c.key, metric, value))

    def link_run(self, c, rtt, r):
        a = self.a
        c.start_server()
        proxy, via = start_proxy(c.port, rtt, a.link_mbit)
        c.link_through(via)
        c.rss = {"mount": 0, "server": 0}
        c.mount()
        try:
            d = c.dir
            sub = "docs-%d-%g" % (r, rtt)
            t0 = time.perf_counter()
            shutil.copytree(self.docs, os.path.join(d, sub))
            t = c.wait_stored(sub, (sub, LINK_DOCS, self.doc_bytes))
            self.link_put(rtt, c, "small_stored", t - t0)
            name = "scan16-%d-%g.pdf" % (r, rtt)
            t0 = time.perf_counter()
            shutil.copyfile(self.big[16], os.path.join(d, name))
            t = c.wait_stored(name, (name, 1, 16 * MIB) if c.key.startswith("rclone") else None)
            self.link_put(rtt, c, "copy16_stored", t - t0)
            big = "scan32-%d-%g.pdf" % (r, rtt)
            shutil.copyfile(self.big[32], os.path.join(d, big))
            c.wait_stored(big, (big, 1, 32 * MIB) if c.key.startswith("rclone") else None)

            c.cold()
            t0 = time.perf_counter()
            for n in sorted(os.listdir(os.path.join(d, sub))):
                with open(os.path.join(d, sub, n), "rb") as f:
                    f.read()
            self.link_put(rtt, c, "cat_cold", time.perf_counter() - t0)
            c.cold()
            # What a viewer waits for before it can show a page: the first 4 KiB of a large
            # file nobody has read here (issue 33: the first READ waited for its whole chunk).
            t0 = time.perf_counter()
            with open(os.path.join(d, big), "rb") as f:
                f.read(4096)
            self.link_put(rtt, c, "first4k_cold", time.perf_counter() - t0)
            c.cold()
            t0 = time.perf_counter()
            with open(os.path.join(d, big), "rb") as f:
                while f.read(MIB):
                    pass
            self.link_put(rtt, c, "read32_cold", 32 / (time.perf_counter() - t0))
            c.cold()
            self.link_put(rtt, c, "ls_cold", self.ls(os.path.join(d, "flat")))
        finally:
            c.unmount()
            c.stop_server()
            kill_proc(proxy)

    def link_report(self, contenders):
        a = self.a
        rate = a.link_mbit * 1e6 / 8 / MIB  # MiB/s
        rows = [
            ("small_stored", "Copy %d documents of 4 KiB in, until stored" % LINK_DOCS, "s",
             lambda rtt: 3 * rtt / 1000 + self.doc_bytes / MIB / rate),
            ("cat_cold", "`cat` of the %d documents, cold" % LINK_DOCS, "s",
             lambda rtt: rtt / 1000 + self.doc_bytes / MIB / rate),
            ("ls_cold", "`ls -l` of %s files, cold" % commas(LINK_LS_FILES), "s",
             lambda rtt: rtt / 1000),
            ("first4k_cold", "First 4 KiB of a 32 MiB file, cold", "s",
             lambda rtt: rtt / 1000 + 4096 / MIB / rate),
            ("read32_cold", "Read 32 MiB, cold", "MiB/s", lambda rtt: rate),
            ("copy16_stored", "Copy 16 MiB in, until stored", "s",
             lambda rtt: 16 / rate + rtt / 1000),
        ]
        out = ["# vaultfs over a link", "",
               "`scripts/bench --link %s --link-mbit %g --runs %d`, %s. Each contender mounts "
               "through its own link proxy (`scripts/linkproxy.py`: %g Mbit/s each way, the round "
               "trip below, one more round trip per new connection) in front of its server on "
               "loopback: vaultfs remote on `vaultfs serve`, rclone mount (`--vfs-cache-mode "
               "writes --vfs-write-back 0s`) on `rclone serve webdav`. Medians of the runs "
               "(min-max); the link's limit is what the round trips and the bytes alone cost."
               % (",".join("%g" % x for x in a.link), a.link_mbit, a.runs,
                  time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), a.link_mbit), ""]
        for rtt in a.link:
            out += ["## %g ms round trip" % rtt, "",
                    "| workload | " + " | ".join(c.label for c in contenders) +
                    " | vaultfs vs rclone | the link's limit |",
                    "|---|" + "---:|" * (len(contenders) + 2)]
            for key, label, unit, limit in rows:
                cells, med = [], {}
                for c in contenders:
                    v = self.link_res.get((rtt, c.key, key))
                    if not v:
                        cells.append("n/a")
                        continue
                    med[c.key] = statistics.median(v)
                    cells.append("%.3g %s (%.3g-%.3g)" % (med[c.key], unit, min(v), max(v)))
                ratio = "n/a"
                if "vaultfs-remote" in med and "rclone-webdav" in med:
                    x = med["rclone-webdav"] / med["vaultfs-remote"]
                    ratio = "%.2fx" % (1 / x if unit == "MiB/s" else x)
                out.append("| %s | %s | %s | %.3g %s |" % (label, " | ".join(cells), ratio,
                                                           limit(rtt), unit))
            out.append("")
        write_kept(a.out, "\n".join(out))
        log("wrote %s" % a.out)
