#!/usr/bin/env bash
# Builds fstests from the tarball beside this script into DIR, for tests/fstests.rs (run by
# .ci/run). Installs the build dependencies with apt-get
# when the suite is not built yet. Usage: build.sh DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=$1
tarball=$(ls "$here"/xfstests-*.tar.gz)
stamp="$dir/.vaultfs-built-from"
if [ -x "$dir/check" ] && [ -x "$dir/src/feature" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$(basename "$tarball")" ]; then
  exit 0
fi
if command -v apt-get >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq xfslibs-dev uuid-dev libtool-bin e2fsprogs automake gcc make libuuid1 \
    quota attr acl libacl1-dev libaio-dev xfsprogs libgdbm-dev gawk fio uuid-runtime python3 \
    sqlite3 libcap-dev liburing-dev bc fuse3 >/dev/null
fi
rm -rf "$dir"; mkdir -p "$dir"
tar -xzf "$tarball" -C "$dir" --strip-components=1
# The suite takes a FUSE mount's type to be plain "fuse"; vaultfs mounts say "fuse.vaultfs"
# (their subtype, as sshfs's and rclone's do). Map it the way the suite already maps
# fuse.glusterfs and fuse.ceph-fuse.
sed -i "s|-e 's/fuse.glusterfs/glusterfs/'|-e 's/fuse.glusterfs/glusterfs/' -e 's/^fuse\\\\.vaultfs\$/fuse/'|" "$dir/common/rc"
grep -qF 'fuse\.vaultfs' "$dir/common/rc" || { echo "build.sh: could not patch _fs_type in common/rc" >&2; exit 1; }
make -C "$dir" -j"$(nproc)" >"$dir/build.log" 2>&1 || { tail -20 "$dir/build.log"; exit 1; }
basename "$tarball" > "$stamp"
echo "fstests built in $dir"
