# Shared by build-base.sh and build-minimal.sh (sourced, not run): the engine check, the
# fingerprint cache, the build lock, and the import that tags only what passed its smoke test.
#
# A caller sets `who` (its name in messages) and `image` (the tag it builds), then calls, in order:
#   images_need_docker
#   images_lock                      # one build of this image at a time on this machine
#   images_up_to_date FINGERPRINT && exit 0
#   ... assemble a root fs ...
#   images_import ROOT FINGERPRINT MESSAGE CHANGES...   # imports as a candidate tag
#   images_smoke EXPECTED SCRIPT                         # runs SCRIPT in the candidate
#   images_promote                     # tags image and the fingerprint tag, drops older builds

images_started=$(date +%s%N)
# Each line says how far into the build it is: a minute-long build should show where it goes.
say() { echo "$who: [+$((($(date +%s%N) - images_started) / 1000000000))s] $*"; }
die() {
  echo "$who: $*" >&2
  exit 1
}

images_need_docker() {
  command -v docker >/dev/null ||
    die "docker CLI not found: run .ci/docker.sh or apt-get install -y docker.io"
  docker info >/dev/null 2>&1 ||
    die "the Docker engine does not answer on /var/run/docker.sock: start it with 'dockerd &' (or .ci/docker.sh)"
}

# Two test processes (or engineers) that find the image missing at once would build it twice and
# race on the tags; the second one waits here, then finds the fingerprint tag and stops.
images_lock() {
  local lock="/tmp/dormice-image-${image//[^A-Za-z0-9._-]/_}.lock"
  exec 9>"$lock"
  if ! flock -n 9; then
    say "another build of $image holds $lock: waiting for it (at most 10 min)"
    flock -w 600 9 || die "gave up after 10 min waiting for $lock: is a build stuck? (fuser $lock)"
  fi
}

# True (and $image retagged) when an image of this exact fingerprint was built and tested before.
images_up_to_date() {
  images_repo="${image%:*}"
  images_fingerprint="$1"
  images_built="$images_repo:build-$images_fingerprint"
  images_candidate="$images_repo:candidate-$images_fingerprint"
  [ "${force:-0}" = 0 ] || return 1
  docker image inspect "$images_built" >/dev/null 2>&1 || return 1
  docker tag "$images_built" "$image"
  say "$image is up to date (tag $images_built exists); nothing rebuilt (--force to rebuild)"
}

# Imports ROOT under the candidate tag; $image is not touched until the smoke test passed.
images_import() {
  local root="$1" message="$2"
  shift 2
  local changes=()
  for change in "$@"; do changes+=(--change "$change"); done
  say "importing into Docker as $images_candidate"
  tar -C "$root" --numeric-owner -c . |
    docker import "${changes[@]}" -m "$message ($images_fingerprint)" - "$images_candidate" >/dev/null
}

# Runs SCRIPT with `/bin/bash -l -c` as the image's user, with no network, and compares what it
# printed with EXPECTED. A failed candidate is removed, so it is never taken as up to date.
images_smoke() {
  local expected="$1" script="$2" out
  say "smoke test: $(printf '%s' "$script" | grep -c .) lines of /bin/bash -l -c as the image's user"
  out=$(docker run --rm --network none "$images_candidate" /bin/bash -l -c "$script" 2>&1) || true
  if [ "$out" != "$expected" ]; then
    docker rmi "$images_candidate" >/dev/null 2>&1 || true
    die "smoke test failed: expected '$expected', got '$out'"
  fi
}

# An older build of this repository that nothing else tags is a build no one will ask for again
# (its fingerprint is of a script that changed): removed, or the engine keeps ~250 MB per edit.
# A container that still uses it, running or stopped, keeps it (rmi refuses without -f).
images_evict() {
  local tag id
  docker image ls "$images_repo" --format '{{.Tag}} {{.ID}}' | while read -r tag id; do
    case "$tag" in build-*) ;; *) continue ;; esac
    [ "$tag" != "build-$images_fingerprint" ] || continue
    [ "$(docker image ls "$images_repo" --format '{{.ID}}' | grep -cx "$id")" = 1 ] || continue
    # Refused (a container, even a stopped one, still uses it): kept, and the build goes on.
    if docker rmi "$images_repo:$tag" >/dev/null 2>&1; then
      say "removed the older build $images_repo:$tag"
    else
      say "kept the older build $images_repo:$tag: a container still uses it"
    fi
  done
  return 0
}

images_promote() {
  docker tag "$images_candidate" "$image"
  docker tag "$images_candidate" "$images_built"
  docker rmi "$images_candidate" >/dev/null
  images_evict
  local size took
  size=$(docker image inspect -f '{{.Size}}' "$image" | awk '{ printf "%.1f MB", $1 / 1e6 }')
  took=$((($(date +%s%N) - images_started) / 1000000))
  say "built $image (also $images_built), $size, in $((took / 1000)).$((took % 1000 / 100)) s"
}
