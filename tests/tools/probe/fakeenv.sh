# fakeenv.sh — sourced by the doctor tests: builds a fake machine under $TMP and runs the
# `flashattn` command in it with a clean environment.
#
#   $TMP/bin             gcc, g++, gcc-N, g++-N (tests/tools/probe/fake/gcc), python3 (fake/python3)
#   $TMP/cuda            a toolkit: bin/nvcc (fake/nvcc), include/*.h, include/crt/host_config.h
#   $TMP/libfakecuda.so  the fake driver (fake_driver.c), loaded through FLASHATTN_DOCTOR_LIBCUDA
#
# fake_run VAR=value... -- ARGS runs "$FA" ARGS with only PATH, HOME, the sanitizer options and
# the given variables set (the default variables below first, so later ones override them).

fake_setup() { # SRCDIR CC
    mkdir -p "$TMP/bin" "$TMP/cuda/bin" "$TMP/cuda/include/crt" || return 1
    cp "$1/tests/tools/probe/fake/nvcc" "$TMP/cuda/bin/nvcc" &&
        cp "$1/tests/tools/probe/fake/gcc" "$TMP/bin/gcc" &&
        cp "$1/tests/tools/probe/fake/python3" "$TMP/bin/python3" || return 1
    chmod +x "$TMP/cuda/bin/nvcc" "$TMP/bin/gcc" "$TMP/bin/python3"
    ln -s gcc "$TMP/bin/g++"
    for h in cuda_runtime.h cublas_v2.h cusparse.h cusolverDn.h; do
        : > "$TMP/cuda/include/$h"
    done
    fake_host_config 14
    "$2" -shared -fPIC -o "$TMP/libfakecuda.so" "$1/tests/tools/probe/fake_driver.c"
}

fake_host_config() { # the newest gcc major the fake nvcc accepts
    printf '#if defined(__GNUC__)\n\n#if __GNUC__ > %s\n\n#error -- unsupported GNU version! gcc versions later than %s are not supported!\n\n#endif\n#endif\n' \
        "$1" "$1" > "$TMP/cuda/include/crt/host_config.h"
}

fake_defaults() {
    echo "PATH=$TMP/bin:$TMP/cuda/bin HOME=$TMP CUDA_HOME=$TMP/cuda" \
        "FLASHATTN_DOCTOR_LIBCUDA=$TMP/libfakecuda.so FLASHATTN_DOCTOR_DEFAULT_CUDA=none" \
        "FLASHATTN_DOCTOR_MEM_GB=120 FLASHATTN_DOCTOR_NCPU=32 FLASHATTN_DOCTOR_GLIBC=2.35" \
        "FLASHATTN_DOCTOR_LIBSTDCXX=${FAKE_LIBSTDCXX:-none}" \
        "FAKE_NVCC_RELEASE=12.8 FAKE_GCC_VERSION=12.2.0 FAKE_PY_OUT=$FAKE_PY_DIR/healthy.txt"
}

fake_run() {
    # shellcheck disable=SC2046
    /usr/bin/env -i $(fake_defaults) \
        ${ASAN_OPTIONS:+ASAN_OPTIONS=$ASAN_OPTIONS} ${UBSAN_OPTIONS:+UBSAN_OPTIONS=$UBSAN_OPTIONS} \
        "$@"
}
