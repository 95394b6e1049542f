#!/usr/bin/env bash
# Builds the sandbox base image `dormice-base:latest` locally, without any image registry:
# a root fs of Debian's busybox-static (coreutils-ish tools as symlinks) plus Debian's bash and
# the shared libraries it links, imported with `docker import`. The E2B SDK runs every command
# as `/bin/bash -l -c <cmd>`, so bash with a login profile is the one hard requirement.
#
# Idempotent: the image is also tagged with a hash of this script and of the binaries it copies;
# when that tag exists nothing is rebuilt. `--force` rebuilds anyway.
#
# Usage: deploy/images/build-base.sh [--force] [image]   (image defaults to dormice-base:latest)
set -euo pipefail

force=0
if [ "${1:-}" = "--force" ]; then force=1; shift; fi
image="${1:-dormice-base:latest}"
repo="${image%:*}"
started=$(date +%s%N)
say() { echo "build-base: $*"; }

command -v docker >/dev/null || { echo "build-base: docker CLI not found: run .ci/docker.sh or apt-get install -y docker.io" >&2; exit 1; }
docker info >/dev/null 2>&1 || { echo "build-base: the Docker engine does not answer on /var/run/docker.sock: start it with 'dockerd &' (or .ci/docker.sh)" >&2; exit 1; }

if [ ! -x /bin/busybox ] || ! /bin/busybox --list | grep -qx stat; then
  say "installing busybox-static from Debian (apt-get install -y busybox-static)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q busybox-static >/dev/null
fi
bash_bin=$(command -v bash)
# The shared libraries bash links (libtinfo, libc, the loader), as ldd resolves them.
libs=$(ldd "$bash_bin" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | sort -u)

fingerprint=$( { cat "$0"; sha256sum /bin/busybox "$bash_bin" $libs; } | sha256sum | cut -c1-12)
if [ "$force" = 0 ] && docker image inspect "$repo:build-$fingerprint" >/dev/null 2>&1; then
  docker tag "$repo:build-$fingerprint" "$image"
  say "$image is up to date (tag $repo:build-$fingerprint exists); nothing rebuilt (--force to rebuild)"
  exit 0
fi

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

say "importing into Docker as $image"
tar -C "$root" --numeric-owner -c . | docker import \
  --change 'USER user' \
  --change 'WORKDIR /home/user' \
  --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin' \
  --change 'CMD ["/bin/sh"]' \
  -m "dormice base: busybox-static + bash ($fingerprint)" - "$image" >/dev/null

say "checking that '/bin/bash -l -c' works as user"
# The executor's helpers need these applets (kill by environment, stat, list, mkdir, move).
out=$(docker run --rm --network none "$image" /bin/bash -l -c 'for t in grep find stat kill mv rm rmdir mkdir dirname sleep cat ps; do command -v $t >/dev/null || echo "missing $t"; done
echo "$(id -un):$HOME:$(pwd)"; stat -c %U /home/user')
[ "$out" = "$(printf 'user:/home/user:/home/user\nuser')" ] || { echo "build-base: smoke test failed: got '$out'" >&2; exit 1; }
# Tagged only once the smoke test passed, so a broken build is never taken as up to date.
docker tag "$image" "$repo:build-$fingerprint"
size=$(docker image inspect -f '{{.Size}}' "$image")
took=$(( ($(date +%s%N) - started) / 1000000 ))
say "built $image (also $repo:build-$fingerprint), $((size / 1024)) KiB, in ${took} ms"
