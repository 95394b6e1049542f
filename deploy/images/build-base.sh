#!/usr/bin/env bash
# Builds the sandbox image of the `base` template, `dormice-base:latest`, locally and without any
# image registry: a Debian root made by debootstrap from Debian's own mirror, imported with
# `docker import`. It is what E2B's base template offers an agent: python3 and pip, git, curl,
# sudo without a password, procps and the usual shell tools, a user `user` with home /home/user,
# and the login profile the SDKs' `/bin/bash -l -c` reads.
#
# Idempotent: the image is also tagged `build-<fingerprint>`, a hash of this script, of
# _common.sh (the package list and every step are in them) and of the suite and mirror; when that
# tag exists nothing is rebuilt. `--force` rebuilds anyway (to take Debian's newer packages). The
# .debs are kept in /var/cache/dormice/debootstrap, so a rebuild downloads only what changed.
#
# Needs root (debootstrap); installs debootstrap with apt-get when it is missing. About 40 s on a
# fresh machine (measured: see the README's Docker section); a few seconds when up to date.
#
# Usage: deploy/images/build-base.sh [--force] [image]   (image defaults to dormice-base:latest)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
force=0
if [ "${1:-}" = "--force" ]; then
  force=1
  shift
fi
image="${1:-dormice-base:latest}"
who=build-base
# shellcheck source=deploy/images/_common.sh
. "$here/_common.sh"

suite="${DORMICE_DEBIAN_SUITE:-bookworm}"
mirror="${DORMICE_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
cache=/var/cache/dormice/debootstrap
# minbase already brings bash, coreutils, dash (/bin/sh), findutils, grep, sed, mawk, tar, gzip,
# diffutils, util-linux, login and passwd. --include installs no Recommends, which keeps
# python3-pip from pulling build-essential (~200 MB) in.
packages=(
  # python-is-python3: `python` as on E2B's base template (the SDKs' own tests run
  # `python -m http.server`).
  python3 python-is-python3 python3-pip python3-venv
  git curl wget ca-certificates openssh-client
  sudo libnss-myhostname procps psmisc iproute2 iputils-ping netbase
  less nano file jq unzip zip xz-utils bzip2 bash-completion
  # setfattr/getfattr: file metadata (envd's X-Metadata-*) lives in user.e2b.* xattrs.
  attr
)

images_need_docker
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
images_lock
fingerprint=$({
  cat "$0" "$here/_common.sh"
  echo "$suite $mirror"
} | sha256sum | cut -c1-12)
if images_up_to_date "$fingerprint"; then exit 0; fi

if ! command -v debootstrap >/dev/null; then
  say "installing debootstrap from Debian (apt-get install -y debootstrap)"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q debootstrap >/dev/null ||
    die "could not install debootstrap: run 'apt-get update' first (as root), then this script again"
fi

root=$(mktemp -d /var/tmp/dormice-base.XXXXXX)
cleanup() {
  # debootstrap mounts /proc and /sys (and, inside a container, binds /dev) under the root while
  # it runs: unmount whatever a failed run left there, and never let rm cross a mount point.
  grep -o " $root/[^ ]*" /proc/mounts | sort -r | xargs -r $sudo umount -l 2>/dev/null || true
  $sudo rm -rf --one-file-system "$root"
}
trap cleanup EXIT

say "debootstrap $suite from $mirror into $root (${#packages[@]} packages on top of minbase)"
$sudo mkdir -p "$cache"
log="$root.log"
if ! $sudo debootstrap --variant=minbase --cache-dir="$cache" \
  --include="$(IFS=,; echo "${packages[*]}")" "$suite" "$root" "$mirror" >"$log" 2>&1; then
  tail -n 15 "$log" >&2
  die "debootstrap failed (its log: $log); is $mirror reachable? (DORMICE_DEBIAN_MIRROR picks another)"
fi
rm -f "$log"
# The cache keeps only what this build used, so a point release's .debs replace the old ones
# instead of piling up (about 75 MB).
for deb in "$cache"/*.deb; do
  [ -e "$root/var/cache/apt/archives/${deb##*/}" ] || $sudo rm -f "$deb"
done

say "configuring the user, sudo, the login profile; removing caches and docs"
# shellcheck disable=SC2016 # expanded inside the chroot
$sudo chroot "$root" /bin/bash -euo pipefail -c '
useradd --create-home --uid 1000 --user-group --shell /bin/bash user
# As in E2B'\''s base: the user may become root without a password.
usermod -aG sudo user
echo "user ALL=(ALL:ALL) NOPASSWD: ALL" >/etc/sudoers.d/user
chmod 0440 /etc/sudoers.d/user
visudo -cq
# Docker gives a sandbox without a network no /etc/hosts line for its hostname, and sudo then
# says "unable to resolve host" on every call: nss-myhostname resolves it without one.
grep -q "^hosts:.*myhostname" /etc/nsswitch.conf || sed -i "s/^hosts:.*/& myhostname/" /etc/nsswitch.conf
# Root and the user get one PATH that also holds pip'\''s --user scripts.
cat >/etc/profile.d/dormice.sh <<'\''PROFILE'\''
export PATH="$HOME/.local/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
export LANG="${LANG:-C.UTF-8}"
PROFILE
echo dormice-sandbox >/etc/hostname
# Later apt-get installs in a sandbox keep the image small too (as Debian'\''s own images do).
cat >/etc/dpkg/dpkg.cfg.d/dormice-nodoc <<'\''DPKG'\''
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
DPKG
echo "APT::Install-Recommends \"false\";" >/etc/apt/apt.conf.d/99dormice-norecommends
apt-get clean
find /usr/share/doc -mindepth 1 -not -name copyright -not -type d -delete
find /usr/share/doc -mindepth 1 -type d -empty -delete
rm -rf /usr/share/man/* /usr/share/info/* /var/lib/apt/lists/* /var/cache/apt/*.bin \
  /var/cache/debconf/*-old /var/lib/dpkg/*-old /var/log/*.log /var/log/apt/* /tmp/* /var/tmp/*
find /usr/share/locale -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +
'
# The engine mounts its own /dev, /proc and /sys, hosts, hostname and resolv.conf.
$sudo find "$root/dev" "$root/proc" "$root/sys" -mindepth 1 -delete 2>/dev/null || true

images_import "$root" "dormice base: Debian $suite minbase + python3, git, curl, sudo" \
  'USER user' \
  'WORKDIR /home/user' \
  'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  'ENV LANG=C.UTF-8' \
  'CMD ["/bin/bash"]'

# What the SDKs and the executor's helper scripts (node/executors/docker/_files.ts, _exec.ts)
# rely on: the login shell, python, pip, sudo as the user, git, curl, ps, and GNU stat/find.
images_smoke "$(printf 'user:/home/user:/home/user\n2\nsudo ok\nbash\nuser\nana\nana')" '
echo "$(id -un):$HOME:$(pwd)"
python3 -c "print(1+1)"
python -c "pass" || echo "no python"
python3 -m pip --version >/dev/null || echo "no pip"
sudo -n true && echo "sudo ok"
git --version >/dev/null || echo "no git"
curl --version >/dev/null || echo "no curl"
ps -o comm= -p $$
for t in grep find stat kill mv rm rmdir mkdir dirname sleep cat; do
  command -v $t >/dev/null || echo "missing $t"
done
stat -c %U /home/user
# File metadata (user.e2b.* xattrs) must stick in /tmp and the home, on overlay2.
for d in /tmp /home/user; do
  touch "$d/.xattr" && setfattr -n user.e2b.owner -v ana "$d/.xattr" &&
    getfattr --absolute-names --only-values -n user.e2b.owner "$d/.xattr" && echo
  rm -f "$d/.xattr"
done'
images_promote
