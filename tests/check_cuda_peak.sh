#!/usr/bin/env bash
# check_cuda_peak.sh FA_CUDA_PEAK
#
# bench/cuda_peak.cu's fa_cuda_peak (the mma.sync and ex2 ceilings gpu_bench.py quotes), on any
# machine: with a GPU it must exit 0 with one JSON object of positive rates (its kernels check
# their own results); without one (no nvidia-smi -L), exit 2 with a message that says so and
# nothing on stdout, never a crash. Arguments are refused with a usage line and exit 1.
set -uo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 path/to/fa_cuda_peak" >&2
    exit 2
fi
exe=$1
status=0
fail() {
    echo "FAIL: $*"
    status=1
}

errfile=$(mktemp)
trap 'rm -f "$errfile"' EXIT

"$exe" --help >/dev/null 2>"$errfile"
rc=$?
usage=$(cat "$errfile")
echo "== fa_cuda_peak --help: exit $rc: $usage"
if [ $rc -ne 1 ] || ! grep -q '^usage: fa_cuda_peak' <<<"$usage"; then
    fail "an argument must give the usage line and exit 1"
fi

out=$("$exe" 2>"$errfile")
rc=$?
err=$(cat "$errfile")
echo "== fa_cuda_peak: exit $rc"
echo "   stdout: $out"
echo "   stderr: $err"
if nvidia-smi -L >/dev/null 2>&1; then
    [ $rc -eq 0 ] || fail "a GPU is present, so fa_cuda_peak must measure it"
    python3 - "$out" <<'PY' || status=1
import json, sys
d = json.loads(sys.argv[1])
for k in ("mma_bf16_tflops", "ex2_gops", "mma_ms", "ex2_ms", "sms"):
    if not d[k] > 0:
        sys.exit(f"FAIL: {k} = {d[k]} is not positive")
print(f"ok: {d['device']}: mma.sync bf16 {d['mma_bf16_tflops']} TFLOP/s, ex2 {d['ex2_gops']} Gop/s")
PY
else
    [ $rc -eq 2 ] || fail "without a GPU fa_cuda_peak must exit 2 (got $rc)"
    [ -z "$out" ] || fail "without a GPU nothing may go to stdout"
    grep -q '^fa_cuda_peak: no CUDA device' <<<"$err" || fail "the message must say there is no CUDA device"
fi
exit $status
