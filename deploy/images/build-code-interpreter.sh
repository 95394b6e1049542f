#!/usr/bin/env bash
# Builds the sandbox image of the `code-interpreter` template (also served as
# `code-interpreter-v1`, the default of `@e2b/code-interpreter`), `dormice-code-interpreter:latest`,
# locally and without any image registry: the Debian base (deploy/images/build-base.sh) plus
# Debian's Jupyter kernel machinery (python3-ipykernel, python3-jupyter-client) and the data
# packages a chart needs (python3-matplotlib, python3-numpy, python3-pandas), installed with apt-get
# from Debian's own mirror, and the code interpreter's server (code-interpreter/server.py), which
# the node starts on port 49999 when a sandbox is created (the image's `dormice.start` label).
#
# No JavaScript kernel: Debian packages none, and npm's (ijavascript, tslab) need the native
# `zeromq` module, built with node-gyp or fetched as a prebuilt binary from GitHub at install.
#
# Two steps, each cached by fingerprint: the packages (the package list, the install script and
# the base image's id; about 90 s from the mirror) under `packages-<fingerprint>`, then the server files on
# top (a second) under `build-<fingerprint>`. Editing the server rebuilds only the second step.
# `--force` rebuilds both (to take Debian's newer packages).
#
# Usage: deploy/images/build-code-interpreter.sh [--force] [image]
#        (image defaults to dormice-code-interpreter:latest)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
force=0
args=()
if [ "${1:-}" = "--force" ]; then
  force=1
  args=(--force)
  shift
fi
image="${1:-dormice-code-interpreter:latest}"
base_image="${DORMICE_CODE_INTERPRETER_BASE:-dormice-base:latest}"
who=build-code-interpreter
# shellcheck source=deploy/images/_common.sh
. "$here/_common.sh"

packages=(
  python3-ipykernel python3-jupyter-client
  python3-matplotlib python3-numpy python3-pandas
)

# What goes into the image from code-interpreter/ (its test stays out).
server_files=("$here/code-interpreter/server.py" "$here/code-interpreter/start.sh")

images_need_docker
# The base first (a no-op when it is up to date): its id is part of both fingerprints.
"$here/build-base.sh" "${args[@]}" "$base_image"
base_id=$(docker image inspect -f '{{.Id}}' "$base_image")
images_lock

packages_fingerprint=$({
  # The package list and the install script.
  sed -n '/^packages=(/,/^)/p; /^  container=$(docker create --user root "$base_image"/,/tmp\/\*")$/p' "$0"
  echo "$base_id"
} | sha256sum | cut -c1-12)
fingerprint=$({
  cat "$0" "$here/_common.sh" "${server_files[@]}"
  echo "$packages_fingerprint"
} | sha256sum | cut -c1-12)
if images_up_to_date "$fingerprint"; then exit 0; fi

packages_image="$images_repo:packages-$packages_fingerprint"
container=""
cleanup() { [ -z "$container" ] || docker rm -f "$container" >/dev/null 2>&1 || true; }
trap cleanup EXIT

if [ "$force" = 0 ] && docker image inspect "$packages_image" >/dev/null 2>&1; then
  say "the packages are up to date ($packages_image)"
else
  say "apt-get install ${packages[*]} on $base_image (from Debian's mirror)"
  container=$(docker create --user root "$base_image" /bin/bash -euo pipefail -c "
    apt-get update -qq
    # Debian's python3-scipy (which matplotlib and pandas pull in) depends on python3-pythran, a
    # compiler of Python to C++ that scipy does not use at run time and that brings gcc, g++ and
    # the boost headers (about 500 MB): a stub package provides its name instead.
    mkdir -p /tmp/stub/DEBIAN
    printf '%s\\n' 'Package: dormice-pythran-stub' 'Version: 1' 'Architecture: all' \\
      'Maintainer: dormice' 'Provides: python3-pythran' \\
      'Description: stands in for python3-pythran, which scipy does not need at run time' \\
      >/tmp/stub/DEBIAN/control
    dpkg-deb -b /tmp/stub /tmp/stub.deb >/dev/null
    dpkg -i /tmp/stub.deb >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ${packages[*]} >/dev/null
    # Compiled bytecode is written at first import as the user otherwise (and is not allowed to).
    python3 -c 'import matplotlib.pyplot, pandas, numpy, ipykernel, jupyter_client'
    apt-get clean
    rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt/* /var/log/*.log /tmp/* /var/tmp/*")
  log=$(mktemp)
  if ! docker start -a "$container" >"$log" 2>&1; then
    tail -n 15 "$log" >&2
    die "apt-get install in $base_image failed (is deb.debian.org reachable?)"
  fi
  rm -f "$log"
  # The packages step keeps the base's settings; the second step sets the user and the label.
  docker commit -c 'USER user' -c 'CMD ["/bin/bash"]' "$container" "$packages_image" >/dev/null
  docker rm "$container" >/dev/null
  container=""
  # Older packages steps of this repository no longer match any script.
  docker image ls "$images_repo" --format '{{.Tag}}' | { grep '^packages-' || true; } |
    { grep -vx "packages-$packages_fingerprint" || true; } | while read -r tag; do
    docker rmi "$images_repo:$tag" >/dev/null 2>&1 || true
  done
fi

say "adding the server (code-interpreter/) to /opt/dormice/code-interpreter"
container=$(docker create --user root "$packages_image" true)
# A tar on stdin makes the directories on the way; the files belong to root and are read-only.
tar -C "$here/code-interpreter" --owner=0 --group=0 --mode=a+rX,go-w \
  --transform 's,^,opt/dormice/code-interpreter/,' -c server.py start.sh |
  docker cp - "$container:/"
# The node runs the label's command (as the image's user) after it starts a sandbox and hands the
# sandbox out only once it exited 0: it starts the server and waits until port 49999 answers.
docker commit \
  -c 'USER user' -c 'WORKDIR /home/user' -c 'CMD ["/bin/bash"]' \
  -c 'LABEL dormice.start="/opt/dormice/code-interpreter/start.sh"' \
  -m "dormice code-interpreter: base + ipykernel, jupyter-client, matplotlib, numpy, pandas ($fingerprint)" \
  "$container" "$images_candidate" >/dev/null
docker rm "$container" >/dev/null
container=""

# The start script brings the server up (with no network, as a sandbox may have none), and one cell
# runs through the kernel with a chart.
images_smoke "$(printf 'ready\n42\nimage/png')" '
/opt/dormice/code-interpreter/start.sh >/dev/null && echo ready
python3 - <<PY
import json, urllib.request
def run(code):
    req = urllib.request.Request("http://127.0.0.1:49999/execute", json.dumps({"code": code}).encode(),
                                 {"Content-Type": "application/json"})
    return [json.loads(l) for l in urllib.request.urlopen(req, timeout=60).read().splitlines() if l]
print(next(m["text"] for m in run("40 + 2") if m["type"] == "result"))
png = run("import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()")
print("image/png" if any(m["type"] == "result" and m.get("png") for m in png) else png)
PY'
images_promote
