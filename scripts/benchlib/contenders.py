"""The contenders: the native disk, FUSE mounts with their daemons (the null file system,
vaultfs on the built-in store or on `vaultfs serve`, rclone on a folder or on WebDAV), each
started, stopped, made cold, and asked whether what was written is stored."""

import base64
import hashlib
import json
import os
import re
import shutil
import socket
import time
import urllib.parse

from .fixtures import fixture_layout, make_fixtures_in
from .setup import Reg, drop_caches, kill_proc, start_daemon, unmount
from .util import (STORED_TIMEOUT, VAULT_ROOT, count_tree, debug, die, free_port, http, mounted,
                   proc_kib, run, syncfs)

# The workloads a file system that forgets bytes (and everything on restart) can take part in.
NULL_METRICS = ("seq_w_close", "dd", "create_close", "untar")
# A metric "until stored", and its "until close" counterpart: what a contender with nothing to
# store (stored_is_close) is compared on when it is the reference.
STORED_AS = {"seq_w_stored": "seq_w_close", "dd_stored": "dd", "create_stored": "create_close",
             "untar_stored": "untar", "clone_stored": "clone"}


def does(c, m):
    """Whether contender C takes part in metric M."""
    return c.metrics is None or m in c.metrics


class Native:
    key, label, is_mount = "native", "native", False
    metrics = None          # every workload
    stored_is_close = False

    def __init__(self, h):
        self.h = h
        self.dir = os.path.join(h.work, "native")
        os.makedirs(self.dir)

    def start(self):
        self.rss = {}

    def stop(self):
        pass

    def cold(self):
        drop_caches()

    def make_fixtures(self, n):
        make_fixtures_in(self.dir, n)

    def wait_stored(self, path, expect=None, cap=None):
        if os.path.isdir(path):
            syncfs(path)
        else:
            fd = os.open(path, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        return time.perf_counter()


class Mount:
    """A FUSE mount with a daemon, maybe a server behind it."""
    is_mount = True
    server = None
    metrics = None
    stored_is_close = False

    def __init__(self, h):
        self.h = h
        self.dir = os.path.join(h.work, "mnt-" + self.key)
        self.cache = os.path.join(h.work, "cache-" + self.key)
        self.logpath = os.path.join(h.work, self.key + ".log")
        os.makedirs(self.dir)
        self.proc = None

    # Server lifecycle (subclasses with a server override these).
    def start_server(self):
        pass

    def stop_server(self):
        pass

    def start(self):
        self.rss = {"mount": 0}
        if self.server_role():
            self.rss["server"] = 0
        self.start_server()
        self.mount()

    def server_role(self):
        return False

    def stop(self):
        self.unmount()
        self.stop_server()

    def mount(self):
        if self.dir not in Reg.mounts:
            Reg.mounts.append(self.dir)
        self.proc = start_daemon(self.mount_cmd(), self.logpath, self.env())
        deadline = time.time() + 60
        while time.time() < deadline:
            if mounted(self.dir):
                try:
                    self.probe()
                    return
                except OSError:
                    pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        with open(self.logpath, errors="replace") as f:
            tail = f.read()[-2000:]
        die("the %s mount did not come up:\n%s" % (self.label, tail))

    def probe(self):
        """Raises OSError until the mount answers."""
        os.listdir(self.dir)

    def unmount(self):
        if self.proc is not None:
            self.rss["mount"] = max(self.rss["mount"], proc_kib(self.proc.pid, "VmHWM"))
        unmount(self.dir, self.proc)
        self.proc = None

    def clear_read_cache(self):
        pass

    def cold(self):
        """Restart the mount with its read cache deleted and the page cache dropped."""
        t0 = time.perf_counter()
        self.unmount()
        t1 = time.perf_counter()
        self.clear_read_cache()
        drop_caches()
        t2 = time.perf_counter()
        self.mount()
        debug("%s cold: unmount %.2f s, caches %.2f s, mount %.2f s" % (
            self.label, t1 - t0, t2 - t1, time.perf_counter() - t2))

    def alive(self):
        if self.proc is None or self.proc.poll() is not None:
            die("the %s mount daemon died; log %s" % (self.label, self.logpath))

    def wait_stored(self, path, expect=None, cap=None):
        """Polls until nothing is left to upload (and the backing store holds EXPECT, where the
        harness can see it); returns when that first held, confirmed by 2 more polls. With CAP
        (seconds): None once CAP has passed, after which the caller resets the contender."""
        first, confirms = None, 0
        deadline = time.time() + STORED_TIMEOUT
        capped = time.perf_counter() + cap if cap else None
        while True:
            if capped and time.perf_counter() > capped:
                return None
            ok = self.queue_empty() and (expect is None or self.backing_ok(expect))
            t = time.perf_counter()
            if ok:
                first = first or t
                confirms += 1
                if confirms >= 3:
                    return first
            else:
                first, confirms = None, 0
            self.alive()
            if time.time() > deadline:
                die("%s: not stored after %d s (%s)" % (self.label, STORED_TIMEOUT, path))
            time.sleep(0.02)

    def backing_ok(self, expect):
        return True

    def reset(self, path):
        """After a capped wait: let the uploads finish, untimed (vaultfs)."""
        self.wait_stored(path)


class NullFs(Mount):
    """examples/nullfs.rs: keeps names and sizes, drops every byte, forgets everything when
    unmounted; vaultfs's mount options and FUSE thread count. Nothing to store: stored is now."""
    key, label = "null", "null FUSE (ceiling)"
    metrics = frozenset(NULL_METRICS)
    stored_is_close = True
    THREADS = 4  # vaultfs's FUSE threads (src/fs/mod.rs, MountOptions::default)

    def env(self):
        return self.h.base_env

    def mount_cmd(self):
        return [self.h.nullfs_bin, self.dir, str(self.THREADS)]

    def probe(self):
        # stat, not a listing: it announces READDIRPLUS without answering it (ENOSYS), and none
        # of its workloads lists a folder.
        os.stat(os.path.join(self.dir, "."))

    def queue_empty(self):
        return True

    def wait_stored(self, path, expect=None, cap=None):
        self.alive()
        return time.perf_counter()

    def reset(self, path):
        pass

    def make_fixtures(self, n):
        pass


class Vaultfs(Mount):
    via = None
    serve_env = None  # the server's own environment (--search: RUST_LOG=info, its access log)

    def __init__(self, h, remote, key=None, label=None, binary=None, mount_flags=(),
                 db_flags=(), serve_flags=(), serve_env=None):
        """KEY and LABEL name another contender of the kind (reads: --no-passthrough; server
        modes: one a store engine); BINARY another build (VAULTFS_BEFORE); MOUNT_FLAGS more
        flags of `vaultfs mount`; DB_FLAGS (--database URL) of every command on the store,
        SERVE_FLAGS (--blobs, --s3-endpoint, --serve-arg) and SERVE_ENV of `vaultfs serve`."""
        self._made = set()
        self.remote = remote
        self.key = key or ("vaultfs-remote" if remote else "vaultfs-local")
        self.label = label or ("vaultfs remote" if remote else "vaultfs local")
        self.bin = binary or h.bin
        self.mount_flags, self.db_flags = list(mount_flags), list(db_flags)
        self.serve_flags, self.serve_env = list(serve_flags), serve_env
        super().__init__(h)
        self.store = os.path.join(h.work, "store-" + self.key)
        self.server_log = os.path.join(h.work, self.key + "-serve.log")
        self.setup_server()

    def env(self):
        return self.h.vaultfs_env

    def server_role(self):
        return self.remote

    def mount_cmd(self):
        cmd = [self.bin, "mount", self.dir, "--cache-dir", self.cache, "--root", VAULT_ROOT]
        if self.remote:
            cmd += ["--server", self.via or self.base]
        else:
            cmd += ["--data-dir", self.store]
        return cmd + self.mount_flags

    def setup_server(self):
        """A user with account Local, a token through the pin page, the credentials file that
        `vaultfs login` writes. The local store gets one too: the fixtures are made through its
        API (a server on it while nothing mounts it)."""
        email, password = "bench@example.com", "bench pw %d" % os.getpid()
        self.email, self.password = email, password
        run([self.bin, "user", "add", email, "--account", "Local", "--data-dir", self.store] +
            self.db_flags, input=password + "\n", env=self.h.vaultfs_env)
        self.port = free_port()
        self.base = "http://127.0.0.1:%d" % self.port
        self.serve()
        self.token, expires_in = self.pin_token(email, password)
        self.expires = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + expires_in))
        if not self.remote:
            self.stop_server()
            return
        self.write_login([self.base])
        self.stop_server()

    def pin_token(self, email, password):
        """A token for EMAIL through the pin page of the running server: (token, expires_in)."""
        page = http("POST", self.base + "/pin/authorize", urllib.parse.urlencode(
            {"client_id": "vaultfs", "email": email, "password": password}).encode())
        m = re.search(r'id="pin">(\d+)', page)
        if not m:
            die("no pin on the authorization page")
        body = json.dumps({"user_email": email,
                           "pin_info": {"client_id": "vaultfs", "pin": m.group(1)}}).encode()
        msg = json.loads(http("POST", self.base + "/pin/auth", body,
                              {"Content-Type": "application/json"})).get("message") or {}
        token, expires_in = msg.get("token"), int(msg.get("expires_in") or 86400)
        if not token:
            die("no token from /pin/auth")
        return token, expires_in

    def write_login(self, bases):
        """The credentials file of `vaultfs login`, for these server addresses."""
        cfg = os.path.join(self.h.vaultfs_env["XDG_CONFIG_HOME"], "vaultfs")
        os.makedirs(cfg, mode=0o700, exist_ok=True)
        fd = os.open(os.path.join(cfg, "credentials.toml"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                     0o600)
        text = "# written by scripts/bench\n"
        for base in bases:
            text += '[servers."%s"]\nemail = "%s"\ntoken = "%s"\nexpires_at = "%s"\n' % (
                base, self.email, self.token, self.expires)
        os.write(fd, text.encode())
        os.close(fd)

    def link_through(self, via):
        """Mounts through `via` (a link proxy in front of the server) from now on."""
        self.via = via
        self.write_login([self.base, via])

    def start_server(self):
        if self.remote:
            self.serve()

    def serve(self):
        self.server = self.start_serve(self.store, self.port, self.server_log)

    def start_serve(self, store, port, logpath):
        """`vaultfs serve` on STORE at PORT, once it answers: its process."""
        p = start_daemon([self.bin, "serve", "--data-dir", store, "--listen",
                          "127.0.0.1:%d" % port] + self.db_flags + self.serve_flags, logpath,
                         self.serve_env or self.h.vaultfs_env, server=True)
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                http("GET", "http://127.0.0.1:%d/pin/authorize?client_id=vaultfs" % port,
                     timeout=2)
                return p
            except Exception:
                if p.poll() is not None:
                    break
                time.sleep(0.05)
        die("vaultfs serve did not come up; log %s" % logpath)

    def more_users(self, n):
        """N more users, each of an account of its own (Other1, Other2, ...), with a token
        through the running server's pin page: [(email, token, vault root)], made once."""
        made = getattr(self, "others", [])
        for i in range(len(made) + 1, n + 1):
            email, password = "bench%d@example.com" % i, "bench pw %d-%d" % (os.getpid(), i)
            run([self.bin, "user", "add", email, "--account", "Other%d" % i, "--data-dir",
                 self.store] + self.db_flags, input=password + "\n", env=self.h.vaultfs_env)
            made.append((email, self.pin_token(email, password)[0],
                         "Other%d/My First Vault" % i))
        self.others = made
        return made[:n]

    def more_servers(self, n):
        """N more servers of this store (one database and one bucket: DB_FLAGS and SERVE_FLAGS),
        each with a data dir of its own: [(process, base URL)], stopped by the caller."""
        out = []
        for i in range(2, n + 2):
            port = free_port()
            p = self.start_serve("%s-%d" % (self.store, i), port,
                                 "%s-%d.log" % (self.server_log[:-4], i))
            out.append((p, "http://127.0.0.1:%d" % port))
        return out

    def stop_server(self):
        if self.server is not None:
            if hasattr(self, "rss") and "server" in self.rss:
                self.rss["server"] = max(self.rss["server"],
                                         proc_kib(self.server.pid, "VmHWM"))
            kill_proc(self.server)
            self.server = None

    def clear_read_cache(self):
        shutil.rmtree(os.path.join(self.cache, "cache"), ignore_errors=True)

    def make_fixtures(self, n):
        """The flat folder and the tree of N empty files, through the server's API (folder PUT,
        `create_file` with up to 1,000 names a request), with nothing mounted."""
        self.serve()
        try:
            auth = "Basic " + base64.b64encode(("%s:%s" % (self.email, self.token)).encode()
                                               ).decode()
            vault = self.base + "/nodes/pth/" + urllib.parse.quote(VAULT_ROOT)

            def put(rel, body):
                out = http("PUT", vault + "/" + urllib.parse.quote(rel),
                           json.dumps(body).encode(),
                           {"Content-Type": "application/json", "Accept": "application/json",
                            "Authorization": auth}, timeout=120)
                if '"success":true' not in out.replace(" ", ""):
                    die("PUT %s: %s" % (rel, out[:500]))

            for rel, names in fixture_layout(n):
                parts = rel.split("/")
                for i in range(len(parts)):
                    if "/".join(parts[:i + 1]) not in self._made:
                        put("/".join(parts[:i + 1]), {})
                        self._made.add("/".join(parts[:i + 1]))
                for k in range(0, len(names), 1000):
                    put(rel, {"create_file": [{"name": x} for x in names[k:k + 1000]]})
        finally:
            self.stop_server()

    def status(self):
        """What `vaultfs status DIR --json` prints, read from the daemon's control socket
        directly (src/cli/control.rs: one "status" line, one JSON line back): no process to
        start at every poll on a 2-core machine."""
        canon = os.path.realpath(self.dir).encode()
        name = hashlib.md5(canon).hexdigest()[:16] + ".sock"
        path = os.path.join(self.h.vaultfs_env["XDG_RUNTIME_DIR"], "vaultfs", name)
        with socket.socket(socket.AF_UNIX) as so:
            so.settimeout(10)
            so.connect(path)
            so.sendall(b"status\n")
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = so.recv(65536)
                if not chunk:
                    break
                buf += chunk
        return json.loads(buf)

    def queue_empty(self):
        # The upload journal first (JSON lines `put`/`done` by staging ID, read as it grows):
        # reading it costs the daemon nothing, while a status snapshot lists (and serializes)
        # every pending upload, which at 50 polls a second with thousands pending took a large
        # share of the daemon's CPU (see the profile in docs/benchmarks.md). The status is
        # asked once no entry is left. (Not the staging folder: it also holds empty spare
        # files made ahead of need.)
        if self.journal_live():
            self.alive()
            return False
        try:
            st = self.status()
        except (OSError, ValueError):
            self.alive()
            return False
        return not st.get("uploads")

    def journal_live(self):
        """Staging IDs with a `put` and no `done` in journal/log, reading only what was added
        since the last call (from the start again once the log was rewritten)."""
        path = os.path.join(self.cache, "journal", "log")
        try:
            st = os.stat(path)
        except OSError:
            return 0
        j = getattr(self, "_journal", None)
        if j is None or j["ino"] != st.st_ino or st.st_size < j["off"]:
            j = self._journal = {"ino": st.st_ino, "off": 0, "rest": b"", "live": set()}
        with open(path, "rb") as f:
            f.seek(j["off"])
            data = j["rest"] + f.read()
            j["off"] = f.tell()
        lines = data.split(b"\n")
        j["rest"] = lines.pop()
        for line in lines:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("op") == "put":
                j["live"].add(rec.get("id"))
            elif rec.get("op") == "done":
                j["live"].discard(rec.get("id"))
        return len(j["live"])


class Rclone(Mount):
    via = None

    def __init__(self, h, webdav):
        self.webdav = webdav
        self.key = "rclone-webdav" if webdav else "rclone-local"
        self.label = "rclone webdav" if webdav else "rclone local"
        super().__init__(h)
        self.backing = os.path.join(h.work, "backing-" + self.key)
        os.makedirs(self.backing)
        self.rc_port = free_port()
        if webdav:
            self.port = free_port()
            self.server_log = os.path.join(h.work, "rclone-serve.log")

    def env(self):
        return self.h.rclone_env

    def server_role(self):
        return self.webdav

    def mount_cmd(self):
        src = [":webdav:", "--webdav-url", self.via or "http://127.0.0.1:%d/" % self.port] \
            if self.webdav else [self.backing]
        return ["rclone", "mount"] + src[:1] + [self.dir] + src[1:] + [
            "--vfs-cache-mode", "writes", "--vfs-write-back", "0s", "--cache-dir", self.cache,
            "--rc", "--rc-addr", "127.0.0.1:%d" % self.rc_port, "--rc-no-auth"]

    def start_server(self):
        if not self.webdav:
            return
        self.server = start_daemon(["rclone", "serve", "webdav", self.backing, "--addr",
                                    "127.0.0.1:%d" % self.port], self.server_log,
                                   self.h.rclone_env, server=True)
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                http("PROPFIND", "http://127.0.0.1:%d/" % self.port, headers={"Depth": "0"},
                     timeout=2)
                return
            except Exception:
                if self.server.poll() is not None:
                    break
                time.sleep(0.05)
        die("rclone serve webdav did not come up; log %s" % self.server_log)

    def stop_server(self):
        if self.server is not None:
            self.rss["server"] = max(self.rss.get("server", 0), proc_kib(self.server.pid, "VmHWM"))
            kill_proc(self.server)
            self.server = None

    def clear_read_cache(self):
        # Uploads are done before any cold step: the cache holds nothing unstored.
        shutil.rmtree(self.cache, ignore_errors=True)

    def queue_empty(self):
        try:
            s = json.loads(http("POST", "http://127.0.0.1:%d/vfs/stats" % self.rc_port, b"{}",
                                {"Content-Type": "application/json"}))
        except Exception:
            self.alive()
            return False
        d = s.get("diskCache") or {}
        return d.get("uploadsInProgress", 0) == 0 and d.get("uploadsQueued", 0) == 0

    def make_fixtures(self, n):
        make_fixtures_in(self.backing, n)

    def link_through(self, via):
        self.via = via + "/"

    def reset(self, path):
        """After a capped wait: stop the mount (SIGTERM: rclone exits without waiting for its
        queue), drop the queue with the cache dir, mount again. The backing folder keeps
        whatever was uploaded; the run's later steps use other folders."""
        self.rss["mount"] = max(self.rss["mount"], proc_kib(self.proc.pid, "VmHWM"))
        self.proc.terminate()
        unmount(self.dir, self.proc)
        self.proc = None
        shutil.rmtree(self.cache, ignore_errors=True)
        self.mount()

    def backing_ok(self, expect):
        rel, nfiles, nbytes = expect
        n, b = count_tree(os.path.join(self.backing, rel))
        return n == nfiles and (nbytes is None or b == nbytes)
