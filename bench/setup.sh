#!/bin/sh
# Installs the load generator and the reference proxy the benchmarks need (Debian packages),
# when they are missing. Needs root for apt-get; without it the benchmarks that need the tools
# are skipped with a printed reason.
set -e
missing=""
command -v wrk >/dev/null 2>&1 || missing="$missing wrk"
command -v nginx >/dev/null 2>&1 || missing="$missing nginx-light"
command -v iptables >/dev/null 2>&1 || missing="$missing iptables"
[ -z "$missing" ] && exit 0
if [ "$(id -u)" != "0" ]; then
  echo "bench/setup.sh: not root, cannot install:$missing (those benchmarks will be skipped)" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
# shellcheck disable=SC2086
apt-get install -y --no-install-recommends $missing >/dev/null 2>&1 || {
  apt-get update >/dev/null
  apt-get install -y --no-install-recommends $missing >/dev/null
}
echo "bench/setup.sh: installed$missing" >&2
