#!/bin/sh
# test_explain_corpus.sh FLASHATTN SRCDIR — `flashattn explain --json` on every real log of
# tests/tools/explain/corpus/ (index.tsv: file, expected class, language, cut off, platform,
# source thread). Prints each miss (file, expected, got) and the pass rate by class, language,
# cut-off and platform; fails below 95% right.
set -u
FA=$1
DIR=$2/tests/tools/explain/corpus
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT INT TERM

grep -v '^#' "$DIR/index.tsv" | while IFS='	' read -r file want lang cut plat url; do
    got=$("$FA" explain --json "$DIR/$file" 2> /dev/null |
        sed -n 's/^{"class": "\([a-z0-9_]*\)".*/\1/p')
    [ -n "$got" ] || got="(no output)"
    ok=0
    if [ "$got" = "$want" ]; then ok=1; else echo "MISS $file: expected $want, got $got"; fi
    printf '%s\t%s\t%s\t%s\t%s\n' "$ok" "$want" "$lang" "cut=$cut" "$plat" >> "$TMP/results"
done

[ -s "$TMP/results" ] || { echo "FAIL: no corpus logs read"; exit 1; }
# pass rate by each column, then overall
for col in 2 3 4 5; do
    case $col in 2) what=class ;; 3) what=language ;; 4) what=cut-off ;; 5) what=platform ;; esac
    echo "by $what:"
    awk -F'\t' -v c=$col '{ n[$c]++; p[$c] += $1 }
        END { for (k in n)
                  printf "  %-24s %3d/%-3d %5.1f%%\n", k, p[k], n[k], 100 * p[k] / n[k] }' \
        "$TMP/results" | sort
done
awk -F'\t' '{ n++; p += $1 } END {
    printf "corpus: %d/%d right (%.1f%%)\n", p, n, 100 * p / n
    exit (100 * p < 95 * n) }' "$TMP/results"
