#!/usr/bin/env bash
# Brings up a local Docker engine for the docker suites and builds the sandbox images: the
# busybox `minimal` one (seconds; the fast suites use it), the Debian `base` one (debootstrap,
# about a minute on a fresh machine; the E2B SDK suite uses it) and `code-interpreter` on top of
# it (apt-get, a few minutes; the code interpreter suite uses it). Safe to run again: installs
# docker.io only if missing, starts dockerd only if it does not answer, and each build script
# skips an image whose fingerprint tag exists. No image registry is needed.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
socket=/var/run/docker.sock
say() { echo "ci/docker: $*"; }
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"

if ! command -v dockerd >/dev/null || ! command -v docker >/dev/null; then
  say "installing docker.io"
  $sudo apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q docker.io >/dev/null
fi

if docker info >/dev/null 2>&1; then
  say "the engine already answers on $socket"
else
  log=/tmp/dockerd.log
  say "starting dockerd (log: $log)"
  # setsid: the engine must outlive this script and not take its signals.
  $sudo setsid nohup dockerd >"$log" 2>&1 </dev/null &
  for _ in $(seq 1 120); do
    [ -S "$socket" ] && docker info >/dev/null 2>&1 && break
    sleep 0.25
  done
  if ! docker info >/dev/null 2>&1; then
    echo "ci/docker: dockerd did not answer on $socket within 30 s; its log says:" >&2
    tail -n 20 "$log" >&2 || true
    exit 1
  fi
  say "the engine answers on $socket"
fi

"$here/deploy/images/build-minimal.sh"
"$here/deploy/images/build-base.sh"
# The base plus Jupyter's Python kernel, matplotlib, numpy and pandas from Debian's mirror (about
# 2.5 min on a fresh machine; the code interpreter suite uses it).
"$here/deploy/images/build-code-interpreter.sh"

# Sandbox networks whose node was killed before it could remove them (a CI machine may be reused):
# the engine has address pools for about thirty networks, and only unused ones are pruned. Both
# kinds go (label dormice.network=internal or =egress), then the host firewall rules of bridges
# that no longer exist: a rule names its bridge, so one left behind matches nothing, but a
# reused machine would pile them up.
docker network prune -f --filter label=dormice.network >/dev/null
if command -v iptables >/dev/null; then
  rules=$(iptables -w 5 -S INPUT 2>/dev/null | grep -- '--comment "dormice ' || true)
  while read -r rule; do
    bridge=$(printf '%s\n' "$rule" | sed -nE 's/.* -i ([^ ]+) .*/\1/p')
    [ -n "$bridge" ] && [ ! -e "/sys/class/net/$bridge" ] || continue
    eval "iptables -w 5 -D ${rule#-A }" || true
  done <<<"$rules"
  # Sandboxes' egress rules (a jump in DOCKER-USER per sandbox, to its DMN-<hash> chains) on
  # bridges that no longer exist, likewise.
  jumps=$(iptables -w 5 -S DOCKER-USER 2>/dev/null | grep -- ' -j DMN-' || true)
  while read -r rule; do
    bridge=$(printf '%s\n' "$rule" | sed -nE 's/.* -i ([^ ]+) .*/\1/p')
    [ -n "$bridge" ] && [ ! -e "/sys/class/net/$bridge" ] || continue
    chain=${rule##* -j }
    eval "iptables -w 5 -D ${rule#-A }" || true
    for c in "$chain" "$chain-a" "$chain-b"; do
      iptables -w 5 -F "$c" 2>/dev/null || true
      iptables -w 5 -X "$c" 2>/dev/null || true
    done
  done <<<"$jumps"
fi
