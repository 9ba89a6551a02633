"""The figures of the main comparison: its metrics, their formats, and the View of a run's
results (medians, ratios, cells) that the page and the targets read."""

import argparse
import statistics

from .contenders import STORED_AS
from .util import commas

# metric, label, unit, higher is better
METRICS = [
    ("seq_w_close", "Sequential write {size}, until close", "MiB/s", True),
    ("seq_w_stored", "Sequential write {size}, until stored", "MiB/s", True),
    ("dd", "`dd bs=1M count={ddcount} conv=fsync` ({dd}), until dd exits", "MiB/s", True),
    ("dd_stored", "`dd bs=1M count={ddcount} conv=fsync` ({dd}), until stored", "MiB/s", True),
    ("seq_r_cold", "Sequential read {size}, cold", "MiB/s", True),
    ("seq_r_warm", "Sequential read {size}, warm", "MiB/s", True),
    ("rand_warm", "Random 4 KiB reads, warm", "IOPS", True),
    ("rand_cold", "Random 4 KiB reads, cold", "IOPS", True),
    ("ttfb", "Time to first byte, cold", "ms", False),
    ("create_close", "Create {creates} files of 4 KiB, until last close", "files/s", True),
    ("create_stored", "Create {creates} files of 4 KiB, until stored", "files/s", True),
    ("untar", "Untar {repo}, until tar exits", "s", False),
    ("untar_stored", "Untar {repo}, until stored", "s", False),
    ("clone", "git clone of the repository, until git exits", "s", False),
    ("clone_stored", "git clone of the repository, until stored", "s", False),
    ("ls_cold", "`ls -l` of {nfiles} files, cold", "ms", False),
    ("ls_warm", "`ls -l` of {nfiles} files, warm", "ms", False),
    ("stat_cold", "lstat of every file of a {nfiles}-file tree, cold", "ms", False),
    ("stat_warm", "lstat of every file of a {nfiles}-file tree, warm", "ms", False),
    ("find_cold", "`find -type f` over the {nfiles}-file tree, cold", "ms", False),
    ("find_warm", "`find -type f` over the {nfiles}-file tree, warm", "ms", False),
    ("rss_mount", "Peak RSS of the mount daemon", "MiB", False),
    ("rss_server", "Peak RSS of the server", "MiB", False),
]
CHART_LABELS = {
    "seq_w_close": "seq write", "seq_w_stored": "seq write stored", "dd": "dd fsync",
    "dd_stored": "dd stored", "seq_r_cold": "seq read cold",
    "seq_r_warm": "seq read warm", "rand_warm": "4K rand warm", "rand_cold": "4K rand cold",
    "ttfb": "first byte", "create_close": "create", "create_stored": "create stored",
    "untar": "untar", "untar_stored": "untar stored", "clone": "git clone",
    "clone_stored": "clone stored", "ls_cold": "ls -l cold", "ls_warm": "ls -l warm",
    "stat_cold": "stat cold", "stat_warm": "stat warm", "find_cold": "find cold",
    "find_warm": "find warm",
}


def fmt(v, unit):
    if v is None:
        return "-"
    if unit in ("IOPS", "files/s"):
        return commas(int(round(v)))
    if unit in ("MiB/s", "MiB"):
        return "%.0f" % v if v >= 100 else "%.1f" % v
    if unit == "ms":
        return commas(int(round(v))) if v >= 100 else ("%.1f" % v if v >= 1 else "%.2f" % v)
    return "%.1f" % v if v >= 10 else "%.2f" % v


def fmt_ratio(x):
    if x is None:
        return "-"
    return "%.2fx" % x if x < 10 else "%.0fx" % x


class View:
    """The results, with what the page needs computed."""

    def __init__(self, R):
        self.R = R
        self.a = argparse.Namespace(**R["args"])
        self.keys = [k for k, _ in R["contenders"]]
        self.labels = dict(R["contenders"])
        split = lambda d: {tuple(k.split("|")): v for k, v in d.items()}
        self.res = split(R["res"])
        self.capped = split(R["capped"])
        self.failed = split(R["failed"])
        self.med = {k: statistics.median(v) for k, v in self.res.items()}
        self.better = {m: hb for m, _, _, hb in METRICS}
        self.unit = {m: u for m, _, u, _ in METRICS}
        self.takes_part = {k: set(v) for k, v in R.get("takes_part", {}).items()}
        self.stored_is_close = set(R.get("stored_is_close", []))

    def does(self, c, m):
        """Whether contender C takes part in M (if not, its cells read "n/a")."""
        tp = self.takes_part.get(c)
        return tp is None or m in tp

    def ref_key(self, ref, m):
        """The figure REF is compared on for M: its own, or for a contender with nothing to store
        its "until close" figure in place of "until stored"."""
        if ref in self.stored_is_close and m in STORED_AS:
            return (ref, STORED_AS[m])
        return (ref, m)

    def speed(self, m, c, ref):
        """Speed of C relative to REF on M (ratio of medians; above 1: C is faster)."""
        x, y = self.med.get((c, m)), self.med.get(self.ref_key(ref, m))
        if not x or not y:
            return None
        return x / y if self.better[m] else y / x

    def bound(self, m, c, ref):
        """"<=" or ">=" when a capped wait makes the ratio a bound; "~" when both are."""
        cc, rc = (c, m) in self.capped, self.ref_key(ref, m) in self.capped
        return "~" if cc and rc else "<=" if cc else ">=" if rc else ""

    def ratio_cell(self, m, c, ref):
        if not self.does(c, m) or not self.does(*self.ref_key(ref, m)):
            return "n/a"
        x = self.speed(m, c, ref)
        if x is None:
            return "fails" if (c, m) in self.failed or self.ref_key(ref, m) in self.failed \
                else "-"
        bd = self.bound(m, c, ref)
        if bd == "~":
            return "?"
        return ("≤ " if bd == "<=" else "≥ " if bd == ">=" else "") + fmt_ratio(x)

    def cell(self, c, m):
        if not self.does(c, m):
            return "n/a"
        vals, unit = self.res.get((c, m)), self.unit[m]
        out = ""
        if vals:
            out = fmt(self.med[(c, m)], unit)
            if len(vals) > 1:
                out += " (%s–%s)" % (fmt(min(vals), unit), fmt(max(vals), unit))
            if (c, m) in self.capped:
                k = len(self.capped[(c, m)])
                out = "%s %s, capped in %s" % ("≤" if self.better[m] else "≥", out,
                                               "every run" if k == len(vals) else
                                               "%d of %d runs" % (k, len(vals)))
        if (c, m) in self.failed:
            whys = self.failed[(c, m)]
            n = len(whys) + len(vals or [])
            f = "**failed** in %s%s" % ("every run" if not vals else
                                        "%d of %d runs" % (len(whys), n),
                                        "" if vals else " (see below)")
            out = (out + "; " + f) if out else f
        return out or "-"
