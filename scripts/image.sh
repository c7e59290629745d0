#!/usr/bin/env bash
# Builds the one OCI image both roles run (`shellbox node` and `shellbox serve --role api`),
# without any registry, and loads it into this host's podman as
# localhost/shellbox:<version> (what deploy/kubernetes/ names) and localhost/shellbox:<key>.
#
#   ./scripts/image.sh              # build, or find the cached one; prints the image's name
#   ./scripts/image.sh --name       # print the name the inputs give, build nothing
#   ./scripts/image.sh --save FILE  # then `podman save` it to FILE (an image archive to load
#                                   # into a cluster's container runtime: deploy/kubernetes/)
#
# Two steps, each cached by the hash of its own inputs under $SHELLBOX_OCI_CACHE
# (/var/cache/shellbox/oci-image), as test-v2.sh caches its guest:
#   1. the base: an mmdebstrap root filesystem (Debian bookworm, from deb.debian.org, the
#      mirror /etc/apt/sources.list.d names) with what a node runs beside Python (crun,
#      runc, btrfs-progs, nftables, iproute2, mmdebstrap for `shellbox image build`...), the
#      server's virtual environment at /opt/shellbox/.venv (pyproject.toml's dependencies at
#      the versions requirements.lock pins; not the test tools it pins too) and the
#      egress proxy's from requirements-egress.lock at /opt/shellbox/.venv-egress (the
#      server finds it beside its own). Keyed by the package list, the mirrors, both lock
#      files and the function that builds it: the slow step, redone only when they change.
#   2. the image: a copy of the base with the project's wheel (built from this checkout)
#      installed into the venv, piped as a tar into `podman import`. Keyed by the base's key
#      and the wheel's inputs (src/, pyproject.toml, README.md): a source change costs this
#      step only. `podman image exists` is its cache.
# The sandbox images (`shellbox image build`) are not in it: a node builds them into its state
# directory (deploy/kubernetes/README.md says why).
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE_ROOT=${SHELLBOX_OCI_CACHE:-/var/cache/shellbox/oci-image}
REPO_NAME=localhost/shellbox
PREFIX=/opt/shellbox

HOST_DEBS=(mmdebstrap podman)
IMAGE_DEBS=(python3 python3-venv crun runc btrfs-progs mmdebstrap nftables iproute2 util-linux
  mount procps golang-github-containers-common ca-certificates)
MIRRORS=("deb http://deb.debian.org/debian bookworm main"
  "deb http://deb.debian.org/debian bookworm-updates main"
  "deb http://deb.debian.org/debian-security bookworm-security main")
# What a container needs no copy of (as the sandbox images leave out: sandbox/image.py).
EXCLUDES=("path-exclude=/usr/share/man/*" "path-exclude=/usr/share/info/*"
  "path-exclude=/usr/share/locale/*" "path-include=/usr/share/locale/locale.alias"
  "path-exclude=/usr/share/doc/*" "path-include=/usr/share/doc/*/copyright")

say() { echo "image: $*" >&2; }
die() { say "FAILED: $*"; exit 1; }

install_host_packages() {
  local missing=() pkg
  for pkg in "${HOST_DEBS[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    say "installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

# Absolute paths the host's pip configuration points at (find-links, file:// indexes,
# constraints): bound into the chroot, so its venvs come from the same indexes (as
# test-v2.sh does for its guest).
pip_paths() {
  python3 -m pip config list 2>/dev/null | sed -E "s/^[^=]+=//; s/^'//; s/'$//" | tr ' ' '\n' \
    | sed -E 's#^file://##' | grep '^/' | while read -r p; do
      [ -e "$p" ] && echo "$p"
    done | sort -u
}

# Runs a shell script with the host's pip configuration, /proc and /dev in the chroot $1, in
# a private mount namespace (the mounts die with it, whatever happens).
in_chroot() {
  local rootfs=$1 script=$2 binds p
  binds="mount -t proc proc '$rootfs/proc'; mount --rbind /dev '$rootfs/dev';"
  for p in $(pip_paths); do
    [ -d "$p" ] && binds+=" mkdir -p '$rootfs$p'; mount --bind -o ro '$p' '$rootfs$p';"
    [ -f "$p" ] && binds+=" mkdir -p '$rootfs$(dirname "$p")'; cp '$p' '$rootfs$p';"
  done
  unshare --mount --propagation private -- sh -ec "$binds chroot '$rootfs' sh -ec '$script'"
}

# The host's pip files copied in for the build, and taken out again afterwards: they name
# paths of this machine that the image does not have.
PIP_FILES=(/etc/pip.conf /etc/xdg/pip)
add_pip_config() {
  local rootfs=$1 p
  cp /etc/resolv.conf "$rootfs/etc/resolv.conf"
  for p in "${PIP_FILES[@]}"; do
    [ -e "$p" ] && mkdir -p "$rootfs$(dirname "$p")" && cp -a "$p" "$rootfs$p"
  done
  return 0
}
remove_pip_config() {
  local rootfs=$1 p
  for p in "${PIP_FILES[@]}" $(pip_paths); do rm -rf "${rootfs:?}$p"; done
  : > "$rootfs/etc/resolv.conf"  # the container runtime mounts its own
}

# Builds the base root filesystem into $1 (a new directory): $1/rootfs.
build_base() {
  local out=$1 rootfs=$1/rootfs
  mkdir -p "$out"
  say "building the base root filesystem (mmdebstrap)"
  unshare --mount --propagation private -- mmdebstrap --variant=minbase --mode=root \
    --format=directory --include="$(IFS=,; echo "${IMAGE_DEBS[*]}")" \
    '--aptopt=APT::Install-Recommends "false"' \
    "${EXCLUDES[@]/#/--dpkgopt=}" \
    '--setup-hook=mkdir -p "$1/usr/share/man/man1"' \
    bookworm "$rootfs" "${MIRRORS[@]}" > "$out/mmdebstrap.log" 2>&1 \
    || { tail -30 "$out/mmdebstrap.log" >&2; die "mmdebstrap failed (log: $out/mmdebstrap.log)"; }
  say "building the virtual environments: the server's dependencies pinned by requirements.lock, the proxy's by requirements-egress.lock"
  add_pip_config "$rootfs"
  mkdir -p "$rootfs$PREFIX"
  cp requirements.lock requirements-egress.lock "$rootfs/tmp/"
  runtime_requirements > "$rootfs/tmp/requirements.txt"
  in_chroot "$rootfs" "
    python3 -m venv $PREFIX/.venv
    $PREFIX/.venv/bin/pip install -q --disable-pip-version-check --no-compile \
      -r /tmp/requirements.txt -c /tmp/requirements.lock
    python3 -m venv $PREFIX/.venv-egress
    $PREFIX/.venv-egress/bin/pip install -q --disable-pip-version-check --no-compile \
      -r /tmp/requirements-egress.lock" > "$out/pip.log" 2>&1 \
    || { tail -30 "$out/pip.log" >&2; die "pip in the image's root failed (log: $out/pip.log)"; }
  rm -f "$rootfs"/tmp/requirements*
  rm -rf "$rootfs/root/.cache"
  remove_pip_config "$rootfs"
}

# The project's own dependencies (pyproject.toml's, not the test and lint tools that
# requirements.lock pins too), installed with the lock as constraints: the versions CI tests.
runtime_requirements() {
  python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))'
}

base_key() {
  { printf '%s\n' "${IMAGE_DEBS[@]}" "${MIRRORS[@]}" "${EXCLUDES[@]}" "$PREFIX"
    declare -f build_base in_chroot add_pip_config remove_pip_config
    runtime_requirements; cat requirements.lock requirements-egress.lock; } | sha256sum | cut -c1-16
}

# What the project's wheel is made of (tracked or not, but never byte code).
source_files() {
  find src pyproject.toml README.md -type f ! -name '*.pyc' ! -path '*/__pycache__/*' \
    ! -path '*.egg-info/*' -print0 | LC_ALL=C sort -z
}

image_key() {
  { base_key; source_files | xargs -0 sha256sum; declare -f make_image; } \
    | sha256sum | cut -c1-16
}

version() {
  python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])'
}

ensure_base() {
  local key dir tmp t0
  key=$(base_key)
  dir=$CACHE_ROOT/base-$key
  mkdir -p "$CACHE_ROOT"
  if [ ! -f "$dir/complete" ]; then
    tmp=$CACHE_ROOT/.build-base-$key-$$
    rm -rf "$tmp"
    t0=$SECONDS
    build_base "$tmp"
    date -u +%FT%TZ > "$tmp/complete"
    rm -rf "$dir"
    mv "$tmp" "$dir"
    say "base built in $((SECONDS - t0)) s: $dir"
  fi
  touch "$dir/used"
  # Other recipes' bases unused for a day are dead weight (~0.5 GB each).
  find "$CACHE_ROOT" -mindepth 2 -maxdepth 2 -name used -mmin +1440 -printf '%h\0' \
    | xargs -0r rm -rf
  BASE=$dir
}

# The image: the base plus this checkout's wheel, imported into podman as $1.
make_image() {
  local name=$1 stage
  stage=$(mktemp -d /var/tmp/shellbox-image.XXXXXX)
  # shellcheck disable=SC2064  # the stage's path is known now
  trap "rm -rf '$stage'" EXIT
  say "building the project's wheel"
  python3 -m pip wheel -q --disable-pip-version-check --no-deps \
    -w "$stage/wheel" . > "$stage/wheel.log" 2>&1 \
    || { tail -20 "$stage/wheel.log" >&2; die "pip wheel failed"; }
  cp -a --reflink=auto "$BASE/rootfs" "$stage/rootfs"
  cp "$stage"/wheel/*.whl "$stage/rootfs/tmp/"
  in_chroot "$stage/rootfs" "
    $PREFIX/.venv/bin/pip install -q --disable-pip-version-check --no-deps --no-index /tmp/*.whl
    rm -f /tmp/*.whl
    $PREFIX/.venv/bin/python -m compileall -q $PREFIX/.venv/lib >/dev/null" \
    > "$stage/install.log" 2>&1 \
    || { tail -20 "$stage/install.log" >&2; die "installing the wheel failed"; }
  say "importing into podman as $name"
  tar -C "$stage/rootfs" --numeric-owner --xattrs -cf - . \
    | podman import --quiet \
      --change "ENV PATH=$PREFIX/.venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
      --change "ENV LANG=C.UTF-8" \
      --change "ENTRYPOINT [\"$PREFIX/.venv/bin/shellbox\"]" \
      --change "LABEL org.opencontainers.image.title=shellbox" \
      --change "LABEL org.opencontainers.image.version=$(version)" \
      - "$name" >/dev/null
  rm -rf "$stage"
  trap - EXIT
}

main() {
  local save=${1:-} key name t0
  install_host_packages
  key=$(image_key)
  name=$REPO_NAME:$key
  mkdir -p "$CACHE_ROOT"
  exec 9>"$CACHE_ROOT/.lock"
  flock 9  # one build at a time; the others wait and reuse it
  if ! podman image exists "$name"; then
    t0=$SECONDS
    ensure_base
    make_image "$name"
    say "image built in $((SECONDS - t0)) s"
  fi
  podman tag "$name" "$REPO_NAME:$(version)"
  # Other builds' images (~0.7 GB each) a day old or more: a younger one may be another
  # checkout's, in use right now.
  podman images --filter reference="$REPO_NAME" --filter until=24h \
    --format '{{.Repository}}:{{.Tag}}' | grep -E ':[0-9a-f]{16}$' | grep -vx "$name" \
    | xargs -r podman rmi >/dev/null 2>&1 || true
  flock -u 9
  if [ -n "$save" ]; then
    podman save --quiet --format docker-archive -o "$save" "$REPO_NAME:$(version)"
    say "saved to $save"
  fi
  echo "$name"
}

case "${1:-}" in
  --name) echo "$REPO_NAME:$(image_key)" ;;
  --save) [ -n "${2:-}" ] || die "--save needs a file name"; main "$2" ;;
  "") main ;;
  *) die "unknown argument $1 (see the head of this script)" ;;
esac
