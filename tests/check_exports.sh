#!/usr/bin/env bash
# check_exports.sh SHARED_LIB STATIC_LIB
#
# The library's ABI promise (DESIGN.md §1, §4):
#  - every symbol libflashattn.so exports starts with fa_ (-fvisibility=hidden does the rest);
#  - every global symbol defined in libflashattn.a starts with fa_ (internal ones are fa__*);
#  - libflashattn.so needs only libc, libm, libpthread, libdl and the dynamic loader.
# In sanitizer builds (FA_SANITIZE_FLAGS set) the sanitizer runtimes and their symbols are allowed.
set -euo pipefail

if [ $# -ne 2 ]; then
    echo "usage: $0 libflashattn.so libflashattn.a" >&2
    exit 2
fi
so=$1
ar=$2
for tool in nm readelf; do
    command -v "$tool" >/dev/null || { echo "FAIL: '$tool' not found (install binutils)" >&2; exit 1; }
done

# Symbols that are not the library's own API: linker-made markers, sanitizer instrumentation.
ignore='^(_init|_fini|_edata|_end|__bss_start|__x86\.get_pc_thunk\..*)$'
allowed_needed='^(libc|libm|libpthread|libdl)\.so\.[0-9]+$|^ld-linux[-a-z0-9_.]*\.so\.[0-9]+$'
if [ -n "${FA_SANITIZE_FLAGS:-}" ]; then
    ignore='^(_init|_fini|_edata|_end|__bss_start|__x86\.get_pc_thunk\..*|__odr_asan.*|__asan.*|__ubsan.*|__sanitizer.*)$'
    allowed_needed="$allowed_needed"'|^lib(asan|ubsan)\.so\.[0-9]+$'
    echo "(sanitizer build: sanitizer runtimes and symbols allowed)"
fi

status=0
indent() { grep -v '^$' | sed 's/^/   /' || true; }

# 1. Dynamic exports of the shared library. nm prints "ADDRESS TYPE NAME"; type A = absolute
#    (version nodes), not a function or object.
exports=$(nm -D --defined-only "$so" | awk '$2 != "A" { print $3 }' | sed 's/@.*//' | sort -u)
echo "== $so exports $(echo "$exports" | grep -c . || true) symbols:"
echo "$exports" | indent
bad=$(echo "$exports" | grep -v '^$' | grep -Ev "$ignore" | grep -v '^fa_' || true)
if [ -n "$bad" ]; then
    echo "FAIL: $so exports symbols without the fa_ prefix (make them static or hidden):"
    echo "$bad" | indent
    status=1
fi
# Exactly the functions the header declares with FA_API: no internal fa__* leaks, none missing.
header="$(dirname "$0")/../include/flashattn.h"
declared=$(tr '\n' ' ' < "$header" | grep -o 'FA_API[^;(]*(' | grep -o 'fa_[a-z0-9_]*($' | tr -d '(' | sort -u)
exported=$(echo "$exports" | grep '^fa_' | sort -u)
if [ "$declared" != "$exported" ]; then
    echo "FAIL: exported fa_ symbols differ from the FA_API functions of include/flashattn.h:"
    diff <(echo "$declared") <(echo "$exported") | sed -n 's/^</  declared, not exported:/p; s/^>/  exported, not declared:/p'
    status=1
fi

# 2. NEEDED entries of the shared library.
needed=$(readelf -d "$so" | sed -n 's/.*(NEEDED).*\[\(.*\)\].*/\1/p')
echo "== $so NEEDED:"
echo "$needed" | indent
bad=$(echo "$needed" | grep -v '^$' | grep -Ev "$allowed_needed" || true)
if [ -n "$bad" ]; then
    echo "FAIL: $so depends on libraries outside libc/libm/libpthread/libdl/ld-linux:"
    echo "$bad" | indent
    status=1
fi

# 3. Global symbols defined in the static library (undefined ones, U, are filtered out).
globals=$(nm -g --defined-only "$ar" | awk 'NF == 3 { print $3 }' | sort -u)
echo "== $ar defines $(echo "$globals" | grep -c . || true) global symbols"
bad=$(echo "$globals" | grep -v '^$' | grep -Ev "$ignore" | grep -v '^fa_' || true)
if [ -n "$bad" ]; then
    echo "FAIL: $ar defines global symbols without the fa_ prefix"
    echo "      (make them static, or name internal ones fa__*):"
    echo "$bad" | indent
    status=1
fi

if [ "$status" -eq 0 ]; then
    echo "OK: exports are fa_* only and dependencies are libc/libm/libpthread/libdl only"
fi
exit "$status"
