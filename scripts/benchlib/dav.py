"""dav: WebDAV through rclone's webdav client (issue 50): `vaultfs serve` (its /dav/, signed in
with an app password) against `rclone serve webdav` of a plain folder, both on loopback; --files
small documents PUT and GET, and a SIZE file of random bytes PUT and GET, `rclone copy` in and
out, timed with the wall clock, every byte checked."""

import filecmp
import hashlib
import math
import os
import random
import shutil
import struct
import time
import urllib.parse
import zlib

from .contenders import Rclone, Vaultfs
from .fixtures import WORDS
from .pages import Page, cell, med, met, ratio
from .search import search_pdf
from .setup import Harness, drop_caches
from .util import MIB, VAULT_ROOT, commas, die, human, log, proc_cpu, proc_kib, run

KIB = 1024
TARGET = 0.8          # issue 50: vaultfs >= 0.8x rclone serve webdav, each workload
XFER_TIMEOUT = 1800   # seconds: the most one `rclone copy` may take
# (kind, extension, share of the documents): notes and Markdown mostly, a few PDFs and images.
KINDS = [("note", ".txt", 45), ("spec", ".md", 35), ("scan", ".pdf", 7), ("shot", ".png", 6),
         ("photo", ".jpg", 7)]
WORKLOADS = [  # metric, what, the files it moves (None: the big file)
    ("docs_put", "PUT", "docs"), ("docs_get", "GET", "docs"),
    ("big_put", "PUT", "big"), ("big_get", "GET", "big")]


# --- the documents ----------------------------------------------------------------------------

def prose(rnd, size, markdown=False):
    """About SIZE bytes of text as people write it: sentences of WORDS in paragraphs; Markdown
    with a title, sections and lists."""
    out, n, k = ["# " + " ".join(rnd.choice(WORDS) for _ in range(4)).title(), ""] \
        if markdown else [], 0, 0
    while n < size:
        words = [rnd.choice(WORDS) for _ in range(rnd.randint(6, 14))]
        line = " ".join(words).capitalize() + "."
        if markdown and k % 9 == 0:
            line = "\n## %s\n" % " ".join(words[:3]).title()
        elif markdown and k % 4 == 0:
            line = "- " + line
        elif k % 5 == 4:
            line += "\n"
        out.append(line)
        n += len(line) + 1
        k += 1
    return ("\n".join(out) + "\n").encode()


def png(rnd, size):
    """A PNG (RGB, 8 bits) of about SIZE bytes: a gradient with noise, as a photo or screenshot
    compresses."""
    side = max(8, int(math.sqrt(size / 0.8 / 3)))
    rows = []
    for y in range(side):
        row = bytearray(1 + 3 * side)  # filter byte 0, then RGB
        for x in range(side):
            for c in range(3):
                row[1 + 3 * x + c] = (x + 2 * y + 60 * c + rnd.randrange(64)) & 0xFF
        rows.append(bytes(row))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(
            ">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 2, 0,
                                                                0, 0)) +
            chunk(b"IDAT", zlib.compress(b"".join(rows), 6)) + chunk(b"IEND", b""))


def jpeg(rnd, size):
    """JPEG-shaped bytes of SIZE: a JFIF header, random bytes (0xFF stuffed, as in a scan) as
    the compressed picture, the end marker. Nothing here decodes them."""
    body = rnd.randbytes(size - 24).replace(b"\xff", b"\xff\x00")
    return (b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00" + body +
            b"\xff\xd9")


def make_documents(folder, n, seed):
    """N documents of 2-60 KiB in FOLDER (from SEED: each run's differ, since a store keeps one
    copy of equal bytes): notes (.txt) and Markdown from a log-normal size (median ~8 KiB), a few
    PDFs with a text layer, PNG and JPEG images. Returns their bytes in all."""
    rnd = random.Random(seed)
    kinds = [(k, ext) for k, ext, share in KINDS for _ in range(share)]
    os.makedirs(folder)
    total = 0
    for i in range(n):
        kind, ext = kinds[i * len(kinds) // n]  # each kind its share, in turn
        size = int(min(56 * KIB, max(2 * KIB, rnd.lognormvariate(math.log(8 * KIB), 0.8))))
        if ext == ".pdf":
            text = prose(rnd, size * 0.85).decode()
            data = search_pdf([line.strip() for line in text.splitlines() if line.strip()])
        elif ext == ".png":
            data = png(rnd, size)
        elif ext == ".jpg":
            data = jpeg(rnd, size)
        else:
            data = prose(rnd, size, ext == ".md")
        with open(os.path.join(folder, "%s-%03d%s" % (kind, i, ext)), "wb") as f:
            f.write(data)
        total += len(data)
    return total


def md5_of(path):
    h = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(8 * MIB), b""):
            h.update(block)
    return h.hexdigest()


# --- the contenders ---------------------------------------------------------------------------

class DavVaultfs(Vaultfs):
    """`vaultfs serve` on the built-in store, WebDAV at /dav/ACCOUNT/VAULT/, HTTP Basic with the
    user's e-mail and an app password (`vaultfs user app-password add`)."""

    def __init__(self, h):
        super().__init__(h, True, key="vaultfs", label="vaultfs serve")
        p = run([self.bin, "user", "app-password", "add", self.email, "scripts/bench",
                 "--data-dir", self.store], env=h.vaultfs_env)
        words = [w for w in p.stdout.split() if len(w.replace("-", "")) == 24]
        if not words:
            die("no app password in: %r" % p.stdout)
        self.url = "%s/dav/%s/" % (self.base, urllib.parse.quote(VAULT_ROOT))
        self.user, self.secret = self.email, words[-1]


class DavRclone(Rclone):
    """`rclone serve webdav` of a plain folder, no sign-in."""

    def __init__(self, h):
        super().__init__(h, True)
        self.key, self.label = "rclone", "rclone serve webdav"
        self.url = "http://127.0.0.1:%d/" % self.port
        self.user = self.secret = None


def quoted(value):
    """A value of an rclone connection string, quoted (its ' doubled)."""
    return "'%s'" % value.replace("'", "''")


class DavBench(Harness):
    TOOLS = ("rclone",)

    def rec(self, c, metric, value):
        self.res.setdefault((c.key, metric), []).append(value)
        log("  %-8s %-12s %.4g" % (c.key, metric, value))

    def remote(self, c, path):
        """The on-the-fly remote of C's server (rclone's webdav backend), at PATH."""
        opts = ["url=" + quoted(c.url), "vendor=other"]
        if c.user:
            obscured = run(["rclone", "obscure", "--", c.secret], env=self.rclone_env)
            opts += ["user=" + quoted(c.user), "pass=" + quoted(obscured.stdout.strip())]
        return ":webdav,%s:%s" % (",".join(opts), path)

    def rclone_copy(self, src, dst):
        """`rclone copy SRC DST` with rclone's defaults: its seconds, wall clock."""
        t0 = time.perf_counter()
        run(["rclone", "copy", src, dst], timeout=XFER_TIMEOUT, env=self.rclone_env)
        return time.perf_counter() - t0

    def main(self):
        a = self.a
        self.docs_bytes = {}
        self.big = os.path.join(self.work, "big", "big.bin")
        os.makedirs(os.path.dirname(self.big))
        log("generating %s of random bytes" % human(a.size))
        with open(self.big, "wb") as f:
            for _ in range(a.size // MIB):
                f.write(os.urandom(MIB))
        contenders = [DavVaultfs(self), DavRclone(self)]
        for r in range(a.runs):
            docs = os.path.join(self.work, "docs-%d" % r)
            self.docs_bytes[r] = make_documents(docs, a.files, 50_000 + r)
            with open(self.big, "r+b") as f:  # new bytes each run (see make_documents)
                f.write(os.urandom(16))
            self.big_md5 = md5_of(self.big)
            for c in (contenders if r % 2 == 0 else contenders[::-1]):
                log("run %d/%d: %s" % (r + 1, a.runs, c.label))
                self.one_run(c, r, docs)
                self.trim()
            shutil.rmtree(docs)
        self.page(contenders)

    def one_run(self, c, r, docs):
        """C's server started afresh; the four workloads, each into a fresh folder; stopped."""
        c.rss = {"server": 0}
        c.start_server()
        try:
            out = os.path.join(self.work, "out")
            for metric, _, what in WORKLOADS:
                shutil.rmtree(out, ignore_errors=True)
                src = docs if what == "docs" else os.path.dirname(self.big)
                drop_caches()  # GET: cold; PUT: the source read back in, untimed
                if metric.endswith("_put"):
                    for name in os.listdir(src):
                        with open(os.path.join(src, name), "rb") as f:
                            while f.read(8 * MIB):
                                pass
                cpu = proc_cpu(c.server.pid)
                if metric.endswith("_put"):
                    secs = self.rclone_copy(src, self.remote(c, "%s-%d" % (what, r)))
                else:
                    secs = self.rclone_copy(self.remote(c, "%s-%d" % (what, r)), out)
                self.rec(c, metric, secs)
                self.rec(c, metric + "_cpu", proc_cpu(c.server.pid) - cpu)
                if metric == "docs_get":
                    self.check_docs(c, docs, out)
                elif metric == "big_get":
                    got = os.path.join(out, "big.bin")
                    if not os.path.isfile(got) or os.path.getsize(got) != self.a.size or \
                            md5_of(got) != self.big_md5:
                        die("%s: the %s file came back different" % (c.label, human(self.a.size)))
            shutil.rmtree(out, ignore_errors=True)
            self.rec(c, "rss", proc_kib(c.server.pid, "VmHWM") / 1024)
        finally:
            c.stop_server()

    def check_docs(self, c, docs, out):
        names = sorted(os.listdir(docs))
        got = sorted(os.listdir(out)) if os.path.isdir(out) else []
        if got != names:
            die("%s: %d documents came back of %d" % (c.label, len(got), len(names)))
        _, bad, errors = filecmp.cmpfiles(docs, out, names, shallow=False)
        if bad or errors:
            die("%s: documents differ: %s" % (c.label, ", ".join((bad + errors)[:5])))

    # --- the page -----------------------------------------------------------------------------

    def page(self, contenders):
        a, R = self.a, self.res
        v, rc = contenders
        n, size = a.files, human(a.size)
        docs_mib = sorted(self.docs_bytes.values())[len(self.docs_bytes) // 2] / MIB

        def rate(key, metric):
            t = med(R.get((key, metric)))
            if t is None:
                return "-"
            return "%s files/s" % commas(int(round(n / t))) if metric.startswith("docs") else \
                "%.0f MiB/s" % (a.size / MIB / t)

        def speed(metric):  # rclone's time over vaultfs's: > 1 is vaultfs faster
            x, y = med(R.get((v.key, metric))), med(R.get((rc.key, metric)))
            return y / x if x and y else None

        label = {"docs": "%d small documents (%.1f MiB)" % (n, docs_mib), "big": "One %s file "
                 "of random bytes" % size}
        P = Page(self, "WebDAV: vaultfs serve against rclone serve webdav",
                 "Both servers on loopback, started afresh for each run, their files on the "
                 "same scratch file system; one client for both: rclone's webdav backend "
                 "(`rclone copy`, its defaults). Seconds, wall clock: medians of the runs "
                 "(min–max); *vaultfs vs rclone* is rclone's time over vaultfs's (above 1: "
                 "vaultfs faster).")
        P.w("## Through rclone's webdav client", "")
        P.table(["Workload", "vaultfs serve", "rclone serve webdav", "vaultfs vs rclone"], [
            ["%s %s, s" % (label[what], verb), cell(R.get((v.key, m)), "s") + ", " +
             rate(v.key, m), cell(R.get((rc.key, m)), "s") + ", " + rate(rc.key, m),
             ratio(med(R.get((v.key, m))), med(R.get((rc.key, m))), higher_better=False)]
            for m, verb, what in WORKLOADS], right=1)
        P.table(["Server", "vaultfs serve", "rclone serve webdav"], [
            ["CPU time (user + system) during %s %s, s" % (label[what][0].lower() +
                                                           label[what][1:], verb),
             cell(R.get((v.key, m + "_cpu")), "s"), cell(R.get((rc.key, m + "_cpu")), "s")]
            for m, verb, what in WORKLOADS] + [
            ["Peak RSS (VmHWM) at the end of a run, MiB", cell(R.get((v.key, "rss")), "MiB"),
             cell(R.get((rc.key, "rss")), "MiB")]], right=1)
        P.targets([["Issue 50: %s %s through rclone: vaultfs ≥ %gx rclone serve webdav" % (
            label[what], verb, TARGET), "%s (%s s against %s s)" % (
                ratio(med(R.get((v.key, m))), med(R.get((rc.key, m))), False),
                cell(R.get((v.key, m)), "s").split()[0], cell(R.get((rc.key, m)), "s").split()[0]),
            met(speed(m), ">=", TARGET)] for m, verb, what in WORKLOADS])
        ver = run(["rclone", "version"], check=False).stdout.splitlines()
        P.write([
            "Servers: `vaultfs serve --data-dir STORE --listen 127.0.0.1:PORT` (the built-in "
            "store, a user of account `Local` made with `vaultfs user add`, an app password "
            "with `vaultfs user app-password add`; WebDAV at `/dav/Local/My%20First%20Vault/`, "
            "HTTP Basic with the e-mail and the app password, accepted over plain HTTP from "
            "loopback), and `rclone serve webdav DIR --addr 127.0.0.1:PORT` of an empty folder "
            "(no sign-in). Each run starts both afresh (one after the other, the order "
            "alternating from run to run) and stops them at its end; the stores stay from run "
            "to run.",
            "Client: %s, the same for both: `rclone copy SRC DST` with an on-the-fly remote "
            "`:webdav,url='URL',vendor=other[,user='E-MAIL',pass='OBSCURED']:FOLDER` and "
            "rclone's defaults (`--transfers 4 --checkers 8`; a download over 250 MiB in 4 "
            "streams of range requests, `--multi-thread-streams 4`). `vendor=other`: neither "
            "server gives checksums rclone's webdav client reads, so rclone checks sizes; the "
            "harness checks the bytes." % (ver[0] if ver else "rclone"),
            "**Documents**: %d files of 2-60 KiB, new ones each run (a store keeps one copy of "
            "equal bytes), the same for both servers within a run: notes (.txt, 45%%) and "
            "Markdown (35%%) of words from scripts/benchlib/fixtures.py, sizes log-normal "
            "around 8 KiB; PDFs with a text layer (7%%, as search.py makes them); PNG images "
            "(6%%, a noisy gradient) and JPEG-shaped files (7%%: a JFIF header and random bytes, "
            "not decodable; nothing decodes them here). **Big file**: %s of /dev/urandom "
            "bytes, its first 16 bytes new each run." % (n, size),
            "**PUT**: `rclone copy LOCAL remote:FOLDER-RUN` into a folder that does not exist "
            "yet; before it (untimed) `syncfs` of the scratch file system, the page cache "
            "dropped, the source read back into it. **GET**: `rclone copy remote:FOLDER-RUN "
            "OUT` into a fresh local folder, cold (the page cache dropped first, servers "
            "running); then every document compared byte for byte with its source (names "
            "too), the big file by size and md5. Rates: %d files, or %s, over the median time." % (
                n, size),
            "**Server CPU time**: user + system of the server process (children included), "
            "from /proc, across the copy; **RSS**: its VmHWM before it is stopped.",
        ])
