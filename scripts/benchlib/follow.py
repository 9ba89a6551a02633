"""follow: how soon one mount sees another's changes (issue 32): `vaultfs serve`, two mounts of
one account (each its own cache dir), maybe through a link proxy, and an earlier build's two
mounts beside (VAULTFS_BEFORE) on the same server."""

import copy
import os
import time

from .contenders import Vaultfs
from .link import start_proxy
from .pages import Page, cell
from .setup import Harness, kill_proc
from .util import die, log

CAP = 15.0  # seconds: the longest wait for B to show a change
KINDS = ("create", "change", "rename", "delete")


def twin(v, suffix, binary=None):
    """Another mount of V's account and server: its own mount point, cache dir and log."""
    t = copy.copy(v)
    t.__dict__.pop("_journal", None)
    t.key, t.label = v.key + suffix, v.label + suffix
    t.dir, t.cache = v.dir + suffix, v.cache + suffix
    t.logpath = v.logpath[:-4] + suffix + ".log"
    t.proc, t.bin = None, binary or v.bin
    os.makedirs(t.dir)
    return t


def seen(pred):
    """Seconds until PRED holds (polled every 5 ms), or None after CAP."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < CAP:
        try:
            if pred():
                return time.perf_counter() - t0
        except OSError:
            pass
        time.sleep(0.005)
    return None


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def read(path):
    with open(path, "rb") as f:
        return f.read()


class FollowBench(Harness):
    def main(self):
        a = self.a
        v = Vaultfs(self, True)
        v.rss = {"mount": 0, "server": 0}
        v.serve()
        proxy = None
        try:
            if a.link:
                proxy, via = start_proxy(v.port, a.link[0], a.link_mbit)
                v.link_through(via)
            pairs = [("vaultfs", twin(v, "-a"), twin(v, "-b"))]
            if os.environ.get("VAULTFS_BEFORE"):
                before = os.path.abspath(os.environ["VAULTFS_BEFORE"])
                pairs.append(("before", twin(v, "-before-a", before),
                              twin(v, "-before-b", before)))
            for label, ma, mb in pairs:
                ma.mount()
                mb.mount()
                try:
                    log("%s: %d rounds" % (label, a.rounds))
                    self.rounds(label, ma, mb)
                finally:
                    mb.unmount()
                    ma.unmount()
        finally:
            kill_proc(proxy)
            v.stop_server()
        self.page([p[0] for p in pairs])

    def rounds(self, label, a, b):
        da, db = os.path.join(a.dir, label), os.path.join(b.dir, label)
        os.mkdir(da)
        if seen(lambda: os.path.isdir(db)) is None:
            die("B never saw the folder %s" % label)
        os.listdir(db)
        for i in range(self.a.rounds):
            name, other = "doc%d.txt" % i, "renamed%d.txt" % i
            body = ("round %d: a document as people write it\n" % i).encode() * 20
            write(os.path.join(da, name), body)
            self.got(label, "create", seen(lambda: name in os.listdir(db)
                                           and read(os.path.join(db, name)) == body))
            body2 = body + b"and a second paragraph\n"
            write(os.path.join(da, name), body2)
            self.got(label, "change", seen(lambda: read(os.path.join(db, name)) == body2))
            os.rename(os.path.join(da, name), os.path.join(da, other))
            self.got(label, "rename", seen(lambda: other in os.listdir(db)
                                           and name not in os.listdir(db)))
            os.unlink(os.path.join(da, other))
            self.got(label, "delete", seen(lambda: other not in os.listdir(db)))

    def got(self, label, kind, t):
        if t is None:
            self.failed.setdefault((label, kind), []).append("not seen within %.0f s" % CAP)
            log("  %-8s %-7s not seen within %.0f s" % (label, kind, CAP))
        else:
            self.res.setdefault((label, kind), []).append(t * 1000)
            log("  %-8s %-7s %.0f ms" % (label, kind, t * 1000))

    def page(self, labels):
        a = self.a
        where = "loopback" if not a.link else "a link of %g ms round trip, %g Mbit/s" % (
            a.link[0], a.link_mbit)
        P = Page(self, "Following another mount's changes",
                 "Two mounts of one account on `vaultfs serve` over %s; %d rounds of changes "
                 "made on mount A, each timed until mount B shows it." % (where, a.rounds))
        rows = []
        for kind, what in zip(KINDS, ("A new file (written, closed): B lists it with its bytes",
                                      "A change of its bytes: B reads the new bytes",
                                      "A rename: B lists the new name, not the old",
                                      "A delete: B no longer lists it")):
            row = [what + ", ms"]
            for label in labels:
                x = cell(self.res.get((label, kind)), "ms")
                n = len(self.failed.get((label, kind), []))
                row.append(x + ("; **%d not seen within %.0f s**" % (n, CAP) if n else ""))
            rows.append(row)
        P.table(["Change on A"] + ["%s (median (min–max))" % x for x in labels], rows, right=1)
        P.w("- Times in ms from the moment A's `close`, `rename` or `unlink` "
            "returned until B showed the change (A's upload included: that is what a user of "
            "B waits for).", "")
        P.write(["Both mounts are `vaultfs mount --server` of one user's token (the "
                 "credentials file of `vaultfs login`), each with its own cache dir, on "
                 "the same server%s; B is polled every 5 ms (a listing of the folder, or its "
                 "bytes read), capped at %.0f s." % (
                     "" if not a.link else ", both through one link proxy "
                     "(scripts/linkproxy.py)", CAP)])
