#!/usr/bin/env bash
# check_ab_builds.sh BENCH_AB_BUILDS LIBFLASHATTN
#
# Smoke test of bench/ab_builds.c (a second): the same library given twice, forward, backward
# and decode, must print one row per build with equal output hashes and a ratio; bad arguments
# must give exit status 2 and a message. Timing numbers are not checked.
set -euo pipefail

if [ $# -ne 2 ]; then
    echo "usage: $0 path/to/bench_ab_builds path/to/libflashattn.so" >&2
    exit 2
fi
bin=$1
lib=$2
fail() { echo "FAIL: $*" >&2; exit 1; }

for pass in fwd bwd decode; do
    for dtype in f32 bf16; do
        out=$("$bin" --pass "$pass" --dtype "$dtype" --seqlen 70 --dim 24 --heads 4 \
              --kv-heads 2 --causal 1 --rounds 3 "$lib" "$lib")
        echo "$out"
        rows=$(grep -c ' ratio ' <<<"$out" || true)
        [ "$rows" -eq 2 ] || fail "$pass $dtype: expected 2 rows, got $rows"
        hashes=$(grep -o 'hash [0-9a-f]*' <<<"$out" | sort -u | wc -l)
        [ "$hashes" -eq 1 ] || fail "$pass $dtype: one library gave two different outputs"
    done
done

for bad in "--dim 0" "--causal 2" "--rounds 0" "--pass sideways" "--seqlen x"; do
    set +e
    # shellcheck disable=SC2086
    msg=$("$bin" $bad "$lib" "$lib" 2>&1)
    rc=$?
    set -e
    [ "$rc" -eq 2 ] || fail "'$bad' gave exit status $rc, expected 2"
    grep -q 'bad option or value' <<<"$msg" || fail "'$bad': no message saying why"
done
set +e
msg=$("$bin" --heads 6 --kv-heads 4 "$lib" "$lib" 2>&1)
rc=$?
set -e
[ "$rc" -eq 2 ] || fail "--kv-heads 4 with --heads 6 gave exit status $rc, expected 2"
grep -q 'does not divide' <<<"$msg" || fail "--kv-heads 4 with --heads 6: no message saying why"
set +e
"$bin" "$lib" >/dev/null 2>&1
rc=$?
set -e
[ "$rc" -eq 2 ] || fail "one library gave exit status $rc, expected 2"
echo "bench_ab_builds smoke test passed"
