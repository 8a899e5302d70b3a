#!/usr/bin/env bash
# scripts/gpu-check.sh — one command for a machine with an NVIDIA GPU: build the CUDA plug-in for
# this GPU, run the GPU tests (C and Python), `flashattn verify` and the GPU benchmark, and print
# short tables. Needs nvcc, cmake, a C compiler and python3 with torch (CUDA) and pytest; no
# network. Run from anywhere:
#
#     scripts/gpu-check.sh                  # logs in build-gpu/logs/
#     OUT=/some/dir scripts/gpu-check.sh    # logs in $OUT (at most 6 files there)
#
# Steps (each timed; the script keeps going after a failing step):
#   gpu            nvidia-smi -L and the compute capability (9.0 -> FA_CUDA_ARCHS=90)
#   configure      cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DFA_CUDA=ON
#                  -DFA_CUDA_ARCHS=<detected>
#   build-plugin   cmake --build build-gpu --target flashattn_cuda (the plug-in alone, timed)
#   build          cmake --build build-gpu (everything else)
#   ctest-cuda     ctest --test-dir build-gpu -R cuda -E emu -j JOBS --output-on-failure (the
#                  GPU tests; the warp emulator's CPU runs of the kernels are left to CI)
#   ctest-sm75     test_cuda and test_cuda_backward again with FA_CUDA_KERNELS=sm75 (the Turing
#                  kernels on this GPU; FA_TEST_LARGE_S=300, 60 s a test, side by side)
#   ctest-simple   the same with FA_CUDA_KERNELS=simple (the fp32 CUDA-core kernels only)
#   verify         build-gpu/flashattn info (a line per GPU: the kernels it runs) and
#                  build-gpu/flashattn verify (CUDA cases included when a GPU is present)
#   pytest-cuda    python3 -m pytest -q python/tests/test_cuda.py (FLASHATTN_REQUIRE_GPU=1: the
#                  GPU tests must run, not skip)
#   bench          python3 bench/gpu_bench.py --time-budget 240 --json .. --md .. (first the
#                  run's ceilings: fa_cuda_peak's mma.sync and ex2 rates, built next to the
#                  library, and a cuBLAS matmul; at D = 128 it also times the kernel's other
#                  tile (FA_CUDA_TILE_D128=128x32 on sm_90, whose default is 128x64), and
#                  prints a "D = 128 tiles" table after the main one)
#   bench-bwd      python3 bench/gpu_bench_bwd.py --time-budget .. --json ..: forward + backward
#                  (bf16, S = 1024..4096, D = 64 and 128, causal and not) against torch SDPA's
#                  flash and cuDNN backends, gradients checked and flashattn's bitwise
#                  deterministic over two steps
#   bench-decode   python3 bench/gpu_bench_decode.py --time-budget .. --json ..: the KV-cache
#                  decode (one token, H = 32, Hk = 8, D = 128, bf16, B = 1..64, caches of 1k..128k,
#                  contiguous and paged by 16 and 256) in GB/s of cache read against a copy
#                  probe's bandwidth and torch SDPA on the same cache
#
# Files in the log folder: gpu-check.log (every step's full output), gpu-bench.json,
# gpu-bench.md, gpu-bench-bwd.json, gpu-bench-decode.json, summary.txt (the tables printed last). Exit status: 0 when
# every step passed.
#
# Environment: BUILD (default build-gpu), PYTHON (python3), JOBS (nproc), CUDA_ARCHS (skip the
# detection), BENCH_BUDGET (240 s), BWD_BUDGET (120 s) and DECODE_BUDGET (90 s), TOTAL_BUDGET
# (450 s: the benchmarks' budgets shrink so that the whole script stays within it — half of what
# is left to the forward, never below 60 s, half of the rest to forward + backward, never below
# 45 s, the rest to the decode, never below 40 s). The two kernel reruns (ctest-sm75,
# ctest-simple) take at most 75 s each, and what they take comes out of the benchmarks' share.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD=${BUILD:-build-gpu}
PYTHON=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 4)}
BENCH_BUDGET=${BENCH_BUDGET:-240}
BWD_BUDGET=${BWD_BUDGET:-120}
DECODE_BUDGET=${DECODE_BUDGET:-90}
TOTAL_BUDGET=${TOTAL_BUDGET:-450}
export PYTHONUNBUFFERED=1
case $BUILD in
    /*) LIBFA=$BUILD/libflashattn.so ;;
    *) LIBFA=$PWD/$BUILD/libflashattn.so ;;
esac

if [[ -n "${OUT:-}" ]]; then LOGDIR=$OUT; else LOGDIR=$BUILD/logs; fi
mkdir -p "$LOGDIR"
LOGDIR=$(cd "$LOGDIR" && pwd)
LOG=$LOGDIR/gpu-check.log
SUMMARY=$LOGDIR/summary.txt
TMP=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
: >"$LOG"

T_START=$(date +%s%N)
STEP_NAMES=()
STEP_STATUS=()
STEP_SECS=()
ARCH=${CUDA_ARCHS:-}

elapsed_s() { # seconds since $1 (date +%s%N), one decimal
    local ns=$(($(date +%s%N) - $1))
    printf '%d.%d' $((ns / 1000000000)) $(((ns / 100000000) % 10))
}

# run_step NAME TIMEOUT_S TAIL_LINES COMMAND: runs COMMAND (a bash string) with a time limit,
# appends its output to $LOG and shows the last lines (more on failure).
run_step() {
    local name=$1 limit=$2 tail_ok=$3 cmd=$4
    local out=$TMP/$name.log rc=0 t0 secs status
    printf '==> %-13s %s\n' "$name" "$cmd"
    t0=$(date +%s%N)
    timeout --kill-after=15 "$limit" bash -o pipefail -c "$cmd" >"$out" 2>&1 || rc=$?
    secs=$(elapsed_s "$t0")
    if [[ $rc -eq 0 ]]; then
        status=PASS
    elif [[ $rc -eq 124 || $rc -eq 137 ]]; then
        status=FAIL
        echo "*** $name: stopped after its time limit of ${limit} s ***" >>"$out"
    else
        status=FAIL
    fi
    {
        echo "===== $name: $cmd"
        cat "$out"
        echo "----- $name: $status (exit $rc) in $secs s"
        echo
    } >>"$LOG"
    if [[ $status == PASS ]]; then
        [[ $tail_ok -gt 0 ]] && tail -n "$tail_ok" "$out" | sed 's/^/    /'
        printf '    PASS (%s s)\n' "$secs"
    else
        tail -n 40 "$out" | sed 's/^/    /'
        printf '    FAIL (exit %d, %s s; full log: %s)\n' "$rc" "$secs" "$LOG"
    fi
    STEP_NAMES+=("$name")
    STEP_STATUS+=("$status")
    STEP_SECS+=("$secs")
    [[ $status == PASS ]]
}

summary() {
    {
        echo
        echo "gpu-check summary ($(date -u '+%Y-%m-%d %H:%M UTC'), $(elapsed_s "$T_START") s" \
            "in all; logs: $LOGDIR)"
        printf '%-14s %-6s %8s\n' step status seconds
        printf '%-14s %-6s %8s\n' -------------- ------ --------
        local i
        for i in "${!STEP_NAMES[@]}"; do
            printf '%-14s %-6s %8s\n' "${STEP_NAMES[$i]}" "${STEP_STATUS[$i]}" "${STEP_SECS[$i]}"
        done
        local f
        for f in "$TMP/bench.stdout" "$TMP/bench-bwd.stdout" "$TMP/bench-decode.stdout"; do
            if [[ -s $f ]]; then
                echo
                sed '/./,$!d' "$f" # without the leading blank lines
            fi
        done
    } >"$SUMMARY"
    cat "$SUMMARY"
}

# shellcheck disable=SC2317  # called by the trap
interrupted() {
    echo "*** gpu-check: interrupted ***" | tee -a "$LOG"
    summary
    exit 130
}
trap interrupted INT TERM

echo "gpu-check: $(pwd), build folder $BUILD, logs in $LOGDIR, $JOBS jobs"

# 1. The GPU and its compute capability -------------------------------------------------------
# shellcheck disable=SC2317  # run by run_step through bash -c (export -f)
detect_arch() {
    nvidia-smi -L
    local caps
    caps=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null || true)
    if ! grep -Eq '^[0-9]+\.[0-9]+' <<<"$caps"; then
        echo "nvidia-smi gives no compute_cap; asking torch"
        caps=$("$PYTHON" -c 'import torch
for i in range(torch.cuda.device_count()):
    print("%d.%d" % torch.cuda.get_device_capability(i))')
    fi
    echo "compute capability: $(tr '\n' ' ' <<<"$caps")"
    # 9.0 -> 90; several GPUs -> "80;90"
    tr -d ' .\r' <<<"$caps" | grep -E '^[0-9]+$' | sort -un | paste -sd';' >"$TMP/arch"
    [[ -s $TMP/arch ]]
}
export -f detect_arch
export PYTHON TMP
if [[ -n $ARCH ]]; then
    run_step gpu 60 3 "nvidia-smi -L && echo 'FA_CUDA_ARCHS from CUDA_ARCHS: $ARCH'" || true
elif run_step gpu 60 3 detect_arch; then
    ARCH=$(cat "$TMP/arch")
fi
{
    echo "===== tools"
    command -v nvcc >/dev/null && nvcc --version | tail -n 2
    cmake --version | head -n 1
    "$PYTHON" -c 'import sys, torch
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "available", torch.cuda.is_available())' 2>&1 || true
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true
    echo
} >>"$LOG" 2>&1 || true

# 2. Configure and build ------------------------------------------------------------------------
CONFIGURE="cmake -S . -B $BUILD -DCMAKE_BUILD_TYPE=Release -DFA_CUDA=ON"
# CMake's default generator needs make; GPU images sometimes carry only ninja.
if ! command -v make >/dev/null && command -v ninja >/dev/null && [[ ! -e $BUILD/CMakeCache.txt ]]; then
    CONFIGURE+=" -G Ninja"
fi
[[ -n $ARCH ]] && CONFIGURE+=" -DFA_CUDA_ARCHS='$ARCH'"
if run_step configure 180 0 "$CONFIGURE"; then
    run_step build-plugin 420 0 "cmake --build $BUILD --target flashattn_cuda -j $JOBS" || true
    run_step build 420 0 "cmake --build $BUILD -j $JOBS" || true
fi

# 3. Tests --------------------------------------------------------------------------------------
# On a GPU machine a skipped GPU test (ctest's SKIP_RETURN_CODE 77, verify's "cuda skipped") means
# the plug-in or the GPU was not found: a failure here, not a pass.
# shellcheck disable=SC2317  # run by run_step through bash -c (export -f)
ctest_cuda() {
    local rc=0
    # The emulated ones (test_cuda_emu*) run the kernels on the CPU: CI's business, not worth
    # this machine's minutes. The rest run side by side.
    ctest --test-dir "$BUILD" -R cuda -E emu -j "$JOBS" --output-on-failure --no-tests=error \
        --timeout 240 | tee "$TMP/ctest.out" || rc=$?
    if grep -Eq '\((Skipped|Not Run)\)|Not Run' "$TMP/ctest.out"; then
        echo "*** gpu-check: a CUDA test was skipped or not run: no GPU or no plug-in ***"
        return 1
    fi
    return "$rc"
}
# The forward and backward suites once more on other kernels of this GPU's plug-in
# (FA_CUDA_KERNELS: sm75 or simple), their large cases cut to S = 300 to fit the limit.
# shellcheck disable=SC2317
ctest_kernels() {
    local rc=0
    FA_CUDA_KERNELS=$1 FA_TEST_LARGE_S=300 ctest --test-dir "$BUILD" \
        -R '^test_cuda(_backward)?$' -j 2 --output-on-failure --no-tests=error --timeout 60 |
        tee "$TMP/ctest-$1.out" || rc=$?
    if grep -Eq '\((Skipped|Not Run)\)|Not Run' "$TMP/ctest-$1.out"; then
        echo "*** gpu-check: a CUDA test was skipped or not run: no GPU or no plug-in ***"
        return 1
    fi
    return "$rc"
}
# shellcheck disable=SC2317
verify_cuda() {
    local rc=0
    "$BUILD/flashattn" info | grep '^ *cuda' || true
    "$BUILD/flashattn" verify | tee "$TMP/verify.out" || rc=$?
    if grep -q 'cuda skipped' "$TMP/verify.out"; then
        echo "*** gpu-check: verify skipped the CUDA backend ***"
        return 1
    fi
    return "$rc"
}
export -f ctest_cuda ctest_kernels verify_cuda
export BUILD
run_step ctest-cuda 300 3 ctest_cuda || true
run_step ctest-sm75 75 3 "ctest_kernels sm75" || true
run_step ctest-simple 75 3 "ctest_kernels simple" || true
run_step verify 180 3 verify_cuda || true
run_step pytest-cuda 360 3 "FLASHATTN_LIBRARY='$LIBFA' PYTHONPATH=python \
FLASHATTN_REQUIRE_GPU=1 $PYTHON -m pytest -q -rs -p no:cacheprovider python/tests/test_cuda.py" \
    || true

# 4. Benchmarks ---------------------------------------------------------------------------------
# What is left of TOTAL_BUDGET goes half to the forward, a quarter to forward + backward, the
# rest to the decode.
spent=$(($(date +%s) - T_START / 1000000000))
left=$((TOTAL_BUDGET - spent - 45))
budget=$((left / 2))
((budget > BENCH_BUDGET)) && budget=$BENCH_BUDGET
((budget < 60)) && budget=60
run_step bench $((budget + 120)) 0 "FLASHATTN_LIBRARY='$LIBFA' PYTHONPATH=python \
$PYTHON bench/gpu_bench.py --time-budget $budget --json '$LOGDIR/gpu-bench.json' \
--md '$LOGDIR/gpu-bench.md' 2>&1 >'$TMP/bench.stdout'; rc=\$?; cat '$TMP/bench.stdout'; exit \$rc" \
    || true
spent=$(($(date +%s) - T_START / 1000000000))
budget=$(((TOTAL_BUDGET - spent - 30) / 2))
((budget > BWD_BUDGET)) && budget=$BWD_BUDGET
((budget < 45)) && budget=45
run_step bench-bwd $((budget + 120)) 0 "FLASHATTN_LIBRARY='$LIBFA' PYTHONPATH=python \
$PYTHON bench/gpu_bench_bwd.py --time-budget $budget --json '$LOGDIR/gpu-bench-bwd.json' \
2>&1 >'$TMP/bench-bwd.stdout'; rc=\$?; cat '$TMP/bench-bwd.stdout'; exit \$rc" || true
spent=$(($(date +%s) - T_START / 1000000000))
budget=$((TOTAL_BUDGET - spent - 30))
((budget > DECODE_BUDGET)) && budget=$DECODE_BUDGET
((budget < 40)) && budget=40
run_step bench-decode $((budget + 90)) 0 "FLASHATTN_LIBRARY='$LIBFA' PYTHONPATH=python \
$PYTHON bench/gpu_bench_decode.py --time-budget $budget --json '$LOGDIR/gpu-bench-decode.json' \
2>&1 >'$TMP/bench-decode.stdout'; rc=\$?; cat '$TMP/bench-decode.stdout'; exit \$rc" || true

trap - INT TERM
summary
for s in "${STEP_STATUS[@]}"; do
    [[ $s == PASS ]] || exit 1
done
exit 0
