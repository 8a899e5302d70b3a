#!/usr/bin/env bash
# check_paged_layouts.sh BENCH_PAGED_LAYOUTS
#
# Smoke test of bench/paged_layouts.c (a second): a small cache must give its three layouts'
# rows and the four rows of the sums, each contiguous row at a ratio of exactly 1, the line of
# decode's shuffled ratio over the sums', and the check of the outputs (the tool exits 1 when
# they disagree); bad arguments must give exit status 2 and the usage. Timing numbers are not
# checked.
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 path/to/bench_paged_layouts" >&2
    exit 2
fi
bin=$1
fail() { echo "FAIL: $*" >&2; exit 1; }

for dtype in f32 f16 bf16; do
    out=$("$bin" 96 16 "$dtype" 3)
    echo "$out"
    for layout in "contiguous" "paged in order" "paged shuffled"; do
        grep -qE "^  $layout +[0-9.]+ ms +[0-9.]+ GB/s  time / contiguous's [0-9.]+$" <<<"$out" \
            || fail "$dtype: no row for $layout"
    done
    for sum in "sum" "sum\\+asks"; do # regular expressions
        for layout in contiguous shuffled; do
            grep -qE "^  $sum $layout +[0-9.]+ ms +[0-9.]+ GB/s  time / $sum contiguous's [0-9.]+$" \
                <<<"$out" || fail "$dtype: no row for $sum $layout"
        done
        grep -qE "^  $sum contiguous .* 1\.000$" <<<"$out" \
            || fail "$dtype: $sum contiguous's own ratio is not 1"
    done
    grep -qE "^  contiguous .* 1\.000$" <<<"$out" || fail "$dtype: contiguous's own ratio is not 1"
    grep -qE "^  shuffled pages: decode's ratio over the sum's [0-9.]+, over the asking sum's [0-9.]+$" \
        <<<"$out" || fail "$dtype: no line of decode's ratio over the sums'"
    grep -qE "^  check: in order bitwise equal to contiguous; shuffled max \|diff\| " <<<"$out" \
        || fail "$dtype: no line checking the layouts' outputs"
done

for bad in "96 5 f16 3" "96 16 f8 3" "96 16 f16 0" "0 1 f32 3" "96 16 f16"; do
    set +e
    # shellcheck disable=SC2086 # each case is the arguments
    msg=$("$bin" $bad 2>&1)
    rc=$?
    set -e
    [ "$rc" -eq 2 ] || fail "'$bad' gave exit status $rc, expected 2"
    grep -q 'usage:' <<<"$msg" || fail "'$bad': no usage message"
done
echo "bench_paged_layouts smoke test passed"
