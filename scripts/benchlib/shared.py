"""shared: the server's transfers, listing and concurrent uploads on each store engine: the
built-in store (SQLite and a blob folder, one machine) and the shared store (PostgreSQL and an
S3-compatible server), the latter's uploads also against 2 and 4 servers of the one store
(issue 34's targets)."""

import os
import shutil
import subprocess
import threading
import time

from .contenders import Vaultfs
from .pages import Page, cell, med, met, ratio
from .server import ServerBench
from .setup import kill_proc
from .stores import start_postgres, start_s3, stop_services
from .util import commas, human, log, machine_cpu, proc_cpu, proc_kib

SQLITE, PG = "sqlite", "pg"

# The first key of an account's writers' lock (src/store/db/conn.rs, ACCOUNT_LOCK_CLASS, "vfa1").
ACCOUNT_LOCK_CLASS = 0x76666131

# The first keys of the store's advisory locks: the writers' key (its high half, one-key), an
# account's writers', a blob's (src/store/db).
LOCK_NAMES = {0x7661756c: "writers' key", ACCOUNT_LOCK_CLASS: "account", 0x76666231: "blob"}

# Each lock a backend of the bench database waits for, from one snapshot of pg_locks: its kind
# (the advisory lock's first key), the account whose writers' lock the waiter holds or waits
# for, that of each backend it waits for (-1: none; pg_blocking_pids, which also names the
# waiters queued ahead for the same lock), and whether that backend holds or waits for the same
# lock in the snapshot (pg_blocking_pids is asked later: a pooled connection may have moved on
# to another account's transaction meanwhile; such pairs are counted apart, as stale).
WAITS_SQL = """
WITH lk AS MATERIALIZED (SELECT * FROM pg_locks),
acc AS (SELECT pid, CAST(objid AS BIGINT) AS account FROM lk
        WHERE locktype = 'advisory' AND classid = %d AND objsubid = 2),
w AS (SELECT l.*, unnest(pg_blocking_pids(l.pid)) AS blocker FROM lk l
      WHERE NOT l.granted AND l.pid IN (SELECT pid FROM pg_stat_activity
                                        WHERE datname = current_database()))
SELECT w.locktype || ':' || coalesce(CAST(w.classid AS BIGINT), 0)
       || '|' || coalesce((SELECT min(account) FROM acc WHERE acc.pid = w.pid), -1)
       || '|' || coalesce((SELECT min(account) FROM acc WHERE acc.pid = w.blocker), -1)
       || '|' || CAST(EXISTS (SELECT 1 FROM lk b WHERE b.pid = w.blocker
              AND b.locktype = w.locktype
              AND b.database IS NOT DISTINCT FROM w.database
              AND b.relation IS NOT DISTINCT FROM w.relation
              AND b.page IS NOT DISTINCT FROM w.page AND b.tuple IS NOT DISTINCT FROM w.tuple
              AND b.virtualxid IS NOT DISTINCT FROM w.virtualxid
              AND b.transactionid IS NOT DISTINCT FROM w.transactionid
              AND b.classid IS NOT DISTINCT FROM w.classid
              AND b.objid IS NOT DISTINCT FROM w.objid
              AND b.objsubid IS NOT DISTINCT FROM w.objsubid) AS TEXT)
FROM w;
\\echo __end__
""" % ACCOUNT_LOCK_CLASS


class LockWaits:
    """PostgreSQL's lock waits, sampled every 100 ms by one psql session while uploads run:
    each waiting backend counted once a sample per backend it waits for, sorted by whose lock:
    `same` (a writer of an account waiting for a writer of the same account), `cross` (for
    another account's writer), `store` (for a backend holding or waiting for no account's lock:
    a writer of the whole store, the store's lock), `other` (a waiter holding no account's
    lock itself: a writer of the whole store, and every writer of a server from before issue
    46's item 4, whose writers all took one lock and no account's), `stale` (a blocker that no
    longer holds or waits for that lock in the snapshot: see WAITS_SQL)."""

    def __init__(self, psql, url):
        self.p = subprocess.Popen([psql, "-X", "-A", "-t", "-q", url], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                  bufsize=1)
        self.counts = dict(same=0, cross=0, store=0, other=0, stale=0, samples=0)
        self.events = {}
        self.stop = threading.Event()
        self.t = threading.Thread(target=self.loop, daemon=True)
        self.t.start()

    def loop(self):
        while not self.stop.is_set():
            self.p.stdin.write(WAITS_SQL)
            for line in iter(self.p.stdout.readline, ""):
                line = line.strip()
                if line == "__end__":
                    break
                if line.count("|") != 3:
                    continue
                lock, waiter, blocker, current = line.split("|")
                waiter, blocker = int(waiter), int(blocker)
                kind = ("stale" if current != "true" else "other" if waiter < 0 else
                        "store" if blocker < 0 else "same" if waiter == blocker else "cross")
                self.counts[kind] += 1
                locktype, first = lock.split(":")
                event = LOCK_NAMES.get(int(first), locktype) if locktype == "advisory" \
                    else locktype
                self.events[event] = self.events.get(event, 0) + 1
            else:
                return
            self.counts["samples"] += 1
            time.sleep(0.1)

    def finish(self):
        self.stop.set()
        self.t.join(timeout=10)
        self.p.stdin.close()
        self.p.wait(timeout=10)
        return self.counts


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
        self.db_url = db
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
            if max(self.a.accounts) > 1:
                v.more_users(max(self.a.accounts) - 1)  # made (and signed in) untimed
            for k in self.servers[v.key]:
                bases = [v.base] + [b for _, b in more[:k - 1]]
                # Accounts side by side (issue 46, item 4): one account, then N, alternating
                # with the run so neither always comes first.
                order = self.a.accounts if r % 2 == 0 else self.a.accounts[::-1]
                for n in order:
                    cpu0 = {name: cpu(p) for name, p in procs.items()}
                    busy0, total0 = machine_cpu()
                    waits = self.lock_waits(v)
                    kv = self.uploads(v.key, k, bases, v, accounts=n)
                    busy1, total1 = machine_cpu()
                    suffix = "%d" % k + ("_a%d" % n if n > 1 else "")
                    if waits:
                        for kind, count in waits.finish().items():
                            self.rec(v.key, "waits_%s_%s" % (kind, suffix), count)
                        for event, count in sorted(waits.events.items()):
                            self.rec(v.key, "waitev_%s_%s" % (event.replace(" ", "_")
                                                             .replace("'", ""), suffix), count)
                    if kv and n > 1:
                        for u in range(n):
                            self.rec(v.key, "uploads_%s_user%d" % (suffix, u),
                                     float(kv.get("uploads_per_s_user%d" % u, 0)))
                    for name, p in procs.items():
                        self.rec(v.key, "cpu_%s_%s" % (name, suffix), cpu(p) - cpu0[name])
                    if total1 > total0:
                        self.rec(v.key, "busy_%s" % suffix,
                                 (busy1 - busy0) / (total1 - total0) * os.cpu_count())
            self.rec(v.key, "rss_end", proc_kib(v.server.pid, "VmHWM") / 1024)
        finally:
            for p, _ in more:
                kill_proc(p)
            v.stop_server()

    def lock_waits(self, v):
        """A LockWaits sampler of the PostgreSQL store (None on SQLite, or without psql)."""
        if v.key != PG or len(self.a.accounts) < 2:
            return None
        psql = getattr(self, "psql", None) or shutil.which("psql")
        if not psql or not getattr(self, "db_url", None):
            return None
        return LockWaits(psql, self.db_url)

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
        many = [n for n in a.accounts if n > 1]
        if many:
            P.w("## Accounts side by side (issue 46, item 4)", "")
            rows = []
            for k in keys:
                for n in self.servers[k]:
                    for acc in a.accounts:
                        sfx = "%d" % n + ("_a%d" % acc if acc > 1 else "")
                        w = lambda kind: cell(g(k, "waits_%s_%s" % (kind, sfx)), "")  # noqa
                        rows.append([L[k], str(n), str(acc),
                                     cell(g(k, "uploads_%s" % sfx), "files/s"),
                                     cell(g(k, "uploads_%s_p50" % sfx), "ms", True),
                                     cell(g(k, "uploads_%s_p99" % sfx), "ms", True),
                                     ratio(m(k, "uploads_%s" % sfx), m(k, "uploads_%d" % n)),
                                     " / ".join(cell(g(k, "uploads_%s_user%d" % (sfx, u)),
                                                     "") for u in range(acc)) if acc > 1
                                     else "-"] +
                                    ([w("same"), w("cross"), w("store"), w("other"),
                                      w("stale"), w("samples")] if k == PG else ["-"] * 6))
            P.table(["Engine", "Servers", "Accounts", "Uploads/s", "p50", "p99",
                     "vs one account", "Uploads/s of each account", "Waits: same account",
                     "other account", "store", "other", "stale", "samples"], rows, right=3)
            P.w("The same %d clients, spread over that many users, each of an account of its "
                "own (client i is account i mod N's). Waits: PostgreSQL's lock waits sampled "
                "every 100 ms during the row's uploads (pg_locks and pg_blocking_pids, one psql "
                "session), a backend counted once a sample per backend it waits for: *same "
                "account*, a writer of an account waiting for a writer of the same account "
                "(their turns, by design; the writer it waits for may be one queued ahead of it "
                "for the same lock); *other account*, for another account's writer; "
                "*store*, for a backend that holds or waits for no account's lock (a writer of "
                "the whole store, the store's lock); *other*, a waiter that holds no account's lock "
                "itself (a writer of the whole store, and every writer of a server from before "
                "issue 46's item 4, whose writers all took one lock and no account's); *stale*, "
                "a pair whose blocker no longer held or waited for that lock when "
                "pg_blocking_pids was asked (a pooled connection gone on to another "
                "transaction), not counted as either account's. The waited-for locks by kind "
                "(the writers' key, an account's lock, a blob's, row and transaction locks) are "
                "in the raw results (waitev_*)." % a.clients, "")
            if PG in keys:
                acc = max(many)
                one = m(PG, "uploads_1")
                P.targets([["Issue 46: %d clients of %d accounts ≥ 0.9x %d clients of one "
                            "(PostgreSQL, one server)" % (a.clients, acc, a.clients),
                            ratio(m(PG, "uploads_1_a%d" % acc), one),
                            met(one and m(PG, "uploads_1_a%d" % acc) and
                                m(PG, "uploads_1_a%d" % acc) / one, ">=", 0.9)],
                           ["Issue 46: no upload of one account waits for another's lock",
                            cell(g(PG, "waits_cross_1_a%d" % acc), ""),
                            met(m(PG, "waits_cross_1_a%d" % acc), "<", 0.5)]])
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
