#!/usr/bin/env bash
# check_info.sh FLASHATTN — `flashattn info` says which of the library's environment variables
# are set (they change what runs: a bug report pastes this output), that FA_NUM_THREADS sets the
# default context's threads, and refuses an unknown argument with usage and exit status 2.
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 path/to/flashattn" >&2
    exit 2
fi
tool=$1
vars=(FA_NUM_THREADS FA_CPU_ISA FA_SPIN_US FA_CUDA_PLUGIN FA_CUDA_TILE_D128)
status=0
fail() {
    echo "FAIL: $*" >&2
    status=1
}

clean=(env)
for v in "${vars[@]}"; do clean+=(-u "$v"); done

out=$("${clean[@]}" "$tool" info)
echo "$out" | sed 's/^/   /'
grep -qx 'environment:  none of FA_NUM_THREADS, FA_CPU_ISA, FA_SPIN_US, FA_CUDA_PLUGIN, FA_CUDA_TILE_D128 is set' \
    <<<"$out" || fail "info with none of ${vars[*]} set does not say so"

out=$("${clean[@]}" FA_NUM_THREADS=1 FA_CUDA_TILE_D128=128x64 "$tool" info)
echo "$out" | sed 's/^/   /'
grep -qx 'environment:  FA_NUM_THREADS=1' <<<"$out" || fail "FA_NUM_THREADS=1 is not shown first"
grep -qx '              FA_CUDA_TILE_D128=128x64' <<<"$out" || fail "FA_CUDA_TILE_D128 is not shown"
grep -qx 'threads:      1 (default context)' <<<"$out" || fail "FA_NUM_THREADS=1 did not set 1 thread"
if grep -q 'FA_SPIN_US\|none of' <<<"$out"; then fail "an unset variable is shown"; fi

rc=0
err=$("$tool" info --bogus 2>&1 >/dev/null) || rc=$?
[ "$rc" -eq 2 ] || fail "info --bogus exited $rc, expected 2"
grep -q "unknown argument '--bogus'" <<<"$err" || fail "info --bogus does not name the argument"
grep -q '^usage: flashattn info' <<<"$err" || fail "info --bogus prints no usage"

[ "$status" -eq 0 ] && echo "check_info: ok"
exit "$status"
