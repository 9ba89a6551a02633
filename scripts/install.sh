#!/usr/bin/env bash
# Installs vaultfs system-wide: fuse3 (system package manager), the binary in /usr/local/bin, the
# mount helper /sbin/mount.fuse.vaultfs, the systemd user unit template (and the system example
# in /usr/share/doc/vaultfs). Safe to run again. `--uninstall` removes what it installed (never
# your data, cache or logins).
#
#   sudo scripts/install.sh [--binary PATH] [--uninstall]
#
# Without --binary it installs target/release/vaultfs, building it first with cargo if missing.
# DESTDIR=/some/root installs under that root (for packaging; no package manager then).
set -euo pipefail
cd "$(dirname "$0")/.."

root="${DESTDIR:-}"
bin_dir="$root/usr/local/bin"
helper="$root/sbin/mount.fuse.vaultfs"
user_units="$root/usr/lib/systemd/user"
doc_dir="$root/usr/share/doc/vaultfs"
binary=target/release/vaultfs
mode=install

while [ $# -gt 0 ]; do
  case "$1" in
    --binary) binary="$2"; shift 2 ;;
    --uninstall) mode=uninstall; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

if [ -z "$root" ] && [ "$(id -u)" -ne 0 ]; then
  echo "install.sh: run as root (sudo $0)" >&2
  exit 1
fi

reload() {
  if [ -z "$root" ] && command -v systemctl >/dev/null 2>&1; then
    systemctl daemon-reload 2>/dev/null || true
  fi
}

if [ "$mode" = uninstall ]; then
  rm -f "$bin_dir/vaultfs" "$helper" "$user_units/vaultfs@.service"
  rm -rf "$doc_dir"
  reload
  echo "vaultfs removed (fuse3, your data in ~/.local/share/vaultfs and logins are kept)"
  exit 0
fi

# fuse3 from the system's package manager.
if [ -z "$root" ] && ! command -v fusermount3 >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fuse3
  elif command -v dnf >/dev/null 2>&1; then dnf install -y fuse3
  elif command -v pacman >/dev/null 2>&1; then pacman -S --needed --noconfirm fuse3
  elif command -v zypper >/dev/null 2>&1; then zypper --non-interactive install fuse3
  else
    echo "install.sh: install fuse3 with your package manager, then run this again" >&2
    exit 1
  fi
fi

if [ ! -x "$binary" ]; then
  if [ "$binary" = target/release/vaultfs ] && command -v cargo >/dev/null 2>&1; then
    cargo build --release --locked
  else
    echo "install.sh: no binary at $binary (build it with: cargo build --release --locked)" >&2
    exit 1
  fi
fi

install -d "$bin_dir" "$(dirname "$helper")" "$user_units" "$doc_dir"
install -m 0755 "$binary" "$bin_dir/vaultfs.new"
mv -f "$bin_dir/vaultfs.new" "$bin_dir/vaultfs"   # atomic: running mounts keep the old inode
ln -sfn /usr/local/bin/vaultfs "$helper"
install -m 0644 scripts/systemd/vaultfs@.service "$user_units/vaultfs@.service"
install -m 0644 scripts/systemd/vaultfs-srv-vault.service "$doc_dir/vaultfs-srv-vault.service.example"
reload

cat <<'MSG'
vaultfs installed:
  /usr/local/bin/vaultfs, /sbin/mount.fuse.vaultfs (mount -t fuse.vaultfs, /etc/fstab),
  /usr/lib/systemd/user/vaultfs@.service
First mount:   mkdir -p ~/Vault && vaultfs mount ~/Vault --daemon
At login:      systemctl --user enable --now "vaultfs@$(systemd-escape --path ~/Vault).service"
MSG
