#!/usr/bin/env bash
# check_install.sh BUILD_DIR CMAKE CC
#
# Installs the build tree into a temporary prefix, then builds and runs two tiny consumers:
#  1. a CMake project: find_package(flashattn) + flashattn::flashattn and flashattn::flashattn_static;
#  2. a plain compiler line with `pkg-config --cflags --libs flashattn`.
# Extra compiler flags (the sanitizer build's) come from FA_SANITIZE_FLAGS.
set -euo pipefail

if [ $# -ne 3 ]; then
    echo "usage: $0 BUILD_DIR CMAKE CC" >&2
    exit 2
fi
build=$1
cmake=$2
cc=$3
san=${FA_SANITIZE_FLAGS:-}

command -v pkg-config >/dev/null || {
    echo "FAIL: pkg-config is not installed (apt-get install -y pkg-config); it is needed to check flashattn.pc"
    exit 1
}

work=$(mktemp -d "${TMPDIR:-/tmp}/fa-install.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

echo "== cmake --install $build --prefix $prefix"
"$cmake" --install "$build" --prefix "$prefix" >"$work/install.log" || {
    cat "$work/install.log"
    echo "FAIL: cmake --install failed"
    exit 1
}
sed 's/^/   /' "$work/install.log"

# The installed command must find the installed library through its RPATH ($ORIGIN/../lib).
if [ -x "$prefix/bin/flashattn" ]; then
    ldd "$prefix/bin/flashattn" | grep "=> $prefix/.*libflashattn" >/dev/null || { # not grep -q: SIGPIPE under pipefail
        ldd "$prefix/bin/flashattn"
        echo "FAIL: the installed flashattn command does not load the installed libflashattn"
        exit 1
    }
    echo "   bin/flashattn loads $(ldd "$prefix/bin/flashattn" | grep -o "$prefix/[^ ]*libflashattn[^ ]*")"
fi

# The consumer: checks that header and library agree and that a forward call works.
mkdir -p "$work/app"
cat >"$work/app/app.c" <<'C'
#include <flashattn.h>
#include <stdio.h>

int main(void) {
    if (fa_version() != FA_VERSION_HEX) {
        fprintf(stderr, "header/library version mismatch: %s\n", fa_version_string());
        return 1;
    }
    float q[4] = {1, 0, 0, 1}, k[4] = {1, 0, 0, 1}, v[4] = {1, 2, 3, 4}, o[4];
    int64_t shape[4] = {1, 2, 1, 2}; /* B, S, H, D */
    fa_tensor tq = fa_tensor_contiguous(q, FA_DTYPE_F32, 4, shape);
    fa_tensor tk = fa_tensor_contiguous(k, FA_DTYPE_F32, 4, shape);
    fa_tensor tv = fa_tensor_contiguous(v, FA_DTYPE_F32, 4, shape);
    fa_tensor to = fa_tensor_contiguous(o, FA_DTYPE_F32, 4, shape);
    fa_status st = fa_forward(NULL, NULL, &tq, &tk, &tv, &to, NULL);
    if (st != FA_OK) {
        fprintf(stderr, "fa_forward: %s: %s\n", fa_strerror(st), fa_last_error_message());
        return 1;
    }
    printf("flashattn %s works: out[0] = %g\n", fa_version_string(), o[0]);
    return 0;
}
C
cat >"$work/app/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.20)
project(fa_consumer LANGUAGES C)
find_package(flashattn REQUIRED)
add_executable(app_shared app.c)
target_link_libraries(app_shared PRIVATE flashattn::flashattn)
add_executable(app_static app.c)
target_link_libraries(app_static PRIVATE flashattn::flashattn_static)
CMAKE

echo "== find_package(flashattn) consumer"
"$cmake" -S "$work/app" -B "$work/app/build" -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_C_COMPILER="$cc" -DCMAKE_C_FLAGS="$san" >"$work/cmake.log" 2>&1 &&
    "$cmake" --build "$work/app/build" >>"$work/cmake.log" 2>&1 || {
    cat "$work/cmake.log"
    echo "FAIL: a CMake project could not find_package(flashattn) and link it"
    exit 1
}
"$work/app/build/app_shared" || { echo "FAIL: the find_package consumer (shared) failed"; exit 1; }
"$work/app/build/app_static" || { echo "FAIL: the find_package consumer (static) failed"; exit 1; }

echo "== pkg-config consumer"
pc=$(find "$prefix" -name flashattn.pc | head -n 1)
[ -n "$pc" ] || { echo "FAIL: flashattn.pc was not installed"; exit 1; }
export PKG_CONFIG_PATH
PKG_CONFIG_PATH=$(dirname "$pc")
flags=$(pkg-config --cflags --libs flashattn) || { echo "FAIL: pkg-config cannot read $pc"; exit 1; }
libdir=$(pkg-config --variable=libdir flashattn)
echo "   pkg-config --cflags --libs flashattn: $flags"
# shellcheck disable=SC2086  # $flags and $san are lists of flags
"$cc" $san "$work/app/app.c" -o "$work/app_pc" $flags -Wl,-rpath,"$libdir" || {
    echo "FAIL: could not build with \`pkg-config --cflags --libs flashattn\`"
    exit 1
}
"$work/app_pc" || { echo "FAIL: the pkg-config consumer failed"; exit 1; }

echo "OK: installed package works through find_package and pkg-config"
