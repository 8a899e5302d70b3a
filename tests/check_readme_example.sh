#!/usr/bin/env bash
# check_readme_example.sh SOURCE_DIR LIB_DIR CC
#
# Extracts the ```c block that follows the line `<!-- example: minimal.c -->` in README.md,
# compiles it against include/ and libflashattn in LIB_DIR, runs it and expects exit status 0.
# Extra compiler flags (the sanitizer build's) come from FA_SANITIZE_FLAGS.
set -euo pipefail

if [ $# -ne 3 ]; then
    echo "usage: $0 SOURCE_DIR LIB_DIR CC" >&2
    exit 2
fi
src=$1
libdir=$2
cc=$3
readme=$src/README.md
marker='<!-- example: minimal.c -->'

[ -f "$readme" ] || { echo "FAIL: $readme does not exist"; exit 1; }
grep -qF -- "$marker" "$readme" || { echo "FAIL: README.md has no line '$marker'"; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/fa-readme.XXXXXX")
trap 'rm -rf "$work"' EXIT

# After the marker (blank lines allowed), a ```c fence opens; take everything up to the next ```.
awk -v marker="$marker" '
    state == 0 && index($0, marker) { state = 1; next }
    state == 1 && /^[ \t]*$/        { next }
    state == 1 && /^```c[ \t]*$/     { state = 2; next }
    state == 1                      { exit 3 }
    state == 2 && /^```/            { state = 3; exit 0 }
    state == 2                      { print }
    END { if (state != 3) exit 3 }
' "$readme" >"$work/minimal.c" || {
    echo "FAIL: README.md: the marker '$marker' must be followed by a complete \`\`\`c ... \`\`\` block"
    exit 1
}
echo "== extracted $(wc -l <"$work/minimal.c") lines of C from README.md"

# shellcheck disable=SC2086  # FA_SANITIZE_FLAGS is a list of flags
"$cc" -std=c11 -Wall -Wextra -Werror ${FA_SANITIZE_FLAGS:-} -I"$src/include" \
    "$work/minimal.c" -o "$work/minimal" -L"$libdir" -lflashattn -lm -Wl,-rpath,"$libdir" || {
    echo "FAIL: the README example does not compile or link"
    exit 1
}
echo "== running it"
"$work/minimal" || { rc=$?; echo "FAIL: the README example exited with status $rc"; exit 1; }
echo "OK: the README example compiles, links and exits 0"
