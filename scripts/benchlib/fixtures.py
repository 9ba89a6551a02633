"""The files every contender starts from: a generated repository (untar, git clone), and the
folder and the tree of empty files of the metadata workloads."""

import os
import random
import shutil
import time

from .util import count_tree, run

WORDS = ("fn let mut pub struct impl use mod self match return if else for while loop async "
         "await Result Option Some None Ok Err String Vec Box Arc Mutex read write path file "
         "node store mount cache upload version error io len size offset bytes buffer").split()


def make_repo(base, nfiles, seed=42):
    """A deterministic mid-size repository: NFILES text and binary files in nested folders,
    three commits. Returns (repo dir, tar path, files in the tar, their bytes)."""
    rnd = random.Random(seed)
    repo = os.path.join(base, "repo")
    lines = []
    for _ in range(4000):
        indent = "    " * rnd.randint(0, 3)
        lines.append(indent + " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(2, 12))))
    dirs = [""]
    for i in range(max(4, nfiles // 20)):
        parent = rnd.choice(dirs[: 1 + len(dirs) // 2])
        dirs.append(os.path.join(parent, "%s_%02d" % (rnd.choice(["src", "lib", "mod", "docs",
                                                                    "tests", "assets"]), i)))
    exts = [".rs"] * 6 + [".md", ".toml", ".txt", ".json"]

    def body(size):
        out, n = [], 0
        while n < size:
            line = rnd.choice(lines)
            out.append(line)
            n += len(line) + 1
        return ("\n".join(out) + "\n").encode()

    paths = []
    for i in range(nfiles):
        d = os.path.join(repo, rnd.choice(dirs))
        os.makedirs(d, exist_ok=True)
        if i % 50 == 49:
            p = os.path.join(d, "blob_%04d.bin" % i)
            data = rnd.randbytes(rnd.randint(20_000, 200_000))
        else:
            p = os.path.join(d, "file_%04d%s" % (i, rnd.choice(exts)))
            data = body(min(int(rnd.lognormvariate(8.0, 1.0)), 150_000))
        with open(p, "wb") as f:
            f.write(data)
        paths.append(p)
    env = dict(os.environ, GIT_CONFIG_NOSYSTEM="1", HOME=base, GIT_AUTHOR_NAME="bench",
               GIT_AUTHOR_EMAIL="bench@example.com", GIT_COMMITTER_NAME="bench",
               GIT_COMMITTER_EMAIL="bench@example.com",
               GIT_AUTHOR_DATE="2026-01-01T00:00:00Z", GIT_COMMITTER_DATE="2026-01-01T00:00:00Z")
    run(["git", "init", "-q", "-b", "main", repo], env=env)
    for c in range(3):
        if c:
            for p in rnd.sample(paths, len(paths) // 10):
                if not p.endswith(".bin"):
                    with open(p, "ab") as f:
                        f.write(body(rnd.randint(100, 3000)))
        run(["git", "-C", repo, "add", "-A"], env=env)
        run(["git", "-C", repo, "commit", "-q", "-m", "commit %d" % c], env=env)
    run(["git", "-C", repo, "gc", "-q"], env=env)
    ref = os.path.join(base, "clone-ref")  # what a clone holds: the files to wait for on rclone
    run(["git", "clone", "-q", "--no-local", repo, ref], env=env)
    clone_files = count_tree(ref)[0]
    shutil.rmtree(ref)
    tar = os.path.join(base, "repo.tar")
    run(["tar", "-cf", tar, "--exclude=.git", "-C", base, "repo"])
    n, b = 0, 0
    for dirpath, dirnames, files in os.walk(repo):
        if ".git" in dirnames:
            dirnames.remove(".git")
        for name in files:
            n += 1
            b += os.lstat(os.path.join(dirpath, name)).st_size
    return repo, tar, n, b, clone_files


def create_files(d, n, size, names=None):
    """Creates N files of SIZE bytes (distinct contents) in D from this process; returns the
    times of the first open and of the last close. NAMES: their names, or paths FOLDER/NAME
    under D, FOLDER made (mkdir, in the time) before its first file."""
    os.makedirs(d, exist_ok=True)
    data = os.urandom(size * n) if size else b""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    made = set()
    t0 = time.perf_counter()
    for i in range(n):
        name = names[i] if names else "f-%05d" % i
        if "/" in name and name.rsplit("/", 1)[0] not in made:
            made.add(name.rsplit("/", 1)[0])
            os.makedirs(os.path.join(d, name.rsplit("/", 1)[0]), exist_ok=True)
        fd = os.open(os.path.join(d, name), flags, 0o644)
        if size:
            os.write(fd, data[i * size:(i + 1) * size])
        os.close(fd)
    return t0, time.perf_counter()


def fixture_layout(n):
    """The fixtures: [(folder, [file names])]: a flat folder of N files, and a tree of N files
    in 10 x 10 folders."""
    out = [("flat", ["f-%05d" % i for i in range(n)])]
    per, made = max(1, n // 100), 0
    for a in range(10):
        for b in range(10):
            k = per if (a, b) != (9, 9) else n - made
            out.append(("tree/d%02d/d%02d" % (a, b), ["f-%05d" % (made + i) for i in range(k)]))
            made += k
    return out


def make_fixtures_in(base, n):
    for rel, names in fixture_layout(n):
        create_files(os.path.join(base, rel), len(names), 0, names)
