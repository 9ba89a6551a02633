"""The one setup of every mode: the checks, the binaries, a scratch dir on a fresh loop file
system, private environments (HOME, XDG dirs, rclone's config), and the registry of every daemon,
mount and loop device made here, all undone by cleanup() on exit, Ctrl-C included."""

import os
import shutil
import subprocess
import sys
import tempfile
import time

from .util import (MIB, ROOT, debug, die, human, log, loadavg, mounted, mounts_under,
                   run, syncfs)


class Reg:
    procs = []      # Popen of daemons started here
    mounts = []     # FUSE mount points made here
    work = None     # the scratch dir made here (mkdtemp)
    scratch = None  # where the benchmark's files live: the loop file system, or work
    loop = None     # (loop device, its mount point) made here
    keep = False


def start_daemon(cmd, logpath, env=None, server=False):
    logf = open(logpath, "ab")
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                         env=env, start_new_session=True)  # Ctrl-C reaches the harness only
    logf.close()
    p.is_server = server  # a server is stopped by a signal; a mount daemon exits once unmounted
    Reg.procs.append(p)
    return p


def reap(p, grace):
    """Waits `grace` s for `p` to exit, then terminates it, then kills it."""
    if p.poll() is None:
        try:
            p.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            p.terminate()
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def stop_proc(p, grace=10.0):
    if p is None:
        return
    reap(p, grace)
    if p in Reg.procs:
        Reg.procs.remove(p)


def kill_proc(p):
    if p is not None and p.poll() is None:
        p.terminate()
    stop_proc(p, grace=5.0)


def unmount(path, proc):
    """Unmounts PATH (ours) and waits for its daemon: fusermount3 -u; if the mount is busy, the
    daemon is told to stop (SIGTERM: it unmounts itself); lazily and by force as a last resort."""
    t0 = time.perf_counter()
    if mounted(path):
        r = subprocess.run(["fusermount3", "-u", path], capture_output=True)
        if r.returncode != 0 and mounted(path) and proc is not None and proc.poll() is None:
            debug("fusermount3 -u %s: %s" % (path, r.stderr.strip()))
            proc.terminate()
    stop_proc(proc)
    if mounted(path):
        subprocess.run(["umount", "-l", path], capture_output=True)
    debug("unmount %s: %.2f s" % (os.path.basename(path), time.perf_counter() - t0))


def drop_caches():
    # syncfs of the scratch disk rather than sync(2): a global sync also waits for every FUSE
    # mount on the machine (other people's, with their own uploads).
    syncfs(Reg.scratch or "/")
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def cleanup():
    debug("cleanup")
    for mp in reversed(Reg.mounts):
        if mounted(mp):
            r = subprocess.run(["fusermount3", "-u", mp], capture_output=True)
            if r.returncode != 0 and mounted(mp):
                subprocess.run(["umount", "-l", mp], capture_output=True)
    debug("cleanup: fuse mounts done")
    for p in Reg.procs:
        if p.is_server and p.poll() is None:
            p.terminate()
    for p in reversed(list(Reg.procs)):
        reap(p, 10)
    Reg.procs.clear()
    debug("cleanup: daemons done")
    if Reg.loop:
        dev, mp = Reg.loop
        if mounted(mp):
            if Reg.keep:
                print("bench: kept the scratch file system mounted at %s (%s); "
                      "umount %s && losetup -d %s when done" % (mp, dev, mp, dev),
                      file=sys.stderr)
                return
            for _ in range(50):
                if subprocess.run(["umount", mp], capture_output=True).returncode == 0:
                    break
                time.sleep(0.2)
            else:
                subprocess.run(["umount", "-l", mp], capture_output=True)
        subprocess.run(["losetup", "-d", dev], capture_output=True)
        Reg.loop = None
    if Reg.work and os.path.isdir(Reg.work):
        left = mounts_under(Reg.work)
        for mp in left:
            subprocess.run(["umount", "-l", mp], capture_output=True)
        left = mounts_under(Reg.work)
        if left:
            print("bench: still mounted, not deleting %s: %s" % (Reg.work, left), file=sys.stderr)
        elif Reg.keep:
            debug("cleanup: mounts done")
            print("bench: kept %s" % Reg.work, file=sys.stderr)
        else:
            shutil.rmtree(Reg.work, ignore_errors=True)
    debug("cleanup done")


def on_signal(signum, _frame):
    raise KeyboardInterrupt("signal %d" % signum)


class Harness:
    """What every mode starts from. A mode subclasses it, says which tools it needs (TOOLS) and
    whether it needs the null file system, and runs from main() once setup() is done."""

    TOOLS = ("fusermount3", "ls")

    def __init__(self, a):
        self.a = a
        self.res = {}    # (contender, metric) -> [values, one per run]
        self.info = {}   # free-form notes
        self.capped = {}  # (contender, metric) -> indexes of the values that hit the cap
        self.failed = {}  # (contender, metric) -> [why], one per failed run
        self.loads = []

    def wants_nullfs(self):
        return False

    def binaries(self):
        """The mode's other programs, built (or found) before HOME becomes the run's own."""

    def setup(self):
        a = self.a
        if os.geteuid() != 0:
            die("needs root (FUSE mounts, dropping the page cache)")
        if not os.path.exists("/dev/fuse"):
            die("no /dev/fuse")
        missing = [t for t in self.TOOLS if not shutil.which(t)]
        if missing:
            die("missing %s: apt-get install -y fuse3 fio rclone gnuplot-nox git curl" %
                " ".join(missing))
        drop_caches()
        self.fsx_bin = shutil.which("fsx") or os.path.expanduser("~/.cargo/bin/fsx")
        if not os.access(self.fsx_bin, os.X_OK):
            self.fsx_bin = None

        # The binaries.
        self.bin = self.built("VAULTFS_BIN", "vaultfs", [], "the release binary")
        self.nullfs_bin = None
        if self.wants_nullfs():
            self.nullfs_bin = self.built("NULLFS_BIN", "examples/nullfs",
                                         ["--example", "nullfs"],
                                         "the null file system (examples/nullfs.rs)")
        self.binaries()

        os.makedirs(a.dir, exist_ok=True)
        self.work = Reg.work = tempfile.mkdtemp(prefix="vaultfs-bench.", dir=a.dir)
        Reg.keep = a.keep
        # the peak: a contender's run (fstrim after each), and dd's source
        need = a.size * 4 + a.dd_size * 4 + 2 * 1024 * MIB
        st = os.statvfs(self.work)
        if st.f_bavail * st.f_frsize < need:
            die("%s has %s free, needs %s" % (self.work, human(st.f_bavail * st.f_frsize),
                                             human(need)))
        self.disk_of_dir = run(["df", "-PT", self.work]).stdout.splitlines()[1].split()[:2]
        if a.loop:
            self.work = self.make_loop_fs(a.size * 8 + a.dd_size * 4 + 6 * 1024 * MIB)
        Reg.scratch = self.work
        log("scratch dir %s" % self.work)
        self.load0 = loadavg()
        home = os.path.join(self.work, "home")
        for sub in ("config", "cache", "state", "data"):
            os.makedirs(os.path.join(home, sub))
        self.base_env = base_env = dict(os.environ, LC_ALL="C", HOME=home,
                                        GIT_CONFIG_NOSYSTEM="1")
        os.makedirs(os.path.join(home, "run"), mode=0o700)
        self.vaultfs_env = dict(base_env, RUST_LOG="warn",
                                XDG_RUNTIME_DIR=os.path.join(home, "run"),
                                XDG_CONFIG_HOME=os.path.join(home, "config"),
                                XDG_CACHE_HOME=os.path.join(home, "cache"),
                                XDG_STATE_HOME=os.path.join(home, "state"),
                                XDG_DATA_HOME=os.path.join(home, "data"))
        rconf = os.path.join(self.work, "rclone.conf")
        open(rconf, "w").close()
        self.rclone_env = dict(base_env, RCLONE_CONFIG=rconf)
        os.environ.update(LC_ALL="C", GIT_CONFIG_NOSYSTEM="1", HOME=home)

    def built(self, var, name, args, what, needed=True):
        """The binary named by the environment variable VAR, or NAME (vaultfs, or
        examples/NAME) of `cargo build --release --locked ARGS`; None if the build fails and
        it is not NEEDED."""
        if os.environ.get(var):
            path = os.path.abspath(os.environ[var])
        else:
            log("building %s" % what)
            p = run(["cargo", "build", "--release", "--locked", "--quiet"] + args, cwd=ROOT,
                    timeout=3600, stdout=None, stderr=None, check=needed)
            if p.returncode != 0:
                return None
            tgt = os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")
            path = os.path.join(ROOT, tgt, "release", name)
        if not os.access(path, os.X_OK):
            if needed:
                die("no executable at %s" % path)
            return None
        return path

    def trim(self):
        """Gives the loop file system's free blocks back to the image file (not timed): without
        it the sparse image grows towards its full size as the runs allocate new blocks."""
        if self.a.loop:
            img = os.path.join(Reg.work, "fs.img")
            before = os.stat(img).st_blocks * 512
            run(["fstrim", self.work], check=False)
            debug("fstrim: image %s -> %s" % (human(before), human(os.stat(img).st_blocks * 512)))

    def make_loop_fs(self, size):
        """A fresh ext4 (default options) in a sparse image file in the scratch dir, on a loop
        device with direct I/O (no second page cache): see --no-loop."""
        img = os.path.join(self.work, "fs.img")
        mp = os.path.join(self.work, "fs")
        os.mkdir(mp)
        with open(img, "wb") as f:
            f.truncate(size)
        dev = run(["losetup", "--find", "--show", "--direct-io=on", img]).stdout.strip()
        Reg.loop = (dev, mp)
        run(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", dev])
        run(["mount", dev, mp])
        self.loop_desc = "%s on a loop device (%s, direct I/O) over a sparse %s image file in " \
            "%s (%s, %s)" % ("ext4", dev, human(size), os.path.dirname(img),
                             *self.disk_of_dir)
        return mp
