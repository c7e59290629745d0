#!/usr/bin/env bash
# The cgroup v2 lane: run the sandbox suites and a server smoke test inside a Debian 12 guest
# booted with pure cgroup v2 (systemd.unified_cgroup_hierarchy=1), the layout of stock Debian
# 12, Ubuntu 22.04+, Fedora and Kubernetes nodes. This machine itself is hybrid.
#
#   ./scripts/test-v2.sh [pytest args...]     # e.g. -x, -k timeout
#   ./scripts/test-v2.sh --build-only         # only build (or find) the cached guest image
#
# Everything slow is done on the host, natively, once: the guest's root filesystem
# (mmdebstrap, the distribution kernel, crun, runc, python3 and a virtual environment from
# requirements.lock, made with the host's own pip indexes) becomes a disk image cached under
# $SHELLBOX_V2_CACHE (/var/cache/shellbox/v2-guest) keyed by the hash of its recipe: the
# package list, requirements.lock and the build function below. Each run then makes a second
# disk with this checkout and the `minimal` sandbox image (mkfs.ext4 -d, seconds), boots the
# guest on a throwaway snapshot of the first, and runs pytest in it over ssh.
#
# Acceleration: KVM when a probe boot shows it works, else TCG (software emulation, 10-15x
# slower). On this machine /dev/kvm exists but is a nested mode that crashes stock kernels
# ("KVM internal error ... emulation failure", or qemu's own "failed to set MSR"), so the
# probe looks for those, for qemu exiting and for a guest that never answers.
# SHELLBOX_V2_ACCEL=kvm|tcg forces one (no probe); SHELLBOX_V2_TESTS="file ..." runs a subset.
# If neither boots, the script fails: it never skips.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
CACHE_ROOT=${SHELLBOX_V2_CACHE:-/var/cache/shellbox/v2-guest}
MEMORY=${SHELLBOX_V2_MEMORY:-4G}
CPUS=${SHELLBOX_V2_CPUS:-2}
KVM_PROBE_S=${SHELLBOX_V2_KVM_PROBE_S:-90}
BOOT_TIMEOUT_S=${SHELLBOX_V2_BOOT_TIMEOUT_S:-600}

HOST_DEBS=(qemu-system-x86 mmdebstrap e2fsprogs openssh-client)
GUEST_DEBS=(linux-image-cloud-amd64 initramfs-tools systemd-sysv udev openssh-server
  crun runc python3 python3-venv iproute2 nftables util-linux procps
  golang-github-containers-common ca-certificates btrfs-progs)
MIRRORS=("deb http://deb.debian.org/debian bookworm main"
  "deb http://deb.debian.org/debian bookworm-updates main"
  "deb http://deb.debian.org/debian-security bookworm-security main")
# Selected explicitly. Left out, and why: test_default_image.py (the `default` image: minutes of
# emulated build for nothing cgroup-specific), test_image_builder.py (runs mmdebstrap: host
# work, not cgroups), test_output_memory.py (pipes 1 GB through the agent: longer than its
# 120 s timeout under emulation; capture memory is the agent's own, on any layout), and the
# API/egress suites (HTTP and nftables, the same on every layout; tests/api/test_cgroup_smoke.py
# stands for the server), and test_leftovers.py (it times how fast a fork bomb grows past half
# the pids limit: under emulation the bomb may not get there before the next command, so the
# rule has nothing to kill; it passed in one emulated run and not in the next).
TESTS=(
  tests/sandbox/test_smoke.py
  tests/sandbox/test_semantics.py
  tests/sandbox/test_isolation.py
  tests/sandbox/test_sandbox_recovery.py
  tests/sandbox/test_run_dirs.py
  tests/sandbox/test_run_cli.py
  tests/sandbox/test_hostns.py
  tests/sandbox/test_cgroups.py
  tests/sandbox/test_weights.py
  tests/sandbox/test_agent_memory.py
  tests/sandbox/test_uid_ranges.py
  tests/sandbox/test_disk_quota.py
  tests/api/test_cgroup_smoke.py
)
if [ -n "${SHELLBOX_V2_TESTS:-}" ]; then read -ra TESTS <<< "$SHELLBOX_V2_TESTS"; fi  # a subset
GUEST_VENV=/opt/venv
SSH_KEY_NAME=id_ed25519

say() { echo "test-v2: $*" >&2; }
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
# constraints): bound into the chroot, so the guest's venv comes from the same indexes.
pip_paths() {
  python3 -m pip config list 2>/dev/null | sed -E "s/^[^=]+=//; s/^'//; s/'$//" | tr ' ' '\n' \
    | sed -E 's#^file://##' | grep '^/' | while read -r p; do
      [ -e "$p" ] && echo "$p"
    done | sort -u
}

# Builds the guest into $1 (a new directory): base.img, vmlinuz, initrd.img, the ssh key.
build_guest() {
  local out=$1 rootfs=$1/rootfs p
  mkdir -p "$out"
  ssh-keygen -q -t ed25519 -N '' -C shellbox-v2 -f "$out/$SSH_KEY_NAME"
  say "building the guest root filesystem (mmdebstrap)"
  unshare --mount --propagation private -- mmdebstrap --variant=minbase --mode=root \
    --format=directory --include="$(IFS=,; echo "${GUEST_DEBS[*]}")" \
    '--aptopt=APT::Install-Recommends "false"' \
    --customize-hook='echo shellbox-v2 > "$1/etc/hostname"' \
    --customize-hook='echo "/dev/vda / ext4 rw,relatime 0 1" > "$1/etc/fstab"' \
    --customize-hook='printf "[Match]\nName=en* eth*\n[Network]\nDHCP=yes\n" > "$1/etc/systemd/network/20-wired.network"' \
    --customize-hook='chroot "$1" systemctl enable systemd-networkd ssh' \
    --customize-hook='chroot "$1" systemctl mask systemd-networkd-wait-online.service apt-daily.timer apt-daily-upgrade.timer' \
    --customize-hook='echo "UseDNS no" > "$1/etc/ssh/sshd_config.d/shellbox.conf"' \
    bookworm "$rootfs" "${MIRRORS[@]}" > "$out/mmdebstrap.log" 2>&1 \
    || { tail -30 "$out/mmdebstrap.log" >&2; die "mmdebstrap failed (log: $out/mmdebstrap.log)"; }
  install -d -m 700 "$rootfs/root/.ssh"
  install -m 600 "$out/$SSH_KEY_NAME.pub" "$rootfs/root/.ssh/authorized_keys"
  say "building the guest's virtual environment from requirements.lock"
  cp /etc/resolv.conf "$rootfs/etc/resolv.conf"
  for p in /etc/pip.conf /etc/xdg/pip; do
    [ -e "$p" ] && mkdir -p "$rootfs$(dirname "$p")" && cp -a "$p" "$rootfs$p"
  done
  cp requirements.lock "$rootfs/tmp/requirements.lock"
  local binds="mount -t proc proc '$rootfs/proc'; mount --rbind /dev '$rootfs/dev';"
  for p in $(pip_paths); do
    [ -d "$p" ] && binds+=" mkdir -p '$rootfs$p'; mount --bind -o ro '$p' '$rootfs$p';"
    [ -f "$p" ] && binds+=" mkdir -p '$rootfs$(dirname "$p")'; cp '$p' '$rootfs$p';"
  done
  unshare --mount --propagation private -- sh -ec "$binds
    chroot '$rootfs' python3 -m venv $GUEST_VENV
    chroot '$rootfs' $GUEST_VENV/bin/pip install -q --disable-pip-version-check \
      -r /tmp/requirements.lock" > "$out/pip.log" 2>&1 \
    || { tail -30 "$out/pip.log" >&2; die "pip in the guest root failed (log: $out/pip.log)"; }
  rm -f "$rootfs/tmp/requirements.lock"
  cp "$(ls "$rootfs"/boot/vmlinuz-* | sort -V | tail -1)" "$out/vmlinuz"
  cp "$(ls "$rootfs"/boot/initrd.img-* | sort -V | tail -1)" "$out/initrd.img"
  say "making the guest disk (mkfs.ext4 -d)"
  mkfs.ext4 -q -F -L shellbox-v2 -d "$rootfs" "$out/base.img" 6G
  rm -rf "$rootfs"
}

recipe_hash() {
  { printf '%s\n' "${GUEST_DEBS[@]}" "${MIRRORS[@]}" "$GUEST_VENV"; declare -f build_guest
    cat requirements.lock; } | sha256sum | cut -c1-16
}

ensure_guest() {
  local key dir tmp
  key=$(recipe_hash)
  dir=$CACHE_ROOT/$key
  mkdir -p "$CACHE_ROOT"
  exec 9>"$CACHE_ROOT/.lock"
  flock 9  # one build at a time; the others wait and reuse it
  if [ ! -f "$dir/complete" ]; then
    tmp=$CACHE_ROOT/.build-$key-$$
    rm -rf "$tmp"
    local t0=$SECONDS
    build_guest "$tmp"
    date -u +%FT%TZ > "$tmp/complete"
    rm -rf "$dir"
    mv "$tmp" "$dir"
    say "guest image built in $((SECONDS - t0)) s: $dir"
  fi
  touch "$dir/used"
  # Other recipes' images unused for a day are dead weight (~1 GB each); a younger one may be
  # another checkout's, booted right now.
  find "$CACHE_ROOT" -mindepth 2 -maxdepth 2 -name used -mmin +1440 -printf '%h\0' \
    | xargs -0r rm -rf
  flock -u 9
  GUEST=$dir
}

# The per-run disk: this checkout (tracked and untracked-not-ignored files, at the same path
# as here) and the `minimal` sandbox image, which is the one the tests use.
make_work_disk() {
  local stage=$1 image
  # This checkout's recipe of it: an older minimal-* may sit beside it in a shared image dir.
  image=$(.venv/bin/python -c 'import pathlib; from shellbox.sandbox.image import image_for
print(image_for(pathlib.Path(".state/images").resolve(), "minimal").path.parent)')
  [ -n "$image" ] && [ -f "$image/complete" ] || die "no minimal sandbox image under .state/images"
  mkdir -p "$stage/tree/.state/images"
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files -z --cached --others --exclude-standard \
      | tar --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -xf - -C "$stage/tree"
  else  # a plain copy of the sources: everything but the environments and the state
    tar --exclude=./.git --exclude='./.venv*' --exclude=./.state -cf - . | tar -xf - -C "$stage/tree"
  fi
  ln -sfn "$GUEST_VENV" "$stage/tree/.venv"
  # Byte code compiled here, natively: the guest's Python 3.11 takes it (same magic number),
  # and compiling the server's modules under emulation costs tens of seconds per process.
  python3 -m compileall -q "$stage/tree/src" "$stage/tree/tests" "$stage/tree/bench" >/dev/null
  # Hard links when the image is on the same filesystem: no copy of its 350 MB.
  cp -al "$image" "$stage/tree/.state/images/" 2>/dev/null || cp -a "$image" "$stage/tree/.state/images/"
  mkfs.ext4 -q -F -L shellbox-work -d "$stage/tree" "$stage/work.img" 3G
  rm -rf "$stage/tree"
}

SSH_OPTS=()
guest_ssh() { ssh "${SSH_OPTS[@]}" root@127.0.0.1 "$@"; }

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# boot ACCEL TIMEOUT: starts qemu, waits for ssh. 0 when the guest answers; 1 otherwise
# (qemu is stopped again, and the reason is printed).
QEMU_PID=
boot() {
  local accel=$1 timeout=$2 port opts t0=$SECONDS
  port=$(free_port)
  SSH_OPTS=(-i "$GUEST/$SSH_KEY_NAME" -p "$port" -o StrictHostKeyChecking=no
    -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o ConnectTimeout=5
    -o ServerAliveInterval=15 -o ServerAliveCountMax=8 -o BatchMode=yes)
  if [ "$accel" = kvm ]; then opts=(-accel kvm -cpu host); else
    opts=(-accel tcg,thread=multi -cpu max); fi
  : > "$STAGE/console-$accel.log"
  : > "$STAGE/qemu-$accel.log"
  qemu-system-x86_64 "${opts[@]}" -m "$MEMORY" -smp "$CPUS" -display none -monitor none \
    -serial "file:$STAGE/console-$accel.log" -no-reboot \
    -kernel "$GUEST/vmlinuz" -initrd "$GUEST/initrd.img" \
    -append "console=ttyS0 root=/dev/vda rw systemd.unified_cgroup_hierarchy=1 panic=-1" \
    -drive "file=$GUEST/base.img,format=raw,if=virtio,snapshot=on" \
    -drive "file=$STAGE/work.img,format=raw,if=virtio" \
    -nic "user,model=virtio-net-pci,hostfwd=tcp:127.0.0.1:$port-:22" \
    > "$STAGE/qemu-$accel.log" 2>&1 &
  QEMU_PID=$!
  while :; do
    if ! kill -0 "$QEMU_PID" 2>/dev/null; then
      say "$accel: qemu exited: $(tail -3 "$STAGE/qemu-$accel.log" | tr '\n' ' ')"
      QEMU_PID=; return 1
    fi
    if grep -qa "KVM internal error\|emulation failure" "$STAGE/qemu-$accel.log"; then
      say "$accel: $(grep -am1 'KVM internal error\|emulation failure' "$STAGE/qemu-$accel.log")"
      stop_guest; return 1
    fi
    if grep -qa "Kernel panic" "$STAGE/console-$accel.log"; then
      say "$accel: the guest kernel panicked: $(grep -am1 'Kernel panic' "$STAGE/console-$accel.log")"
      stop_guest; return 1
    fi
    if guest_ssh true 2>/dev/null; then
      say "$accel: guest up, ssh answers after $((SECONDS - t0)) s"
      return 0
    fi
    if [ $((SECONDS - t0)) -ge "$timeout" ]; then
      say "$accel: no ssh after ${timeout} s; console ends with: $(tail -3 "$STAGE/console-$accel.log" | tr '\n' ' ')"
      stop_guest; return 1
    fi
    sleep 2
  done
}

stop_guest() {
  if [ -n "$QEMU_PID" ]; then
    kill "$QEMU_PID" 2>/dev/null || true
    wait "$QEMU_PID" 2>/dev/null || true
    QEMU_PID=
  fi
}

cleanup() {
  stop_guest
  [ -n "${STAGE:-}" ] && [ -z "${SHELLBOX_V2_KEEP:-}" ] && rm -rf "$STAGE"
  return 0
}

main() {
  install_host_packages
  ./scripts/setup.sh
  .venv/bin/shellbox image build --profile minimal --state-dir "$REPO/.state"
  ensure_guest
  STAGE=$(mktemp -d /var/tmp/shellbox-v2-run.XXXXXX)
  trap cleanup EXIT
  local t0=$SECONDS
  make_work_disk "$STAGE"
  say "work disk made in $((SECONDS - t0)) s"

  local accel=${SHELLBOX_V2_ACCEL:-}
  if [ -z "$accel" ]; then
    if [ -w /dev/kvm ] && boot kvm "$KVM_PROBE_S"; then accel=kvm
    else
      say "KVM does not boot this guest here: using TCG (software emulation, slow)"
      boot tcg "$BOOT_TIMEOUT_S" || die "the guest boots neither with KVM nor with TCG"
      accel=tcg
    fi
  else
    boot "$accel" "$BOOT_TIMEOUT_S" || die "the guest does not boot with $accel"
  fi

  local site
  site=$(guest_ssh "$GUEST_VENV/bin/python -c 'import site; print(site.getsitepackages()[0])'")
  guest_ssh "set -e; mkdir -p '$REPO'; mount /dev/vdb '$REPO'
    echo '$REPO/src' > '$site/shellbox-checkout.pth'
    printf '#!$GUEST_VENV/bin/python\nimport sys\nfrom shellbox.cli import main\nsys.exit(main())\n' \
      > $GUEST_VENV/bin/shellbox && chmod 755 $GUEST_VENV/bin/shellbox  # what pip install -e makes
    echo \"guest: \$(uname -r), cgroup: \$(stat -fc %T /sys/fs/cgroup), \$(nproc) cpus, accel $accel\"
    test \"\$(stat -fc %T /sys/fs/cgroup)\" = cgroup2fs || { echo 'not pure cgroup v2'; exit 1; }"
  say "running pytest in the guest: ${TESTS[*]}"
  t0=$SECONDS
  local rc=0
  local scale=1
  [ "$accel" = tcg ] && scale=5
  # The guest holds only the minimal image: every Settings and server there picks it.
  guest_ssh "cd '$REPO' && SHELLBOX_RUNTIME__IMAGE_PROFILE=minimal SHELLBOX_EXPECT_CGROUP=v2 \
    SHELLBOX_TEST_TIME_SCALE=$scale .venv/bin/pytest -p no:cacheprovider \
    --durations=15 ${TESTS[*]} $*" || rc=$?
  say "pytest in the guest took $((SECONDS - t0)) s (exit $rc)"
  if [ "$rc" = 0 ] && [ -z "${SHELLBOX_V2_NO_BENCH:-}" ]; then
    say "bench/bench_runtime.py --quick in the guest ($accel)"
    t0=$SECONDS
    guest_ssh "cd '$REPO' && .venv/bin/python bench/bench_runtime.py --quick --profile minimal" \
      || { rc=$?; say "bench_runtime failed in the guest (exit $rc)"; }
    say "bench_runtime in the guest took $((SECONDS - t0)) s"
  fi
  guest_ssh "umount '$REPO'; sync" || true
  return "$rc"
}

if [ "${1:-}" = --build-only ]; then install_host_packages; ensure_guest; say "guest: $GUEST"; exit 0; fi
main "$@"
