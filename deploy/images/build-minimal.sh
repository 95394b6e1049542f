#!/usr/bin/env bash
# Builds the sandbox image of the `minimal` template, `dormice-minimal:latest`, locally and
# without any image registry: a root fs of Debian's busybox-static (the usual tools as applet
# symlinks) plus the host's bash and the shared libraries it links, imported with `docker
# import`. About 6 MB and built in seconds: the image of the fast test suites. The E2B SDK runs
# every command as `/bin/bash -l -c <cmd>`, so bash with a login profile is the one hard
# requirement; python3, sudo, git and curl are in the `base` image (build-base.sh).
#
# Idempotent: the image is also tagged `build-<fingerprint>`, a hash of this script, of
# _common.sh and of the binaries it copies; when that tag exists nothing is rebuilt. `--force`
# rebuilds anyway.
#
# Usage: deploy/images/build-minimal.sh [--force] [image]   (defaults to dormice-minimal:latest)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
force=0
if [ "${1:-}" = "--force" ]; then
  force=1
  shift
fi
image="${1:-dormice-minimal:latest}"
who=build-minimal
# shellcheck source=deploy/images/_common.sh
. "$here/_common.sh"

images_need_docker
images_lock
if [ ! -x /bin/busybox ] || ! /bin/busybox --list | grep -qx stat; then
  say "installing busybox-static from Debian (apt-get install -y busybox-static)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q busybox-static >/dev/null
fi
bash_bin=$(command -v bash)
# The shared libraries bash links (libtinfo, libc, the loader), as ldd resolves them.
libs=$(ldd "$bash_bin" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | sort -u)

# shellcheck disable=SC2086 # $libs is a list of paths
fingerprint=$({
  cat "$0" "$here/_common.sh"
  sha256sum /bin/busybox "$bash_bin" $libs
} | sha256sum | cut -c1-12)
if images_up_to_date "$fingerprint"; then exit 0; fi

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
say "assembling the root fs in $root"
mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,usr/local/bin,etc/profile.d,home/user,root,tmp,var/tmp,proc,sys,dev,run}
cp /bin/busybox "$root/bin/busybox"
# Every busybox applet as a symlink in /bin; bash stays the real bash.
for applet in $(/bin/busybox --list); do
  [ "$applet" = busybox ] || [ "$applet" = bash ] || ln -sf busybox "$root/bin/$applet"
done
cp "$bash_bin" "$root/bin/bash"
for lib in $libs; do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
# Debian's merged /usr: /lib64/ld-linux... and /lib/x86_64-linux-gnu/... must both resolve.
if [ -d "$root/usr/lib" ] && [ ! -e "$root/lib" ]; then ln -s usr/lib "$root/lib"; fi

cat >"$root/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/bin/bash
user:x:1000:1000:user:/home/user:/bin/bash
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
PASSWD
cat >"$root/etc/group" <<'GROUP'
root:x:0:
user:x:1000:
nogroup:x:65534:
GROUP
cat >"$root/etc/profile" <<'PROFILE'
export PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin
export HOME="${HOME:-/home/user}"
for f in /etc/profile.d/*.sh; do [ -r "$f" ] && . "$f"; done
unset f
PROFILE
echo 'dormice-sandbox' >"$root/etc/hostname"
chmod 1777 "$root/tmp" "$root/var/tmp"
chmod 700 "$root/root"
chown -R 1000:1000 "$root/home/user"

images_import "$root" "dormice minimal: busybox-static + bash" \
  'USER user' \
  'WORKDIR /home/user' \
  'ENV PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin' \
  'CMD ["/bin/sh"]'

# The executor's helpers need these applets (kill by environment, stat, list, mkdir, move).
images_smoke "$(printf 'user:/home/user:/home/user\nuser')" '
for t in grep find stat kill mv rm rmdir mkdir dirname sleep cat ps; do
  command -v $t >/dev/null || echo "missing $t"
done
echo "$(id -un):$HOME:$(pwd)"
stat -c %U /home/user'
images_promote
