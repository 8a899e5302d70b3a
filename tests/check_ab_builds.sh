#!/usr/bin/env bash
# check_ab_builds.sh BENCH_AB_BUILDS LIBFLASHATTN
#
# Smoke test of bench/ab_builds.c (a second): the same library given twice, forward, backward
# and decode (contiguous, paged, several query tokens), must print one row per build with equal output hashes and a ratio; bad arguments
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

# a paged decode: 10 pages of 7 tokens, shuffled
out=$("$bin" --pass decode --dtype f16 --seqlen 70 --dim 24 --heads 4 --kv-heads 2 --rounds 3 \
      --page-size 7 "$lib" "$lib")
echo "$out"
grep -q 'paged: 10 pages of 7 tokens' <<<"$out" || fail "--page-size 7: no line saying the cache is paged"
[ "$(grep -c ' ratio ' <<<"$out" || true)" -eq 2 ] || fail "--page-size 7: expected 2 rows"
[ "$(grep -o 'hash [0-9a-f]*' <<<"$out" | sort -u | wc -l)" -eq 1 ] \
    || fail "--page-size 7: one library gave two different outputs"

# a decode of 5 query tokens (a speculative step) against a cache of 70: q (1, 5, 4, 24)
out=$("$bin" --pass decode --dtype f16 --seqlen 70 --dim 24 --heads 4 --kv-heads 2 --rounds 3 \
      --causal 1 --queries 5 "$lib" "$lib")
echo "$out"
grep -q '^decode f16 Sq=5 S=70 ' <<<"$out" || fail "--queries 5: the header does not say Sq=5"
[ "$(grep -c ' ratio ' <<<"$out" || true)" -eq 2 ] || fail "--queries 5: expected 2 rows"
[ "$(grep -o 'hash [0-9a-f]*' <<<"$out" | sort -u | wc -l)" -eq 1 ] \
    || fail "--queries 5: one library gave two different outputs"

# usage_error PATTERN ARGS...: the two libraries after ARGS must give exit status 2 and a
# message matching PATTERN
usage_error() {
    local want=$1 msg rc
    shift
    set +e
    msg=$("$bin" "$@" "$lib" "$lib" 2>&1)
    rc=$?
    set -e
    [ "$rc" -eq 2 ] || fail "'$*' gave exit status $rc, expected 2"
    grep -q "$want" <<<"$msg" || fail "'$*': no message saying why"
}
usage_error 'must divide' --pass decode --seqlen 70 --page-size 8
usage_error 'must divide' --pass fwd --page-size 7
usage_error 'is for --pass decode' --pass bwd --queries 4
for bad in "--dim 0" "--causal 2" "--rounds 0" "--pass sideways" "--seqlen x" "--page-size 0" \
    "--queries 0" "--queries 1025"; do
    # shellcheck disable=SC2086 # each case is an option and its value
    usage_error 'bad option or value' $bad
done
usage_error 'does not divide' --heads 6 --kv-heads 4
set +e
"$bin" "$lib" >/dev/null 2>&1
rc=$?
set -e
[ "$rc" -eq 2 ] || fail "one library gave exit status $rc, expected 2"
echo "bench_ab_builds smoke test passed"
