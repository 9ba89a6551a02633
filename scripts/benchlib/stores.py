"""The shared store's services for the `shared` mode, started on the scratch file system and
stopped with everything else: a PostgreSQL of its own (the Debian packages' server, as
tests/common/pg.rs starts one, but with its durable defaults: fsync and synchronous commit on)
and an S3-compatible server (s3s-fs, or moto as the tests use)."""

import glob
import os
import shutil
import signal
import socket
import time

from .setup import Reg, start_daemon, stop_proc
from .util import HOME0, die, free_port, http, log, run

BUCKET = "vaultfs-bench"
NOBODY = 65534  # PostgreSQL refuses to run as root


def reachable(path):
    """Lets user nobody reach PATH (x on every folder above it that is ours)."""
    d = path
    while d not in ("/", "") and Reg.work and d.startswith(Reg.work):
        os.chmod(d, os.stat(d).st_mode | 0o111)
        d = os.path.dirname(d)


def start_postgres(h):
    """initdb in the scratch dir, postgres on a Unix socket only, a database `bench`: its URL."""
    pg_bin = os.environ.get("VAULTFS_PG_BIN") or next(iter(sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]),
        reverse=True)), "")
    if not os.access(os.path.join(pg_bin, "initdb"), os.X_OK):
        die("no PostgreSQL (apt-get install -y postgresql, or VAULTFS_PG_BIN=the folder of initdb)")
    d = os.path.join(h.work, "pg")
    os.makedirs(d)
    as_pg = []
    if os.geteuid() == 0:
        os.chown(d, NOBODY, NOBODY)
        reachable(d)
        as_pg = ["setpriv", "--reuid=%d" % NOBODY, "--regid=%d" % NOBODY, "--clear-groups"]
    log("starting PostgreSQL (%s) in %s" % (pg_bin, d))
    run(as_pg + [os.path.join(pg_bin, "initdb"), "-D", os.path.join(d, "data"), "-U", "vaultfs",
                 "--auth=trust", "--encoding=UTF8", "--no-locale"], timeout=300)
    p = start_daemon(as_pg + [os.path.join(pg_bin, "postgres"), "-D", os.path.join(d, "data"),
                              "-k", d, "-c", "listen_addresses=", "-c", "max_connections=300"],
                     os.path.join(h.work, "postgres.log"), server=True)
    h.stop_last.append(p)
    h.services["PostgreSQL"] = p
    for _ in range(600):
        if run([os.path.join(pg_bin, "pg_isready"), "-q", "-h", d, "-U", "vaultfs", "-d",
                "postgres"], check=False).returncode == 0:
            break
        if p.poll() is not None:
            die("PostgreSQL stopped; log %s" % os.path.join(h.work, "postgres.log"))
        time.sleep(0.1)
    run([os.path.join(pg_bin, "createdb"), "-h", d, "-U", "vaultfs", "bench"])
    h.info["postgres"] = run([os.path.join(pg_bin, "postgres"), "--version"]).stdout.strip()
    h.psql = os.path.join(pg_bin, "psql")
    return "postgres://vaultfs@localhost/bench?host=" + d


def s3_server(kind):
    """(kind, path) of the S3-compatible server to use: KIND if given, else s3s-fs where it is
    installed, else moto."""
    s3s = os.environ.get("S3S_FS_BIN") or shutil.which("s3s-fs") or \
        os.path.join(HOME0, ".cargo", "bin", "s3s-fs")
    moto = os.environ.get("VAULTFS_MOTO_SERVER") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(HOME0, ".cache"),
        "vaultfs-ci", "moto", "bin", "moto_server")
    if kind in (None, "s3s-fs") and os.access(s3s, os.X_OK):
        return "s3s-fs", s3s
    if kind == "s3s-fs":
        die("no s3s-fs (cargo install --locked s3s-fs@0.14.1 --features binary, or S3S_FS_BIN)")
    if os.access(moto, os.X_OK):
        return "moto", moto
    die("no S3-compatible server: cargo install --locked s3s-fs@0.14.1 --features binary (or "
        "moto, as .ci/run installs it; VAULTFS_MOTO_SERVER)")


def start_s3(h, kind):
    """An S3-compatible server on loopback with the bucket made: (its name, the server flags
    --blobs and --s3-endpoint, the credentials' environment)."""
    kind, path = s3_server(kind)
    port = free_port()
    endpoint = "http://127.0.0.1:%d" % port
    key, secret = "bench", "bench-secret-%d" % os.getpid()
    logpath = os.path.join(h.work, kind + ".log")
    if kind == "s3s-fs":
        # Its buckets are the folders of its root; it checks the requests' signatures.
        root = os.path.join(h.work, "s3")
        os.makedirs(os.path.join(root, BUCKET))
        p = start_daemon([path, "--host", "127.0.0.1", "--port", str(port), "--access-key", key,
                          "--secret-key", secret, root], logpath, server=True)
        version = run([path, "--version"], check=False).stdout.strip()
    else:
        p = start_daemon([path, "-H", "127.0.0.1", "-p", str(port)], logpath, server=True)
        version = "moto_server (%s)" % path
    deadline = time.time() + 60
    while True:
        try:
            if kind == "moto":
                http("PUT", "%s/%s" % (endpoint, BUCKET), b"", timeout=5)
            else:
                socket.create_connection(("127.0.0.1", port), timeout=2).close()
            break
        except OSError:
            if p.poll() is not None or time.time() > deadline:
                die("%s did not come up; log %s" % (kind, logpath))
            time.sleep(0.1)
    h.info["s3"] = version
    h.services[kind] = p
    env = dict(h.vaultfs_env, AWS_ACCESS_KEY_ID=key, AWS_SECRET_ACCESS_KEY=secret,
               AWS_REGION="us-east-1")
    return kind, ["--blobs", "s3://%s/run" % BUCKET, "--s3-endpoint", endpoint], env


def stop_services(h):
    """PostgreSQL by its fast shutdown (SIGINT: it does not wait for clients), then the rest."""
    for p in reversed(h.stop_last):
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
        stop_proc(p)
    h.stop_last.clear()
