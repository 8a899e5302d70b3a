#!/usr/bin/env bash
# check_bench.sh FLASHATTN_BINARY OUTDIR
#
# Smoke test of `flashattn bench` (a few seconds): a tiny grid, forward and backward, fp32 and
# bf16, causal and not, flashattn checked against the naive baseline; --csv, --svg and --json
# outputs are written and look like what they claim to be. Then `flashattn bench-decode` on
# small caches of each dtype and both layouts, every row checked against fp64 by the command
# itself, 8-bit caches (int8, e4m3, e5m2) against bf16, and its accuracy table (--accuracy).
# Timing numbers are not checked.
set -euo pipefail

if [ $# -ne 2 ]; then
    echo "usage: $0 path/to/flashattn outdir" >&2
    exit 2
fi
bin=$1
out=$2
mkdir -p "$out"
rm -f "$out"/bench-smoke.{csv,svg,json,txt}

common=(--seqlens 64,128 --dims 32 --heads 2 --dtypes f32,bf16 --causal 0,1 --pass fwd,bwd
        --runs 1 --seed 1 --probe-ms 20)

"$bin" bench "${common[@]}" --csv "$out/bench-smoke.csv" --svg "$out/bench-smoke.svg" \
    >"$out/bench-smoke.txt"
cat "$out/bench-smoke.txt"

fail() { echo "FAIL: $*" >&2; exit 1; }

grep -q '^peak fp32:' "$out/bench-smoke.txt" || fail "no fp32 peak line"
grep -q '^peak bf16:' "$out/bench-smoke.txt" || fail "no bf16 peak line"
rows=$(grep -cE '^(fwd|bwd) ' "$out/bench-smoke.txt" || true)
[ "$rows" -eq 16 ] || fail "expected 16 table rows, got $rows"
if grep -qE 'MISMATCH|ERROR' "$out/bench-smoke.txt"; then fail "a row disagreed or failed"; fi

# CSV: a header and one line per row, every row checked and ok
[ "$(wc -l <"$out/bench-smoke.csv")" -eq 17 ] || fail "CSV should have 17 lines"
head -1 "$out/bench-smoke.csv" | grep -q '^pass,dtype,' || fail "CSV header"
[ "$(grep -c ',ran,.*,ok,' "$out/bench-smoke.csv")" -eq 16 ] || fail "CSV rows not all ran/ok"

# SVG: a complete document with lines drawn
head -2 "$out/bench-smoke.svg" | grep -q '<svg ' || fail "SVG start"
tail -1 "$out/bench-smoke.svg" | grep -q '</svg>' || fail "SVG end"
grep -q '<polyline' "$out/bench-smoke.svg" || fail "SVG has no lines"

# JSON parses (where Python is available) and has the rows
"$bin" bench --seqlens 64 --dims 16 --heads 1 --dtypes f32 --causal 0 --pass fwd --runs 1 \
    --seed 1 --probe-ms 20 --json --quiet >"$out/bench-smoke.json"
if command -v python3 >/dev/null; then
    python3 - "$out/bench-smoke.json" <<'PY' || fail "JSON"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["peaks"]["fp32"]["gflops"] > 0, d["peaks"]
assert len(d["rows"]) == 1 and d["rows"][0]["status"] == "ok", d["rows"]
PY
else
    grep -q '"rows": \[' "$out/bench-smoke.json" || fail "JSON rows"
fi

# bench-decode: every row present, measured (a probe rate and a share) and checked
for layout in bshd bhsd; do
    "$bin" bench-decode --lens 256,1000 --batches 1,3 --dtypes f32,f16,bf16 --runs 2 \
        --probe-mib 8 --probe-passes 2 --layout "$layout" >"$out/bench-decode-$layout.txt" \
        || fail "bench-decode --layout $layout exited with $?"
    cat "$out/bench-decode-$layout.txt"
    rows=$(grep -cE '^(fp32|fp16|bf16) +[13] +(256|1000) .*%' "$out/bench-decode-$layout.txt" \
           || true)
    [ "$rows" -eq 12 ] || fail "bench-decode --layout $layout: expected 12 rows, got $rows"
    if grep -q 'CHECK FAILED' "$out/bench-decode-$layout.txt"; then
        fail "bench-decode --layout $layout: a row disagreed with fp64"
    fi
    # the probe's three readers: one was the fastest in each of the 12 rows' 2 rounds
    wins=$(sed -n 's/^fastest probe reader over the grid.s rounds: plain sum \([0-9]*\), asking, all levels \([0-9]*\), asking, to L2 \([0-9]*\)$/\1 + \2 + \3/p' \
           "$out/bench-decode-$layout.txt")
    [ -n "$wins" ] && [ $((wins)) -eq 24 ] \
        || fail "bench-decode --layout $layout: the probe readers' wins should add up to 24: '$wins'"
done

# paged caches: pages of 3 tokens (a partly used last page) and of 16, scattered and in order
for paged in 3:shuffled 16:in-order; do
    ps=${paged%%:*} order=${paged#*:}
    "$bin" bench-decode --lens 256,1000 --batches 1,3 --dtypes f32,f16 --runs 2 --probe-mib 8 \
        --probe-passes 2 --page-size "$ps" --page-order "$order" >"$out/bench-decode-paged$ps.txt" \
        || fail "bench-decode --page-size $ps --page-order $order exited with $?"
    cat "$out/bench-decode-paged$ps.txt"
    grep -q "paged: pages of $ps tokens" "$out/bench-decode-paged$ps.txt" \
        || fail "bench-decode --page-size $ps: the header does not say the caches are paged"
    rows=$(grep -cE '^(fp32|fp16) +[13] +(256|1000) .*%' "$out/bench-decode-paged$ps.txt" || true)
    [ "$rows" -eq 8 ] || fail "bench-decode --page-size $ps: expected 8 rows, got $rows"
    if grep -q 'CHECK FAILED' "$out/bench-decode-paged$ps.txt"; then
        fail "bench-decode --page-size $ps: a row disagreed with fp64"
    fi
done

# several query tokens per step (a speculative step: 6 tokens, 24 query rows per KV head), paged
"$bin" bench-decode --lens 256,1000 --batches 1,3 --dtypes f32,f16 --runs 2 --probe-mib 8 \
    --probe-passes 2 --page-size 16 --queries 6 >"$out/bench-decode-q6.txt" \
    || fail "bench-decode --queries 6 exited with $?"
cat "$out/bench-decode-q6.txt"
grep -q '^shape: *Sq=6, ' "$out/bench-decode-q6.txt" || fail "bench-decode --queries 6: no Sq=6"
rows=$(grep -cE '^(fp32|fp16) +[13] +(256|1000) .*%' "$out/bench-decode-q6.txt" || true)
[ "$rows" -eq 8 ] || fail "bench-decode --queries 6: expected 8 rows, got $rows"
if grep -q 'CHECK FAILED' "$out/bench-decode-q6.txt"; then
    fail "bench-decode --queries 6: a row disagreed with fp64"
fi

# the target summary: per dtype, the rows of 16384+ tokens, how many reached 80% of their probe,
# decode's fastest in-LLC row and how many 16k+ rows' 80% of probe lie above it, recomputed here
# from the printed rows (where the OS names no LLC size, no row is in-LLC: "none in the grid")
"$bin" bench-decode --lens 1000,16384 --batches 1,2 --dtypes f16 --runs 2 --probe-mib 8 \
    --probe-passes 2 >"$out/bench-decode-target.txt" || fail "bench-decode (target) exited with $?"
cat "$out/bench-decode-target.txt"
want=$(awk '
    /^fp16 +[12] +(1000|16384) .*%/ {
        gbs = $9 + 0; probe = $10 + 0; pct = $11; sub("%", "", pct); pct += 0
        if ($3 >= 16384) { n++; met += (pct >= 80); pr[n] = probe }
        if ($0 ~ /fits in LLC/ && gbs > best) { best = gbs; at = sprintf("%.1f (%d, %d)", gbs, $2, $3) }
    }
    END {
        if (!best) { print n, met, "none in the grid", "-"; exit }
        for (i = 1; i <= n; i++) above += (pr[i] * 0.8 > best)
        print n, met, at, above + 0
    }' "$out/bench-decode-target.txt")
got=$(sed -n 's/^fp16 \+\([0-9]*\) \+\([0-9]*\) \+[0-9.]*-[0-9.]*% | \+\(.*[^ ]\) \+\([0-9-]*\)$/\1 \2 \3 \4/p' \
      "$out/bench-decode-target.txt")
[ -n "$got" ] && [ "$got" = "$want" ] \
    || fail "bench-decode: the target summary says '$got', its rows say '$want'"

# 8-bit caches, filled by the library's append and checked against fp64 over the dequantized
# cache: contiguous, head-major and paged (pages of 3, scattered), with 2 query tokens. Their
# K+V MiB count the fp32 scales (2*B*L*Hk*(D + 4) bytes), tok/s is B*Sq over the median time and
# x bf16 is there where the bf16 row of the same B and L ran before.
for cfg in "bshd::bf16,i8,e4m3,e5m2:1" "bhsd::i8,bf16:1" "bshd:3:bf16,e4m3,e5m2,i8:2"; do
    IFS=: read -r layout ps dtypes sq <<<"$cfg"
    name=bench-decode-8bit-$layout$ps
    paged=()
    [ -z "$ps" ] || paged=(--page-size "$ps")
    "$bin" bench-decode --lens 256,1000 --batches 1,3 --dtypes "$dtypes" --runs 2 \
        --probe-mib 8 --probe-passes 2 --layout "$layout" "${paged[@]}" --queries "$sq" \
        >"$out/$name.txt" || fail "bench-decode --dtypes $dtypes ($cfg) exited with $?"
    cat "$out/$name.txt"
    grep -q '^8-bit: .*quantized by the library.s append' "$out/$name.txt" \
        || fail "$name: no 8-bit header line"
    grep -q '^bytes: .*8-bit caches: 2\*B\*L\*Hk\*(D + 4)' "$out/$name.txt" \
        || fail "$name: the bytes line does not count the scales"
    n8=$(( $(tr ',' '\n' <<<"$dtypes" | grep -vc bf16) ))
    rows=$(grep -cE '^(bf16|int8|e4m3|e5m2) +[13] +(256|1000) .*%' "$out/$name.txt" || true)
    want=$(( 4 * (n8 + 1) ))
    [ "$rows" -eq "$want" ] || fail "$name: expected $want rows, got $rows"
    if grep -q 'CHECK FAILED' "$out/$name.txt"; then
        fail "$name: a row disagreed with fp64"
    fi
    # per row: the MiB of K+V (with scales), tok/s from the median time, x bf16 where it can be
    bf16_first=$([ "${dtypes%%,*}" = bf16 ] && echo 1 || echo 0)
    bad=$(awk -v sq="$sq" -v first="$bf16_first" '
        /^(bf16|int8|e4m3|e5m2) +[13] +(256|1000) .*%/ {
            es = $1 == "bf16" ? 2 * 128 : 128 + 4
            mib = sprintf("%.1f", 2 * $2 * $3 * 8 * es / 1048576)
            if ($4 != mib) print $1, $2, $3, "MiB", $4, "want", mib
            if ($6 > 0.0005 && ($13 + 1 < $2 * sq * 1000 / ($6 + 0.0005) ||
                                $13 - 1 > $2 * sq * 1000 / ($6 - 0.0005)))
                print $1, $2, $3, "tok/s", $13, "ms", $6
            want = $1 != "bf16" && first ? "x" : "-"
            if (want == "x" ? $14 !~ /^[0-9]+\.[0-9][0-9]x$/ : $14 != "-")
                print $1, $2, $3, "x bf16", $14
        }' "$out/$name.txt")
    [ -z "$bad" ] || fail "$name: rows disagree with themselves: $bad"
done

# the summary against bf16 recomputed from the rows' x bf16 (rows of 16384 tokens or more, how
# many reach 1.70x, their range; then every row)
"$bin" bench-decode --lens 1000,16384 --batches 1 --dtypes bf16,i8 --runs 2 \
    --probe-mib 8 --probe-passes 2 >"$out/bench-decode-8bit-target.txt" \
    || fail "bench-decode (8-bit target) exited with $?"
cat "$out/bench-decode-8bit-target.txt"
want=$(awk '
    /^int8 +1 +(1000|16384) .*%/ {
        x = $14; sub("x", "", x); x += 0; n++
        alo = n == 1 || x < alo ? x : alo; ahi = x > ahi ? x : ahi
        if ($3 >= 16384) {
            big++; met += (x >= 1.7)
            lo = big == 1 || x < lo ? x : lo; hi = x > hi ? x : hi
        }
    }
    END {
        r = big ? sprintf("%.2f-%.2fx", lo, hi) : "-"
        printf "%d %d %s %d %.2f-%.2fx\n", big, met, r, n, alo, ahi
    }' "$out/bench-decode-8bit-target.txt")
got=$(awk '/^against bf16: / { on = 1 }
           on && $1 == "int8" && $5 == "|" { print $2, $3, $4, $6, $7 }' \
      "$out/bench-decode-8bit-target.txt")
[ -n "$got" ] && [ "$got" = "$want" ] \
    || fail "bench-decode: the summary against bf16 says '$got', its rows say '$want'"

# the accuracy table: every row's kernel checked by the command (fp32 q and out against fp64
# over the dequantized cache); the formats' errors ordered as their precision: on normal inputs
# bf16 < int8 < e4m3 < e5m2 (mean e); on outliers int8's per-token scale loses to e4m3's
"$bin" bench-decode --accuracy --lens 64,300 >"$out/bench-decode-accuracy.txt" \
    || fail "bench-decode --accuracy exited with $?"
cat "$out/bench-decode-accuracy.txt"
row='^(bf16|int8|e4m3|e5m2) +(-|per token|per \(B, Hk\)) +(normal|outliers) +(64|300) '
rows=$(grep -cE "$row" "$out/bench-decode-accuracy.txt" || true)
[ "$rows" -eq 20 ] || fail "bench-decode --accuracy: expected 20 rows, got $rows"
if grep -q 'CHECK FAILED' "$out/bench-decode-accuracy.txt"; then
    fail "bench-decode --accuracy: a kernel disagreed with fp64"
fi
grep -q '^target: int8 (per token) on normal inputs, error <= 1% .*L=64 .*; L=300 ' \
    "$out/bench-decode-accuracy.txt" || fail "bench-decode --accuracy: no target line"
bad=$(awk '
    / per token +(normal|outliers) / { m[$1, $4, $5] = $8 }
    /^bf16 / { m["bf16", $3, $4] = $7 }
    END {
        for (L = 64; L <= 300; L += 236) {
            if (!(m["bf16", "normal", L] < m["int8", "normal", L] &&
                  m["int8", "normal", L] < m["e4m3", "normal", L] &&
                  m["e4m3", "normal", L] < m["e5m2", "normal", L]))
                print "normal", L
            if (!(m["e4m3", "outliers", L] < m["int8", "outliers", L]))
                print "outliers", L
        }
    }' "$out/bench-decode-accuracy.txt")
[ -z "$bad" ] || fail "bench-decode --accuracy: errors out of their formats' order at: $bad"

# Bad usage exits with 2
set +e
"$bin" bench --dims x >/dev/null 2>&1
[ $? -eq 2 ] || fail "bad usage should exit with 2"
for bad in "--lens 0" "--dtypes f8" "--layout bsdh" "--runs 256" "--frobnicate" \
           "--page-size 0" "--page-size x" "--page-order random" "--page-order in-order" \
           "--layout bhsd --page-size 16" "--queries 0" "--queries 65" "--dtypes i4" \
           "--dtypes f32,f16,bf16,i8,e4m3,e5m2,i8,e4m3,e5m2" "--accuracy --batches 2" \
           "--accuracy --dtypes i8" "--accuracy --page-size 16" "--lens 64 --accuracy --runs 2"; do
    # shellcheck disable=SC2086 # each case is an option and its value
    "$bin" bench-decode $bad >/dev/null 2>&1
    [ $? -eq 2 ] || fail "bench-decode $bad should exit with 2"
done
msg=$("$bin" bench-decode --page-size 0 2>&1 >/dev/null)
case $msg in
*"bad value for --page-size: 0"*) ;;
*) fail "bench-decode --page-size 0 should name the option and its value, said: $msg" ;;
esac
msg=$("$bin" bench-decode --accuracy --batches=2 2>&1 >/dev/null)
case $msg in
*"--accuracy takes --lens, --queries and --threads; --batches is for the timing grid"*) ;;
*) fail "bench-decode --accuracy --batches=2 should name the option, said: $msg" ;;
esac
echo "PASS: flashattn bench and bench-decode smoke tests"
