"""server: `vaultfs serve` against the raw disk under it (the upload of a large file against an
fsynced write, its download against reads, cold and warm), the server's RSS, a listing of many
files, the client (`RemoteBackend`, examples/remote_bench) against curl, and uploads per second
of concurrent clients (examples/upload_clients). shared.py repeats the server's part on each
store engine."""

import hashlib
import os
import statistics
import time
import urllib.parse

from .api import Api
from .contenders import Vaultfs
from .pages import Page, cell, med, met, ratio
from .setup import Harness, drop_caches
from .util import MIB, VAULT_ROOT, commas, die, human, log, proc_cpu, proc_kib, run

XFER_TIMEOUT = 600  # seconds: the most one transfer may take
BATCH = 1000        # names per create_file request (the default JSON body limit is 64 KiB)


class ServerBench(Harness):
    TOOLS = ("curl", "dd", "fusermount3", "ls")

    def rec(self, col, metric, value):
        self.res.setdefault((col, metric), []).append(value)
        log("  %-14s %-16s %.4g" % (col, metric, value))

    def binaries(self, remote_bench=True):
        """The client programs (release builds, or *_BIN): None for one that does not build."""
        self.remote_bench = remote_bench and self.built(
            "REMOTE_BENCH_BIN", "examples/remote_bench", ["--example", "remote_bench"],
            "examples/remote_bench", needed=False)
        self.upload_clients = self.built(
            "UPLOAD_CLIENTS_BIN", "examples/upload_clients", ["--example", "upload_clients"],
            "examples/upload_clients", needed=False)

    def source(self, size):
        """SIZE random bytes in a file of the scratch dir, and their md5."""
        path = os.path.join(self.work, "src.bin")
        md5 = hashlib.md5()
        with open(path, "wb") as f:
            for _ in range(size // MIB):
                block = os.urandom(MIB)
                md5.update(block)
                f.write(block)
        self.src, self.src_md5 = path, md5.hexdigest()

    def fresh_source(self):
        """New bytes at the start of the source, and its md5 again (which reads it into the page
        cache): a store keeps one copy of equal bytes, so a second upload of the same file would
        skip storing them and measure nothing of the upload."""
        with open(self.src, "r+b") as f:
            f.write(os.urandom(16))
        md5 = hashlib.md5()
        with open(self.src, "rb") as f:
            for block in iter(lambda: f.read(8 * MIB), b""):
                md5.update(block)
        self.src_md5 = md5.hexdigest()

    def warm_source(self):
        """The source in the page cache (untimed): transfers are measured, not its disk."""
        with open(self.src, "rb") as f:
            while f.read(8 * MIB):
                pass

    def main(self):
        a = self.a
        log("generating %s of random bytes" % human(a.size))
        self.source(a.size)
        v = Vaultfs(self, True, key="serve", label="vaultfs serve", serve_flags=a.serve_arg)
        for r in range(a.runs):
            log("run %d/%d" % (r + 1, a.runs))
            self.raw_disk()
            v.serve()
            try:
                self.transfers("serve", v, r)
                self.listing("serve", v, r)
                self.client(v)
                self.uploads("serve", 1, [v.base], v)
                self.rec("serve", "rss_end", proc_kib(v.server.pid, "VmHWM") / 1024)
            finally:
                v.stop_server()
            self.trim()
        self.page()

    # --- the measurements -------------------------------------------------------------------

    def raw_disk(self):
        """`dd conv=fsync` of the source into a new file, then reads of it cold and warm."""
        raw, size = os.path.join(self.work, "raw.bin"), self.a.size
        self.warm_source()
        for metric, cmd in (("write", ["dd", "if=" + self.src, "of=" + raw, "bs=1M",
                                       "conv=fsync", "status=none"]),
                            ("read_cold", ["dd", "if=" + raw, "of=/dev/null", "bs=1M",
                                           "status=none"]),
                            ("read_warm", ["dd", "if=" + raw, "of=/dev/null", "bs=1M",
                                           "status=none"])):
            if metric == "read_cold":
                drop_caches()
            t0 = time.perf_counter()
            run(cmd, timeout=XFER_TIMEOUT)
            self.rec("raw", metric, size / (time.perf_counter() - t0) / MIB)
        os.unlink(raw)

    def curl(self, v, args):
        """curl as the user, with -w FORMAT last in ARGS: the fields it printed."""
        p = run(["curl", "-sS", "-u", "%s:%s" % (v.email, v.token), "--max-time",
                 str(XFER_TIMEOUT)] + args, timeout=XFER_TIMEOUT + 30)
        return p.stdout.split()

    def transfers(self, col, v, r):
        """The three-step upload of the source (steps 1 and 2 as JSON calls, step 3 `curl -T`),
        its download cold and warm (curl), the md5 of the bytes back (first run), the server's
        CPU time and peak RSS."""
        size = self.a.size
        api = Api(v.base, v.email, v.token)
        api.connect()
        self.fresh_source()
        self.warm_source()
        name = "big-%d.bin" % r
        t0 = time.perf_counter()
        msg = api.json("PUT", "/nodes/pth/" + urllib.parse.quote(VAULT_ROOT),
                       {"create_file": [{"name": name}]})
        fid = next(c["id"] for c in msg["children"] if c.get("name") == name)
        msg = api.json("PUT", "/nodes/upload/%s" % fid, {"length": size,
                                                         "md5_checksum": self.src_md5})
        uri = msg["fileExProperties"]["upload_uri"]
        t12 = time.perf_counter()
        cpu = proc_cpu(v.server.pid)
        out = os.path.join(self.work, "step3.json")
        code, secs = self.curl(v, ["-T", self.src, "-H", "Content-Type: application/binary",
                                   "-H", "Expect:", "-o", out, "-w", "%{http_code} %{time_total}",
                                   v.base + uri])
        t1 = time.perf_counter()
        with open(out) as f:
            body = f.read()
        if code != "200" or '"success":true' not in body.replace(" ", ""):
            die("upload step 3: HTTP %s %s" % (code, body[:500]))
        self.rec(col, "cpu_up", proc_cpu(v.server.pid) - cpu)
        self.rec(col, "up3", size / float(secs) / MIB)
        self.rec(col, "up_all", size / (t1 - t0) / MIB)
        self.rec(col, "steps12_ms", (t12 - t0) * 1000)
        url = "%s/files/id/Document/%s" % (v.base, fid)
        for metric in ("dl_cold", "dl_warm"):
            if metric == "dl_cold":
                drop_caches()
            cpu = proc_cpu(v.server.pid)
            code, secs, n = self.curl(v, ["-o", "/dev/null", "-w",
                                          "%{http_code} %{time_total} %{size_download}", url])
            if code != "200" or int(n) != size:
                die("download: HTTP %s, %s bytes of %s" % (code, n, size))
            self.rec(col, "cpu_" + metric, proc_cpu(v.server.pid) - cpu)
            self.rec(col, metric, size / float(secs) / MIB)
        if r == 0:
            p = run(["sh", "-c", 'curl -sS -u "$0" --max-time %d "$1" | md5sum' % XFER_TIMEOUT,
                     "%s:%s" % (v.email, v.token), url], timeout=XFER_TIMEOUT + 30)
            self.info["md5_ok_" + col] = p.stdout.split()[0] == self.src_md5
        self.rec(col, "rss_xfer", proc_kib(v.server.pid, "VmHWM") / 1024)

    def listing(self, col, v, r):
        """--files names made in a new folder (BATCH a request), then `GET ?children=1` of it:
        once to check the count, then timed 5 times on one kept-alive connection."""
        n = self.a.files
        api = Api(v.base, v.email, v.token)
        api.connect()
        folder = "/nodes/pth/" + urllib.parse.quote("%s/list-%d" % (VAULT_ROOT, r))
        api.json("PUT", folder, {})
        t0 = time.perf_counter()
        for k in range(0, n, BATCH):
            api.json("PUT", folder, {"create_file": [{"name": "file-%05d.txt" % i}
                                                     for i in range(k, min(n, k + BATCH))]})
        self.rec(col, "create_s", time.perf_counter() - t0)
        resp, body = api.call("GET", folder + "?children=1")
        listed = body.count(b'"nodeType":"FileNodeType"')
        if resp.status != 200 or listed != n:
            die("listing: HTTP %d, %d files of %d" % (resp.status, listed, n))
        self.info["list_bytes"] = len(body)
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            resp, body = api.call("GET", folder + "?children=1")
            times.append((time.perf_counter() - t0) * 1000)
        self.rec(col, "list_ms", statistics.median(times))

    def client(self, v):
        """examples/remote_bench on the source: the upload, two downloads (the first cold),
        2,000 stats, through `RemoteBackend`."""
        if not self.remote_bench:
            return
        self.fresh_source()
        self.warm_source()
        p = run([self.remote_bench, "--url", v.base, "--email", v.email, "--folder", VAULT_ROOT,
                 "--file", self.src, "--server-pid", str(v.server.pid), "--drop-caches"],
                timeout=XFER_TIMEOUT * 3, check=False,
                env=dict(self.vaultfs_env, VAULTFS_TOKEN=v.token))
        if p.returncode != 0:
            log("remote_bench failed: %s" % p.stderr.strip()[-500:])
            return
        kv = dict(line.split("=", 1) for line in p.stdout.split() if "=" in line)
        size = self.a.size
        for metric, key in (("up3", "upload_step3_s"), ("up_all", "upload_s"),
                            ("up_hash", "upload_with_hash_s"), ("dl_warm", "download2_s")):
            self.rec("client", metric, size / float(kv[key]) / MIB)
        cold = kv.get("download_cold_s") or kv["download_first_s"]
        self.rec("client", "dl_cold", size / float(cold) / MIB)
        for key in ("stat_per_s", "stat_p50_us", "stat_p99_us", "hash_mibps"):
            self.rec("client", key, float(kv[key]))

    def next_seed(self):
        """Another seed of upload_clients' bytes: bytes the store holds already would store no
        new blob (the uploads of every row after the first would skip the blob store)."""
        self.seed = getattr(self, "seed", 0) + 1
        return self.seed

    def uploads(self, col, nservers, bases, v, accounts=1):
        """examples/upload_clients: --clients clients against BASES (client i to server i mod
        n), each uploading --client-files new files of --client-size bytes; with ACCOUNTS > 1
        the clients are spread over that many users of accounts of their own (the figures'
        names then end in _aN). Returns upload_clients' key=value answer (None: not built)."""
        a = self.a
        if not self.upload_clients:
            return None
        log("  uploads: %d clients of %d account(s) x %d files of %s against %d server(s)" % (
            a.clients, accounts, a.client_files, human(a.client_size), nservers))
        users = [(v.email, v.token, VAULT_ROOT)] + (
            v.more_users(accounts - 1) if accounts > 1 else [])
        cmd = [self.upload_clients, "--clients", str(a.clients), "--files", str(a.client_files),
               "--size", str(a.client_size), "--seed", str(self.next_seed())]
        for email, _, folder in users:
            cmd += ["--email", email, "--folder", folder]
        for b in bases:
            cmd += ["--url", b]
        p = run(cmd, timeout=XFER_TIMEOUT * 3, check=False,
                env=dict(self.vaultfs_env, VAULTFS_TOKEN=",".join(t for _, t, _ in users)))
        if p.returncode != 0:
            die("upload_clients failed: %s" % p.stderr.strip()[-500:])
        kv = dict(line.split("=", 1) for line in p.stdout.split() if "=" in line)
        key = "uploads_%d" % nservers + ("_a%d" % accounts if accounts > 1 else "")
        self.rec(col, key, float(kv["uploads_per_s"]))
        self.rec(col, key + "_p50", float(kv["p50_ms"]))
        self.rec(col, key + "_p99", float(kv["p99_ms"]))
        return kv

    # --- the page ---------------------------------------------------------------------------

    def page(self):
        a, R = self.a, self.res
        s = human(a.size)
        g = lambda c, m: R.get((c, m))  # noqa: E731
        m = lambda c, k: med(R.get((c, k)))  # noqa: E731
        P = Page(self, "vaultfs serve against the raw disk",
                 "`vaultfs serve` on the built-in store (SQLite + a blob folder) on loopback, "
                 "and the raw disk under it: the same scratch file system, the same %s file of "
                 "random bytes." % s)
        P.w("## Server", "")
        P.table(["Workload", "vaultfs", "Raw disk", "Ratio", "Target", "Met"], [
            ["Upload %s (step 3, `curl -T`) vs fsynced write (`dd conv=fsync`), MiB/s" % s,
             cell(g("serve", "up3"), "MiB/s"), cell(g("raw", "write"), "MiB/s"),
             ratio(m("serve", "up3"), m("raw", "write")), "≥ 0.5x",
             met(m("serve", "up3") and m("serve", "up3") / m("raw", "write"), ">=", 0.5)],
            ["Download %s, cold, MiB/s" % s, cell(g("serve", "dl_cold"), "MiB/s"),
             cell(g("raw", "read_cold"), "MiB/s"),
             ratio(m("serve", "dl_cold"), m("raw", "read_cold")), "≥ 0.6x",
             met(m("serve", "dl_cold") and m("serve", "dl_cold") / m("raw", "read_cold"), ">=",
                 0.6)],
            ["Download %s, warm, MiB/s" % s, cell(g("serve", "dl_warm"), "MiB/s"),
             cell(g("raw", "read_warm"), "MiB/s"),
             ratio(m("serve", "dl_warm"), m("raw", "read_warm")), "-", "-"],
            ["Server peak RSS after the upload and downloads, MiB",
             cell(g("serve", "rss_xfer"), "MiB"), "-", "-", "< 64 MiB",
             met(m("serve", "rss_xfer"), "<", 64)],
            ["Listing %s files (`GET ?children=1`, median of 5), ms" % commas(a.files),
             cell(g("serve", "list_ms"), "ms"), "-", "-", "< 200 ms",
             met(m("serve", "list_ms"), "<", 200)],
            ["Server peak RSS at the end (listing, clients included), MiB",
             cell(g("serve", "rss_end"), "MiB"), "-", "-", "< 64 MiB",
             met(m("serve", "rss_end"), "<", 64)],
        ], right=1)
        P.w("- Upload, all three steps: %s MiB/s (steps 1 and 2: %s ms). Creating the %s "
            "names of the listing (%s a request): %s s." % (
                cell(g("serve", "up_all"), "MiB/s"), cell(g("serve", "steps12_ms"), "ms"),
                commas(a.files), commas(BATCH), cell(g("serve", "create_s"), "s")),
            "- Server CPU time (user + system, children included): upload step 3 %s s, cold "
            "download %s s, warm %s s." % (cell(g("serve", "cpu_up"), "s"),
                                          cell(g("serve", "cpu_dl_cold"), "s"),
                                          cell(g("serve", "cpu_dl_warm"), "s")),
            "- md5 of the downloaded bytes equals the original's: %s." % (
                "yes" if self.info.get("md5_ok_serve") else "**NO**"), "")
        if R.get(("client", "up3")):
            over = lambda k: "%+.0f%%" % (100 * (m("serve", k) / m("client", k) - 1))  # noqa
            ok = lambda k: met(m("serve", k) / m("client", k) - 1, "<", 0.2)  # noqa: E731
            P.w("## Client side: `RemoteBackend` (examples/remote_bench.rs) vs curl", "")
            rows = []
            for k, what in (("up3", "Upload %s, step 3" % s), ("up_all", "Upload %s, three "
                                                                         "steps" % s),
                            ("dl_cold", "Download %s, cold" % s),
                            ("dl_warm", "Download %s, warm" % s)):
                rows.append([what + ", MiB/s", cell(g("serve", k), "MiB/s"),
                             cell(g("client", k), "MiB/s"), over(k), "< +20%", ok(k)])
            rows.append(["Upload %s, md5 first + three steps (as the mount does), MiB/s" % s,
                         "-", cell(g("client", "up_hash"), "MiB/s"), "-", "-", "-"])
            rows.append(["Stat (`node()`) round trips, one after another, per second", "-",
                         "%s (p50 %s µs, p99 %s µs)" % (
                             cell(g("client", "stat_per_s"), "files/s"),
                             cell(g("client", "stat_p50_us"), "ms"),
                             cell(g("client", "stat_p99_us"), "ms")), "-", "≥ 1,000/s",
                         met(m("client", "stat_per_s"), ">=", 1000)])
            P.table(["Workload", "curl", "RemoteBackend", "Client adds (time)", "Target", "Met"],
                    rows, right=1)
        for prog, what in ((self.remote_bench, "remote_bench"),
                           (self.upload_clients, "upload_clients")):
            if not prog:
                P.w("- examples/%s was not built (nor given): its figures are missing." % what,
                    "")
        if R.get(("serve", "uploads_1")):
            P.w("## Concurrent uploads", "")
            P.table(["Clients x files", "Uploads/s", "p50", "p99"], [[
                "%d x %d new files of %s (three steps, md5)" % (
                    a.clients, a.client_files, human(a.client_size)),
                cell(g("serve", "uploads_1"), "files/s"),
                cell(g("serve", "uploads_1_p50"), "ms", True),
                cell(g("serve", "uploads_1_p99"), "ms", True)]], right=1)
        P.write(self.how() + [
            "**Raw disk**: `dd if=SRC of=FILE bs=1M conv=fsync` on the scratch file system, "
            "then `dd` reads of FILE with the page cache dropped (cold) and again (warm). "
            "**Client side**: examples/remote_bench (a release build, or REMOTE_BENCH_BIN) uploads the same file "
            "again (its md5 first, as the mount does), downloads it twice (the first after "
            "dropping the page cache) and calls `node()` 2,000 times on one connection; "
            "*client adds* is its time over curl's, minus 1."])

    def how(self):
        a = self.a
        return [
            "Each run starts the servers afresh (a user of account `Local`, a token through "
            "the pin page) and stops them at its end; the source file is read into the page "
            "cache before each transfer (untimed). Cold: `syncfs` of the scratch file system, "
            "then `echo 3 > /proc/sys/vm/drop_caches` (the server keeps running).",
            "**Upload**: step 1 (`create_file`) and step 2 (the length and md5) as JSON calls "
            "on one kept-alive connection, step 3 `curl -T SRC` (MiB/s: the size over curl's "
            "`time_total`); *three steps*: from step 1 to curl's exit. **Download**: `curl -o "
            "/dev/null` of `/files/id/Document/ID`, its `time_total`. **RSS**: the server's "
            "VmHWM. **Listing**: %s names in a new folder through `create_file` (%s a request),"
            " then `GET ?children=1` from the harness on one kept-alive connection (the count "
            "checked once, then the median of 5)." % (commas(a.files), commas(BATCH)),
            "**Concurrent uploads**: examples/upload_clients (a release build, or UPLOAD_CLIENTS_BIN): "
            "%d clients, each "
            "with its own `RemoteBackend`, each uploading %d new files of %s one after another "
            "(three steps, md5; every file's bytes differ), client *i* to server *i mod n*; "
            "uploads per second over the whole, and the latency percentiles of one upload." % (
                a.clients, a.client_files, human(a.client_size))]
