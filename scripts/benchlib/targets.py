"""The targets of the issues that the main comparison's page judges (issue 21's first)."""

from .figures import CHART_LABELS, fmt, fmt_ratio
from .util import commas


class Target:
    """A target: WHO's figure on M against REF, OP NEED. REF is a contender (the speed ratio of
    WHO to it, as in *Ratios*, must be >= NEED), a tuple of contenders (against whichever of
    them is slower: "0.9x native or 0.9x null, whichever is lower"), or None: an absolute bound
    in M's unit on WHO's median (AGG "max": the largest of the runs). REPO_FILES: the bound is
    for a repository of that many files, not judged on another (--quick's)."""

    def __init__(self, group, why, m, need, ref=None, who="vaultfs-local", op=">=",
                 agg="median", repo_files=None):
        self.group, self.why, self.m, self.need, self.ref = group, why, m, need, ref
        self.who, self.op, self.agg, self.repo_files = who, op, agg, repo_files


ISSUE21 = "Issue 21: the write path"
EARLIER = "Earlier targets (small files and metadata, sequential throughput, mount issue)"
TARGETS = (
    [Target(ISSUE21, "create until close: >= 0.75x null", "create_close", 0.75, "null"),
     Target(ISSUE21, "create until close: >= 4x rclone", "create_close", 4, "rclone-local"),
     Target(ISSUE21, "create until stored: >= 0.5x null", "create_stored", 0.5, "null"),
     Target(ISSUE21, "create until stored: >= 3x rclone", "create_stored", 3, "rclone-local"),
     Target(ISSUE21, "untar until stored: <= 0.4 s", "untar_stored", 0.4, op="<=",
            repo_files=1000),
     Target(ISSUE21, "git clone until stored: <= 0.6 s", "clone_stored", 0.6, op="<=",
            repo_files=1000)]
    + [Target(ISSUE21, "large writes until stored: >= %gx %s" % (need, "native" if ref == "native"
                                                                  else "rclone"), m, need, ref)
       for m in ("dd_stored", "seq_w_stored")
       for ref, need in (("native", 0.6), ("rclone-local", 1.5))]
    + [Target(ISSUE21, "seq write until close: >= 0.9x native or null, whichever is lower",
              "seq_w_close", 0.9, ("native", "null")),
       Target(ISSUE21, "remote: create until stored >= 2x rclone webdav", "create_stored", 2,
              "rclone-webdav", who="vaultfs-remote")]
    + [Target(ISSUE21, "peak daemon RSS < 100 MiB", "rss_mount", 100, op="<", agg="max",
              who=w) for w in ("vaultfs-local", "vaultfs-remote")]
    + [Target(EARLIER, "small files / metadata: >= 1.5x rclone", m, 1.5, "rclone-local")
       for m in ("create_close", "create_stored", "ls_cold", "ls_warm", "stat_cold", "stat_warm")]
    + [Target(EARLIER, "sequential throughput: >= rclone", m, 1.0, "rclone-local")
       for m in ("seq_w_close", "seq_w_stored", "seq_r_cold", "seq_r_warm")]
    + [Target(EARLIER, "mount issue: >= 50% of native", "seq_w_close", 0.5, "native"),
       Target(EARLIER, "mount issue: >= 50% of native", "seq_w_stored", 0.5, "native"),
       Target(EARLIER, "mount issue: cached read >= 70% of native", "seq_r_warm", 0.7, "native"),
       Target(EARLIER, "mount issue: cold read >= 40% of native", "seq_r_cold", 0.4, "native"),
       Target(EARLIER, "mount issue: `ls -l` within 3x of native", "ls_warm", 1 / 3, "native"),
       Target(EARLIER, "mount issue: >= 25% of native", "create_close", 0.25, "native"),
       Target(EARLIER, "mount issue: daemon RSS < 100 MiB", "rss_mount", 100, op="<",
              agg="max")]
)


def target_row(v, t):
    """The row of target T in this run: a dict of the table's cells, "ok" (True, False, or
    None when not judged) and "miss" (the line saying by how much); None if T does not apply
    (a contender it needs was not run)."""
    m, who, labels = t.m, t.who, v.labels
    if who not in v.keys:
        return None
    vals, failed, unit = v.res.get((who, m)), (who, m) in v.failed, v.unit[m]
    if not vals and not failed:
        return None
    name = CHART_LABELS.get(m) or ("peak RSS of the mount daemon" if m == "rss_mount" else m)
    row = {"why": t.why, "workload": name if who == "vaultfs-local" else
           "%s: %s" % (labels[who], name)}
    if t.ref is None:
        x = None
        if vals:
            x = max(vals) if t.agg == "max" else v.med[(who, m)]
        # A capped wait: the figure is a bound in the bad direction, so only a miss is certain.
        ok = x is not None and {"<=": x <= t.need, "<": x < t.need, ">=": x >= t.need,
                                ">": x > t.need}[t.op]
        rel = {"<=": "≤", "<": "<", ">=": "≥", ">": ">"}[t.op]
        unknown = ok and (who, m) in v.capped
        row["against"] = "-"
        row["needed"] = "%s %s %s" % (rel, fmt(t.need, unit), unit)
        row["measured"] = "fails" if x is None else "%s%s %s%s" % (
            ("≤ " if v.better[m] else "≥ ") if (who, m) in v.capped else "", fmt(x, unit), unit,
            ", max of the runs" if t.agg == "max" and len(vals) > 1 else "")
        over = ""
        if x is not None and not v.better[m]:
            over = " (%.1fx the bound)" % (x / t.need) if x >= 2 * t.need else \
                " (%.0f%% over)" % (100 * (x / t.need - 1))
        elif x is not None:
            over = " (%.0f%% short)" % (100 * (1 - x / t.need))
        row["miss"] = "- **%s**: %s needed, %s measured%s." % (
            row["workload"], row["needed"], row["measured"], over)
    else:
        wanted = t.ref if isinstance(t.ref, tuple) else (t.ref,)
        refs = [r for r in wanted if r in v.keys]
        if not refs:
            return None
        # Against the slowest of the references: the highest ratio.
        known = [(v.speed(m, who, r), r) for r in refs if v.speed(m, who, r) is not None]
        x, ref = max(known) if known else (None, refs[0])
        rk = v.ref_key(ref, m)
        ok = x is not None and x >= t.need
        bd = v.bound(m, who, ref)
        unknown = (bd == "<=" and ok) or (bd == ">=" and not ok) or bd == "~"
        row["against"] = labels[ref] if len(refs) == 1 else "the slower of %s: %s" % (
            " and ".join(labels[r] for r in refs), labels[ref])
        if len(refs) < len(wanted):
            row["against"] += " (%s: not in this run)" % ", ".join(
                r for r in wanted if r not in refs)
        row["needed"] = fmt_ratio(t.need)
        row["measured"] = v.ratio_cell(m, who, ref)
        if x is not None:
            row["measured"] += " (%s vs %s %s%s)" % (
                fmt(v.med[(who, m)], unit), fmt(v.med[rk], unit), unit,
                " until close" if rk[1] != m else "")
        row["miss"] = "- **%s** against %s: %s needed, %s measured (%s of it, %.0f%% short)." % (
            row["workload"], labels[ref], fmt_ratio(t.need), fmt_ratio(x),
            "%.0f%%" % (100 * (x or 0) / t.need), 100 * (1 - (x or 0) / t.need))
    row["met"] = "yes" if ok else "**no**"
    row["ok"] = ok
    if unknown:
        row["met"], row["ok"] = "unknown (capped wait)", None
    if t.repo_files and v.R["repo"]["files"] != t.repo_files:
        row["met"] = "not judged (a %s-file repository; the bound is for %s files)" % (
            commas(v.R["repo"]["files"]), commas(t.repo_files))
        row["ok"] = None
    return row
