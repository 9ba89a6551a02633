"""Small helpers of every mode: logging, commands, sizes, mounts, /proc, HTTP."""

import argparse
import ctypes
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MIB = 1 << 20
VAULT_ROOT = "Local/My First Vault"
KEPT_MARKER = "<!-- scripts/bench keeps everything below this line when it rewrites the page -->"
FSX_SEED = 20_251_121
STORED_TIMEOUT = 300  # the most a wait for "stored" may take, seconds
T_START = time.time()
HOME0 = os.path.expanduser("~")  # the user's, before setup() gives the run a HOME of its own


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def log(msg):
    print("[bench %s +%4ds load %s] %s" % (time.strftime("%H:%M:%S"), time.time() - T_START,
                                           loadavg(), msg), file=sys.stderr, flush=True)


def debug(msg):
    if os.environ.get("BENCH_DEBUG"):
        log("debug: " + msg)


class Fail(Exception):
    pass


def die(msg):
    raise Fail(msg)


def run(cmd, timeout=600, check=True, **kw):
    kw.setdefault("stdout", subprocess.PIPE)
    kw.setdefault("stderr", subprocess.PIPE)
    p = subprocess.run(cmd, timeout=timeout, text=True, **kw)
    if check and p.returncode != 0:
        die("%s failed (%d): %s" % (" ".join(map(str, cmd)), p.returncode,
                                    ((p.stderr or "") + (p.stdout or ""))[-1500:]))
    return p


def parse_size(s):
    m = re.fullmatch(r"(\d+)\s*([KMGT]?)(i?B)?", s.strip(), re.I)
    if not m:
        raise argparse.ArgumentTypeError("bad size: %s" % s)
    return int(m.group(1)) << (10 * " KMGT".index((m.group(2) or " ").upper()))


def human(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return ("%d %s" % (n, unit)) if n == int(n) else ("%.1f %s" % (n, unit))
        n /= 1024


def commas(n):
    return "{:,}".format(n)


def mounted(path):
    """Whether PATH is a mount point (from /proc/self/mountinfo)."""
    path = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4]
            mp = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), mp)
            if mp == path:
                return True
    return False


def mounts_under(path):
    path = os.path.realpath(path)
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4])
            if mp == path or mp.startswith(path + "/"):
                out.append(mp)
    return out


_libc = ctypes.CDLL(None, use_errno=True)


def syncfs(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        if _libc.syncfs(fd) != 0:
            die("syncfs %s: errno %d" % (path, ctypes.get_errno()))
    finally:
        os.close(fd)


def proc_kib(pid, field):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def http(method, url, data=None, headers=None, timeout=10):
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read().decode("utf-8", "replace")


def count_tree(path):
    """(regular files, their bytes) under PATH (a file counts as itself)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return (0, 0)
    if not os.path.isdir(path):
        return (1, st.st_size)
    n = b = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                b += os.lstat(os.path.join(dirpath, name)).st_size
                n += 1
            except FileNotFoundError:
                pass
    return (n, b)


def machine_cpu():
    """(busy, total) jiffies of all the machine's CPUs so far (/proc/stat): the share of its
    cores a stretch of time kept busy, whatever process ran (clients included)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def proc_cpu(pid):
    """CPU seconds of PID and its children, reaped or running (the preview sandbox's)."""
    def ticks(p, fields):
        try:
            with open("/proc/%d/stat" % p) as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return 0, None
        return sum(int(x) for x in rest[11:11 + fields]), int(rest[1])
    total = ticks(pid, 4)[0]
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != pid:
            t, ppid = ticks(int(name), 2)
            if ppid == pid:
                total += t
    return total / os.sysconf("SC_CLK_TCK")


def write_kept(out, text):
    """Writes TEXT to the page OUT, keeping what was written by hand below KEPT_MARKER."""
    kept = ""
    if os.path.exists(out):
        with open(out) as f:
            old = f.read()
        if KEPT_MARKER in old:
            kept = old[old.index(KEPT_MARKER) + len(KEPT_MARKER):].lstrip("\n")
    with open(out, "w") as f:
        f.write(text + "\n" + KEPT_MARKER + "\n" + ("\n" + kept if kept else ""))


def cpu_and_memory():
    """The CPU's model name and the bytes of memory."""
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem = int(f.readline().split()[1]) * 1024
    return cpu, mem


def machine():
    """The machine in one line: CPUs, memory, OS, kernel, Python."""
    cpu, mem = cpu_and_memory()
    osname = run(["sh", "-c", ". /etc/os-release && echo $PRETTY_NAME"],
                 check=False).stdout.strip()
    return ["%d CPUs (`nproc`), %s, %s RAM; %s, kernel %s; Python %s" % (
        os.cpu_count(), cpu, human(mem), osname, os.uname().release, sys.version.split()[0])]
