#!/usr/bin/env bash
# Cross-builds flashattn for 64-bit Arm (cmake/aarch64-linux-gnu.cmake) and runs the C test
# programs under qemu-user, so the NEON kernels are tested on an x86 machine: every test_*
# program but test_cuda_fake with the default kernels (neon), then `flashattn verify`. With
# FULL=1 also the kernel grids again under FA_CPU_ISA=ref and FA_CPU_ISA=neon (the neon runs
# repeat the default ones with other seeds; ref is portable C that the native tests cover):
# about 2.5x the time, since qemu emulates every float operation (all 20 programs: ~12
# CPU-minutes; the default set: ~40% of that). The script tests (exports, install, the README
# example) build and run host programs and are left to the native `make test`.
#
# Needs (Debian 12): apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user
# Usage: [FULL=1] [JOBS=n] scripts/test-aarch64.sh [build dir, default build-aarch64]
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=${1:-build-aarch64}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
SYSROOT=/usr/aarch64-linux-gnu

missing=()
command -v aarch64-linux-gnu-gcc >/dev/null || missing+=(gcc-aarch64-linux-gnu)
[ -e "$SYSROOT/lib/ld-linux-aarch64.so.1" ] || missing+=(libc6-dev-arm64-cross)
command -v qemu-aarch64 >/dev/null || missing+=(qemu-user)
if [ ${#missing[@]} -gt 0 ]; then
    echo "test-aarch64: missing ${missing[*]} (apt-get install ${missing[*]})" >&2
    exit 1
fi

cmake -S . -B "$BUILD" -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
    -DCMAKE_BUILD_TYPE=Release -DFA_BUILD_TESTS=ON -DFA_CUDA=OFF
cmake --build "$BUILD" --parallel "$JOBS"

run() { qemu-aarch64 -L "$SYSROOT" "$@"; }

# The NEON set must be compiled in and chosen by default, or the runs below test only ref.
info=$(run "$BUILD/flashattn" info)
echo "$info"
if ! grep -q 'in use: neon' <<<"$info"; then
    echo "test-aarch64: the neon kernels are not in use" >&2
    exit 1
fi

start=$(date +%s)
select=(-R '^test_')
# test_cuda_fake checks the core's CUDA plumbing, which has no Arm-specific code: the native
# `make test` runs it (under qemu it would take minutes).
if [ "${FULL:-0}" = 1 ]; then select+=(-E '^test_cuda_fake$'); else select+=(-E '_(ref|neon)$|^test_cuda_fake$'); fi
ctest --test-dir "$BUILD" --output-on-failure --parallel "$JOBS" "${select[@]}"
FA_CPU_ISA=neon run "$BUILD/flashattn" verify
echo "test-aarch64: passed in $(($(date +%s) - start)) s under qemu-aarch64"
