#!/usr/bin/env bash
# check_info.sh FLASHATTN FAKE_PLUGIN — `flashattn info` says which of the library's environment
# variables are set (they change what runs: a bug report pastes this output), that FA_NUM_THREADS
# sets the default context's threads, gives a line per CUDA device (through FAKE_PLUGIN,
# tests/fake_cuda_plugin.c), and refuses an unknown argument with usage and exit status 2.
set -euo pipefail

if [ $# -ne 2 ]; then
    echo "usage: $0 path/to/flashattn path/to/fake_cuda_plugin.so" >&2
    exit 2
fi
tool=$1
fake=$2
vars=(FA_NUM_THREADS FA_CPU_ISA FA_SPIN_US FA_CUDA_PLUGIN FA_CUDA_TILE_D128 FA_CUDA_KERNELS)
status=0
fail() {
    echo "FAIL: $*" >&2
    status=1
}

clean=(env)
for v in "${vars[@]}"; do clean+=(-u "$v"); done

out=$("${clean[@]}" "$tool" info)
echo "$out" | sed 's/^/   /'
grep -qx 'environment:  none of FA_NUM_THREADS, FA_CPU_ISA, FA_SPIN_US, FA_CUDA_PLUGIN, FA_CUDA_TILE_D128, FA_CUDA_KERNELS is set' \
    <<<"$out" || fail "info with none of ${vars[*]} set does not say so"

# With a plug-in: the device count, then one line per device (fa_device_describe); FA_CUDA_KERNELS
# is shown. Without one (a path that does not exist): why, and no device lines.
out=$("${clean[@]}" FA_CUDA_PLUGIN="$fake" FA_CUDA_KERNELS=sm75 "$tool" info)
echo "$out" | sed 's/^/   /'
grep -q '^              cuda: available, 1 device ' <<<"$out" || fail "the fake plug-in's device is not counted"
grep -A1 '^              cuda: available, 1 device ' <<<"$out" |
    grep -qx '              cuda:0: fake device (host memory)' || fail "no line for cuda:0 after the count"
grep -qx '              FA_CUDA_KERNELS=sm75' <<<"$out" || fail "FA_CUDA_KERNELS is not shown"
out=$("${clean[@]}" FA_CUDA_PLUGIN=/nonexistent/libflashattn_cuda.so "$tool" info)
grep -q '^              cuda: unavailable: .*/nonexistent/libflashattn_cuda.so' <<<"$out" ||
    fail "a missing plug-in is not reported with its path"
if grep -q '^              cuda:[0-9]' <<<"$out"; then fail "a device line without a plug-in"; fi

out=$("${clean[@]}" FA_NUM_THREADS=1 FA_CUDA_TILE_D128=128x64 "$tool" info)
echo "$out" | sed 's/^/   /'
grep -qx 'environment:  FA_NUM_THREADS=1' <<<"$out" || fail "FA_NUM_THREADS=1 is not shown first"
grep -qx '              FA_CUDA_TILE_D128=128x64' <<<"$out" || fail "FA_CUDA_TILE_D128 is not shown"
grep -qx 'threads:      1 (default context)' <<<"$out" || fail "FA_NUM_THREADS=1 did not set 1 thread"
if grep -q 'FA_SPIN_US\|none of' <<<"$out"; then fail "an unset variable is shown"; fi

# An FA_CPU_ISA the library cannot follow is named, with the valid sets, once on stderr and in
# info's output; a valid one is not. A malformed FA_NUM_THREADS is shown, not taken for 1 thread.
err=$("${clean[@]}" FA_CPU_ISA=bogus "$tool" info 2>&1 >/dev/null)
out=$("${clean[@]}" FA_CPU_ISA=bogus "$tool" info 2>/dev/null)
echo "$err" | sed 's/^/   /'
[ "$(grep -c 'FA_CPU_ISA=bogus ignored: not a kernel set; valid: ref ' <<<"$err")" -eq 1 ] ||
    fail "FA_CPU_ISA=bogus: no single warning on stderr naming it and the valid sets"
grep -q '^warning:      FA_CPU_ISA=bogus ignored: not a kernel set; valid: ref ' <<<"$out" ||
    fail "FA_CPU_ISA=bogus: info shows no warning"
grep -q 'in use: [a-z0-9]* (FA_CPU_ISA=bogus ignored' <<<"$out" ||
    fail "FA_CPU_ISA=bogus: the build line does not say it was ignored"
err=$("${clean[@]}" FA_CPU_ISA=ref "$tool" info 2>&1 >/dev/null)
[ -z "$err" ] || fail "FA_CPU_ISA=ref: unexpected stderr: $err"
# refbf16 (ref with portable bf16 products) is in every build and runs on every CPU, but only when
# FA_CPU_ISA names it.
err=$("${clean[@]}" FA_CPU_ISA=refbf16 "$tool" info 2>&1 >/dev/null)
out=$("${clean[@]}" FA_CPU_ISA=refbf16 "$tool" info 2>/dev/null)
[ -z "$err" ] || fail "FA_CPU_ISA=refbf16: unexpected stderr: $err"
grep -q 'cpu kernels: ref refbf16[ ;]' <<<"$out" || fail "refbf16 is not listed after ref"
grep -q 'in use: refbf16 (forced by FA_CPU_ISA)' <<<"$out" || fail "FA_CPU_ISA=refbf16 not followed"
if "${clean[@]}" "$tool" info | grep -q 'in use: refbf16'; then
    fail "refbf16 chosen without FA_CPU_ISA"
fi
out=$("${clean[@]}" FA_NUM_THREADS=abc "$tool" info)
grep -qx 'threads:      unavailable: FA_NUM_THREADS is "abc"; expected an integer in 1..1024' \
    <<<"$out" || fail "FA_NUM_THREADS=abc: info does not show the error"

rc=0
err=$("$tool" info --bogus 2>&1 >/dev/null) || rc=$?
[ "$rc" -eq 2 ] || fail "info --bogus exited $rc, expected 2"
grep -q "unknown argument '--bogus'" <<<"$err" || fail "info --bogus does not name the argument"
grep -q '^usage: flashattn info' <<<"$err" || fail "info --bogus prints no usage"

[ "$status" -eq 0 ] && echo "check_info: ok"
exit "$status"
