#!/usr/bin/env bash
# Sets up a Debian 12 machine for pathprof, as root: system packages, a virtualenv with pathprof installed,
# the BPF probes built. Idempotent and quick on a second call (it only does what is missing).
#   setup.sh         what a run on the host paths needs (the demo: docker-dnat), nothing more
#   setup.sh --all   everything the test suite needs too: the poolers, qemu and the cached guest image,
#                    bpftrace, chromium and prometheus for the report/metrics tests, the test extras
set -euo pipefail
cd "$(dirname "$0")/.."

all=0
case "${1:-}" in
    --all) all=1 ;;
    "") ;;
    -h|--help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup.sh: unknown option '$1' (use --all, or nothing)" >&2; exit 2 ;;
esac

if [ "$(id -u)" -ne 0 ]; then
    echo "setup.sh: run as root (it installs packages and pathprof needs root to run)" >&2
    exit 2
fi

PKGS=(postgresql-15 postgresql-contrib docker.io iptables nftables conntrack iproute2
      clang llvm libbpf-dev libbpf1 bpftool make python3 python3-venv procps util-linux kmod)
if [ $all = 1 ]; then
    PKGS+=(pgbouncer pgpool2 bpftrace debootstrap qemu-system-x86 qemu-utils e2fsprogs chromium prometheus)
fi
# what to undo on any exit: the policy file made below, a probes' build still running when the install failed
created_policy=0 probes_pid=
trap '[ $created_policy = 1 ] && rm -f /usr/sbin/policy-rc.d; [ -n "$probes_pid" ] && kill "$probes_pid" 2>/dev/null; true' EXIT
missing=()
for p in "${PKGS[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup.sh: installing ${missing[*]}" >&2
    # Packages such as pgbouncer and pgpool2 start their services on install; pathprof runs its own copies
    # inside namespaces, so keep the packaged ones stopped.
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && created_policy=1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >&2
    apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
fi

# tracefs is where tracepoints live; some machines do not mount it.
if ! mountpoint -q /sys/kernel/tracing 2>/dev/null; then
    mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
fi

# The probes' build (clang, CPU-bound) and pathprof's install into the venv (downloads, unpacking) need nothing of
# each other: they run side by side, the build on every CPU. A failure in either fails the set-up, with its output.
if [ -f probes/Makefile ]; then
    make -s -j"$(nproc)" -C probes >&2 &
    probes_pid=$!
fi
if [ ! -x .venv/bin/python ]; then
    /usr/bin/python3 -m venv .venv
fi
stamp=.venv/.pathprof-installed
want=$(cat setup.cfg pyproject.toml | sha256sum | cut -d' ' -f1)
have=$(cat "$stamp" 2>/dev/null || true)
# The stamp is "<hash> <what>": the test extras once installed serve a plain set-up too.
if [ "$have" != "$want test" ] && { [ $all = 1 ] || [ "$have" != "$want core" ]; }; then
    echo "setup.sh: installing pathprof into .venv" >&2
    # --no-compile: the byte code of the ~20,000 files of pandas, matplotlib, pyarrow is written when a module is
    # first imported, for the few a run imports, not all of them now
    if [ $all = 1 ]; then
        .venv/bin/pip install -q --no-compile --disable-pip-version-check -e '.[test]' >&2
        echo "$want test" > "$stamp"
    else
        .venv/bin/pip install -q --no-compile --disable-pip-version-check -e . >&2
        echo "$want core" > "$stamp"
    fi
fi
if [ -n "$probes_pid" ] && ! wait "$probes_pid"; then
    probes_pid=
    echo "setup.sh: building the BPF probes failed (make -C probes, above)" >&2
    exit 1
fi
probes_pid=

# The kvm-tap guest image (Debian 12 + PostgreSQL on a qemu disk; a minute or two to build, then cached under
# /var/cache/pathprof/guest): the suite's set-up builds it once per machine; a plain set-up leaves it to the
# first guest path asked for, which builds it with its progress. A failed build is not fatal here.
if [ $all = 1 ] && [ -x .venv/bin/python ]; then
    .venv/bin/python -c 'from pathprof.topologies.guest import GuestImage; GuestImage().ensure()' >&2 \
        || echo "setup.sh: the guest image was not built (see above); the kvm-tap path builds it on first use" >&2
    # The same image grown with a Python userland and Debian 12's kernel and modules: pathprof itself runs inside it on
    # that kernel (tests/integration/test_kernel_guest.py, bench/kernels); cached under /var/cache/pathprof/kernel-guest
    .venv/bin/python -c 'from pathprof.topologies.guest.kernel_guest import KernelGuest; KernelGuest().ensure()' >&2 \
        || echo "setup.sh: the kernel guest image was not built (see above); its test builds it on first use" >&2
fi
