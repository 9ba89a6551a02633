"""shared: the server's transfers, listing and concurrent uploads on each store engine: the
built-in store (SQLite and a blob folder, one machine) and the shared store (PostgreSQL and an
S3-compatible server), the latter's uploads also against 2 and 4 servers of the one store
(issue 34's targets)."""

import os

from .contenders import Vaultfs
from .pages import Page, cell, med, met, ratio
from .server import ServerBench
from .setup import kill_proc
from .stores import start_postgres, start_s3, stop_services
from .util import commas, human, log, machine_cpu, proc_cpu, proc_kib

SQLITE, PG = "sqlite", "pg"


def cpu(procs):
    """CPU seconds of a process (or a list of them) and its children."""
    return sum(proc_cpu(p.pid) for p in (procs if isinstance(procs, list) else [procs]))


class SharedBench(ServerBench):
    def binaries(self):
        super().binaries(remote_bench=False)

    def main(self):
        a = self.a
        self.stop_last = []
        self.services = {}  # name -> process: PostgreSQL, the S3 server (their CPU time)
        log("generating %s of random bytes" % human(a.size))
        self.source(a.size)
        engines = []
        try:
            for e in a.engines:
                engines.append(self.engine(e))
            self.servers = {v.key: ([1] if v.key == SQLITE else a.servers) for v in engines}
            for r in range(a.runs):
                for v in engines[r % len(engines):] + engines[:r % len(engines)]:
                    log("run %d/%d: %s" % (r + 1, a.runs, v.label))
                    self.one_run(v, r)
                    self.trim()
        finally:
            stop_services(self)
        self.labels = {v.key: v.label for v in engines}
        self.page()

    def engine(self, e):
        a = self.a
        if e == SQLITE:
            return Vaultfs(self, True, key=SQLITE, label="SQLite + folder",
                           serve_flags=a.serve_arg)
        if a.database:
            db = a.database
        else:
            db = start_postgres(self)
        if a.blobs:
            kind, flags, env = "your bucket", ["--blobs", a.blobs] + (
                ["--s3-endpoint", a.s3_endpoint] if a.s3_endpoint else []), self.vaultfs_env
        else:
            kind, flags, env = start_s3(self, a.s3)
        self.info["s3_kind"] = kind
        return Vaultfs(self, True, key=PG, label="PostgreSQL + S3 (%s)" % kind,
                       db_flags=["--database", db], serve_flags=flags + a.serve_arg,
                       serve_env=env)

    def one_run(self, v, r):
        n = max(self.servers[v.key])
        v.serve()
        more = v.more_servers(n - 1) if n > 1 else []
        try:
            self.transfers(v.key, v, r)
            self.listing(v.key, v, r)
            procs = dict(self.services if v.key == PG else {},
                         servers=[v.server] + [p for p, _ in more])
            for k in self.servers[v.key]:
                cpu0 = {name: cpu(p) for name, p in procs.items()}
                busy0, total0 = machine_cpu()
                self.uploads(v.key, k, [v.base] + [b for _, b in more[:k - 1]], v)
                busy1, total1 = machine_cpu()
                for name, p in procs.items():
                    self.rec(v.key, "cpu_%s_%d" % (name, k), cpu(p) - cpu0[name])
                if total1 > total0:
                    self.rec(v.key, "busy_%d" % k,
                             (busy1 - busy0) / (total1 - total0) * os.cpu_count())
            self.rec(v.key, "rss_end", proc_kib(v.server.pid, "VmHWM") / 1024)
        finally:
            for p, _ in more:
                kill_proc(p)
            v.stop_server()

    def page(self):
        a, R, L = self.a, self.res, self.labels
        keys = [k for k in (SQLITE, PG) if k in L]
        s = human(a.size)
        g = lambda c, m: R.get((c, m))  # noqa: E731
        m = lambda c, k: med(R.get((c, k)))  # noqa: E731
        P = Page(self, "The store engines: one machine and the shared store",
                 "`vaultfs serve` on %s, on loopback; the same files, the same clients. The "
                 "shared store's PostgreSQL and S3-compatible server run on this machine, on "
                 "the same scratch file system." % " and on ".join(L[k] for k in keys))
        rows = [("up3", "Upload %s, step 3 (`curl -T`), MiB/s" % s, "MiB/s", True),
                ("up_all", "Upload %s, three steps, MiB/s" % s, "MiB/s", True),
                ("dl_cold", "Download %s, cold, MiB/s" % s, "MiB/s", True),
                ("dl_warm", "Download %s, warm, MiB/s" % s, "MiB/s", True),
                ("list_ms", "Listing %s files (`GET ?children=1`, median of 5), ms" % commas(
                    a.files), "ms", False),
                ("create_s", "Creating those %s files (1,000 names a request), s" % commas(
                    a.files), "s", False),
                ("uploads_1", "Uploads/s, %d clients x %d new %s files, one server" % (
                    a.clients, a.client_files, human(a.client_size)), "files/s", True),
                ("rss_end", "Server peak RSS, MiB", "MiB", False)]
        both = SQLITE in keys and PG in keys
        P.w("## Engines", "")
        P.table(["Workload"] + [L[k] for k in keys] + (["PostgreSQL + S3 / SQLite"]
                                                       if both else []),
                [[what] + [cell(g(k, key), unit) for k in keys] +
                 ([ratio(m(PG, key), m(SQLITE, key), hb)] if both else [])
                 for key, what, unit, hb in rows], right=1)
        if not self.upload_clients:
            P.w("examples/upload_clients was not built (nor given): no uploads per second.", "")
        if PG in keys:
            one = m(PG, "uploads_1")
            P.w("## Scale-out: servers of one store (%s)" % L[PG], "")
            names = ["servers"] + list(self.services)
            P.table(["Servers", "Uploads/s", "p50", "p99", "vs one server"] +
                    ["CPU s: %s" % ("vaultfs" if x == "servers" else x) for x in names] +
                    ["Cores busy (of %d)" % os.cpu_count()], [
                [str(n), cell(g(PG, "uploads_%d" % n), "files/s"),
                 cell(g(PG, "uploads_%d_p50" % n), "ms", True),
                 cell(g(PG, "uploads_%d_p99" % n), "ms", True),
                 ratio(m(PG, "uploads_%d" % n), one)] +
                [cell(g(PG, "cpu_%s_%d" % (x, n)), "s") for x in names] +
                [cell(g(PG, "busy_%d" % n), "")]
                for n in a.servers], right=1)
            P.w("CPU s: the CPU time (user + system, children included) of the vaultfs servers, "
                "PostgreSQL and the S3 server during the uploads of that row: where the "
                "uploads' work goes. Cores busy: the machine's CPU time over that row's wall "
                "time, every process (the clients too): at the machine's count of cores, more "
                "servers on it cannot add uploads.", "")
        if both:
            x = lambda k: m(PG, k) and m(SQLITE, k) and m(PG, k) / m(SQLITE, k)  # noqa: E731
            two = m(PG, "uploads_2") and one and m(PG, "uploads_2") / one
            setting = "" if (a.clients, a.size) == (16, 256 << 20) else \
                " (this run: %d clients, %s; the targets are set for 16 clients and 256 MiB)" % (
                    a.clients, s)
            P.targets([
                ["Issue 34: PostgreSQL + S3, one server, small uploads ≥ 0.8x SQLite%s" % setting,
                 ratio(m(PG, "uploads_1"), m(SQLITE, "uploads_1")), met(x("uploads_1"), ">=",
                                                                        0.8)],
                ["Issue 34: two servers ≥ 1.6x one", ratio(m(PG, "uploads_2"), one)
                 if 2 in a.servers else "not run", met(two, ">=", 1.6)],
                ["Issue 34: upload of a %s file (step 3) ≥ 0.8x SQLite's" % s,
                 ratio(m(PG, "up3"), m(SQLITE, "up3")), met(x("up3"), ">=", 0.8)]])
        how = self.how() + [
            "**Engines**: *SQLite + folder* is `vaultfs serve --data-dir` alone (the built-in "
            "store). *PostgreSQL + S3*: `--database` on a PostgreSQL started here (%s; initdb "
            "in the scratch dir, a Unix socket, its durable defaults: fsync and synchronous "
            "commit on; run as user nobody) and `--blobs s3://BUCKET/run --s3-endpoint` on %s; "
            "every server of it has a data dir of its own. %s" % (
                self.info.get("postgres", "yours"), self.info.get("s3", "yours"), S3_NOTE),
            "**Scale-out**: the same store served by N servers at once (the first plus N-1 "
            "more, on ports of their own), the clients spread over them; every figure but "
            "those rows is the first server's. The machine's cores are shared by PostgreSQL, "
            "the S3 server, every `vaultfs serve` and the clients."]
        P.write(how)


S3_NOTE = ("s3s-fs (crates.io, Rust) keeps each object in a file of the scratch file system "
           "and checks every request's signature; it is the default rather than moto (Python, "
           "objects in memory), which was the bottleneck of the shared store's small uploads "
           "(issue 34): in a check on this machine (--quick, 16 clients x 10 files of 64 KiB "
           "a row) s3s-fs spent 0.41-0.48 CPU s a row against moto's 1.33-1.58. Its downloads "
           "are slow (it streams a file in 4 KiB reads through tokio's blocking pool): for the "
           "download rows of the shared store, --s3 moto measures vaultfs more than its S3 "
           "stand-in. Neither fsyncs its objects.")
