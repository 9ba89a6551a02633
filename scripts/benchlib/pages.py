"""The page of the modes reads, server, shared and follow, in the comparison's format: the command
and its date, tables of medians with the minimum and maximum of the runs, ratios, the targets,
the machine and how it was measured; the notes below the "keeps" marker stay; the raw results go
to $TMPDIR as JSON."""

import json
import os
import statistics
import sys
import tempfile
import time

from .figures import fmt, fmt_ratio
from .util import ROOT, T_START, loadavg, log, machine, run, write_kept


def med(vals):
    return statistics.median(vals) if vals else None


def cell(vals, unit, with_unit=False):
    """The median of VALS with (min–max) when there are several; "-" for none."""
    if not vals:
        return "-"
    out = fmt(statistics.median(vals), unit) + (" " + unit if with_unit else "")
    if len(vals) > 1:
        out += " (%s–%s)" % (fmt(min(vals), unit), fmt(max(vals), unit))
    return out


def ratio(x, y, higher_better=True):
    """The speed ratio of X to Y (medians; for times, Y's over X's)."""
    if not x or not y:
        return "-"
    return fmt_ratio(x / y if higher_better else y / x)


def met(x, op, need):
    if x is None:
        return "-"
    return "yes" if {">=": x >= need, "<": x < need, "<=": x <= need}[op] else "**no**"


class Page:
    """Lines of a mode's page; write() adds the machine and how it was measured, and writes."""

    def __init__(self, h, title, intro):
        self.h = h
        a = h.a
        self.L = ["# " + title, "",
                  "`%s` (%s; %d run%s; %d minute%s in all). %s" % (
                      " ".join(["scripts/bench"] + sys.argv[1:]),
                      time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(T_START)), a.runs,
                      "s" if a.runs > 1 else "", max(1, round((time.time() - T_START) / 60)),
                      "s" if round((time.time() - T_START) / 60) > 1 else "", intro), ""]

    def w(self, *lines):
        self.L.extend(lines)

    def table(self, header, rows, right=None):
        """A Markdown table: HEADER's cells, then ROWS; columns from RIGHT on right-aligned."""
        right = len(header) if right is None else right
        self.w("| " + " | ".join(header) + " |",
               "|" + "".join("---:|" if i >= right else "---|" for i in range(len(header))))
        for r in rows:
            self.w("| " + " | ".join(r) + " |")
        self.w("")

    def targets(self, rows):
        """ROWS: (target, measured, met)."""
        self.w("## Targets", "")
        self.table(["Target", "Measured", "Met"], rows)

    def write(self, how):
        h, a = self.h, self.h.a
        vver = run([h.bin, "--version"], check=False).stdout.strip()
        githash = run(["git", "-C", ROOT, "rev-parse", "--short=12", "HEAD"],
                      check=False).stdout.strip()
        disk = getattr(h, "loop_desc", None) or "%s (%s on %s)" % (
            h.work, *run(["df", "-PT", h.work]).stdout.splitlines()[1].split()[1::-1])
        self.w("## Machine and versions", "")
        self.w(*["- " + x for x in machine()])
        self.w("- %s, git `%s`%s; scripts/bench at the same commit" % (
            vver or "vaultfs ?", githash or "?",
            " (`VAULTFS_BIN` %s)" % os.environ["VAULTFS_BIN"] if os.environ.get("VAULTFS_BIN")
            else ", release build"),
            "- Scratch file system: %s" % disk,
            "- Load average (1, 5, 15 min): %s before the run, %s after." % (h.load0, loadavg()),
            "", "## How it was measured", "")
        self.w(*["- " + x for x in how])
        self.w("")
        text = "\n".join(self.L)
        js = os.path.join(tempfile.gettempdir(), "vaultfs-bench-%s-%s.json" % (
            a.mode, time.strftime("%Y%m%d-%H%M%S", time.localtime(T_START))))
        with open(js, "w") as f:
            json.dump({"command": " ".join(["scripts/bench"] + sys.argv[1:]),
                       "started": T_START, "elapsed": time.time() - T_START,
                       "res": {"%s|%s" % k: v for k, v in h.res.items()},
                       "info": h.info}, f, indent=1, default=str)
        out = os.path.abspath(a.out)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        write_kept(out, text)
        print(text)
        log("wrote %s; raw results in %s" % (out, js))
