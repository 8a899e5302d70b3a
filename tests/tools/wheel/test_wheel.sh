#!/bin/sh
# test_wheel.sh FLASHATTN SRCDIR CC — `flashattn wheel`: wheel names under the rules of several
# release lines (cu118/cu122, cu123, cu11/cu12, cu13 after 2.8.3.post1), the choice of release
# for a machine (glibc, Blackwell, torch too new), --check on good, bad and odd file names,
# --json, and --build-script: its content for fake machines, `sh -n`, and a full run against
# a fake Python/pip/nvcc that records what it was asked to do.
set -u
FA=$1
SRC=$2
CC=$3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT INT TERM
fail=0
pass=0
scenario=""
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL [$scenario]: $*"; fail=$((fail + 1)); }

# wheel NAME ARGS...: an offline run describing the machine on the command line
wheel() {
    scenario=$1
    shift
    out=$TMP/$scenario.out
    XDG_CACHE_HOME=${CACHE:-$TMP/nocache} FLASHATTN_DOCTOR_LIBCUDA=none "$FA" wheel --no-python \
        "$@" > "$out" 2>&1
    rc=$?
}
has() { grep -qF -- "$1" "$out" && ok || { bad "missing: $1"; sed 's/^/    /' "$out" | head -20; }; }
exit_is() { [ "$rc" -eq "$1" ] && ok || bad "exit status $rc, want $1"; }
U=https://github.com/Dao-AILab/flash-attention/releases/download

wheel latest --python 3.12 --torch 2.8.0 --cuda 12.8 --abi TRUE --glibc 2.35 --cc 9.0
exit_is 0
has "flash-attn 2.8.3.post1 (the newest release)"
has "$U/v2.8.3.post1/flash_attn-2.8.3.post1+cu12torch2.8cxx11abiTRUE-cp312-cp312-linux_x86_64.whl"
has "(flashattn's release table was checked on 2026-12-07; a newer release is not in it)"

wheel v283 --flash-attn 2.8.3 --python 3.12 --torch 2.8.0 --cuda 12.8 --abi TRUE --glibc 2.35 --cc 9.0
exit_is 0
has "$U/v2.8.3/flash_attn-2.8.3+cu12torch2.8cxx11abiTRUE-cp312-cp312-linux_x86_64.whl"

wheel v263 --flash-attn 2.6.3 --python cp310 --torch 2.4 --cuda 12.1 --abi FALSE --glibc 2.31 --cc 8.0
exit_is 0
has "flash_attn-2.6.3+cu123torch2.4cxx11abiFALSE-cp310-cp310-linux_x86_64.whl"

wheel v260 --flash-attn 2.6.0 --python cp311 --torch 2.2 --cuda 12.1 --abi TRUE --glibc 2.31 --cc 8.0
exit_is 0
has "flash_attn-2.6.0+cu122torch2.2cxx11abiTRUE-cp311-cp311-linux_x86_64.whl"

wheel v258 --flash-attn 2.5.8 --python cp39 --torch 2.1 --cuda 11.8 --abi FALSE --glibc 2.31 --cc 8.6
exit_is 0
has "flash_attn-2.5.8+cu118torch2.1cxx11abiFALSE-cp39-cp39-linux_x86_64.whl"

wheel v270 --flash-attn 2.7.0 --python cp311 --torch 2.5 --cuda 11.8 --abi FALSE --glibc 2.31 --cc 8.0
exit_is 0
has "flash_attn-2.7.0+cu11torch2.5cxx11abiFALSE-cp311-cp311-linux_x86_64.whl"

wheel v250-no-torch23 --flash-attn 2.5.0 --python cp310 --torch 2.3 --cuda 12.1 --abi FALSE --glibc 2.31 --cc 8.0
exit_is 1
has "flash-attn 2.5.0 has no wheel for it: torch 2.3"
has "instead: flash-attn 2.7.4.post1 has one"

wheel v2741-cu11 --flash-attn 2.7.4.post1 --python cp310 --torch 2.4 --cuda 11.8 --abi FALSE --glibc 2.31 --cc 8.0
exit_is 1
has "CUDA 11 torch (wheels built with CUDA 12.4)"

# 2.8.3.post1 names a CUDA 13 torch's wheel cu13, but its publish.yml built only CUDA 12.9 wheels
wheel post1-cu13 --flash-attn 2.8.3.post1 --python cp312 --torch 2.9 --cuda 13.0 --abi TRUE --glibc 2.35 --cc 9.0
exit_is 1
has "flash-attn 2.8.3.post1 has no wheel for it: torch 2.9 (wheels: 2.4 2.5 2.6 2.7 2.8); CUDA 13 torch (wheels built with CUDA 12.9)"
has "setup.py would try flash_attn-2.8.3.post1+cu13torch2.9cxx11abiTRUE-cp312-cp312-linux_x86_64.whl"

wheel unknown-release --flash-attn 2.8.4 --python cp312 --torch 2.9 --cuda 13.0 --abi TRUE --glibc 2.35 --cc 9.0
exit_is 0
has "not in flashattn's release table"
has "flash_attn-2.8.4+cu13torch2.9cxx11abiTRUE-cp312-cp312-linux_x86_64.whl"

wheel cu13-old-rule --flash-attn 2.8.3 --python cp312 --torch 2.9 --cuda 13.0 --abi TRUE --glibc 2.35 --cc 9.0
exit_is 1
has "guesses cu12 for a CUDA 13 torch"

wheel torch-too-new --python 3.12 --torch 2.9.1 --cuda 12.8 --abi TRUE --glibc 2.35 --cc 9.0
exit_is 1
has "no known flash-attn release has a wheel for it"
has "install torch 2.8"
has "--build-script"
has "its CUDA plug-in runs the forward, backward, KV cache and combine, not yet run on a GPU"
grep -q "planned" "$out" && bad "calls the CUDA plug-in planned" || ok

wheel ubuntu2004 --python 3.10 --torch 2.6 --cuda 12.4 --abi FALSE --glibc 2.31 --cc 8.0
exit_is 0
has "flash-attn 2.7.4.post1 (the newest release with a wheel that fits)"
has "flash_attn-2.7.4.post1+cu12torch2.6cxx11abiFALSE-cp310-cp310-linux_x86_64.whl"
has "GLIBC_2.32"

wheel blackwell --python 3.12 --torch 2.6 --cuda 12.6 --abi FALSE --glibc 2.35 --cc 12.0
exit_is 0
has "flash_attn-2.8.3.post1+cu12torch2.6cxx11abiFALSE-cp312-cp312-linux_x86_64.whl"

wheel blackwell-old --flash-attn 2.7.4.post1 --python 3.12 --torch 2.6 --cuda 12.6 --abi FALSE --glibc 2.35 --cc 12.0
exit_is 1
has "no kernel image"

wheel cpu-torch --python 3.11 --torch 2.5 --cuda none --abi FALSE --glibc 2.35 --cc 9.0
exit_is 1
has "torch is a CPU-only build"

wheel aarch64 --python 3.12 --torch 2.8 --cuda 12.8 --abi TRUE --glibc 2.35 --cc 9.0 --platform aarch64
exit_is 1
has "only linux_x86_64 wheels are published"

wheel json --json --python 3.12 --torch 2.8.0 --cuda 12.8 --abi TRUE --glibc 2.35 --cc 9.0
exit_is 0
has '"wheel": "flash_attn-2.8.3.post1+cu12torch2.8cxx11abiTRUE-cp312-cp312-linux_x86_64.whl"'
has '"release_table_checked": "2026-12-07"'
cp "$out" "$TMP/j1.json"
wheel json-none --json --python 3.12 --torch 2.9 --cuda 12.8 --abi TRUE --glibc 2.35 --cc 9.0
cp "$out" "$TMP/j2.json"
wheel json-v --json --flash-attn 2.5.0 --python 3.10 --torch 2.3 --cuda 12.1 --abi FALSE --glibc 2.35 --cc 9.0
cp "$out" "$TMP/j3.json"

wheel bad-usage --flash-attn
exit_is 2
wheel bad-value --python 2.7 --torch 2.8 --cuda 12.8 --abi TRUE --cc 9.0
exit_is 2

# ---- --check ----
M="--python 3.12 --torch 2.8 --cuda 12.8 --abi TRUE --glibc 2.35 --cc 9.0"
# shellcheck disable=SC2086
wheel check-good --check /downloads/flash_attn-2.8.3+cu12torch2.8cxx11abiTRUE-cp312-cp312-linux_x86_64.whl $M
exit_is 0
has "no mismatch"
# shellcheck disable=SC2086
wheel check-bad --check flash_attn-2.7.4.post1+cu11torch2.5cxx11abiFALSE-cp311-cp311-linux_x86_64.whl $M
exit_is 1
has "[✗] python tag: wheel cp311, this Python cp312"
has "[✗] torch: wheel 2.5, installed 2.8"
has "[✗] CUDA: wheel cu11 (CUDA 11), torch's CUDA 12.8"
has "[✗] C++ ABI: wheel cxx11abiFALSE, torch _GLIBCXX_USE_CXX11_ABI=True"
has "4 mismatches"
# shellcheck disable=SC2086
wheel check-renamed --check flash_attn-2.8.3-cp312-cp312-linux_x86_64.whl $M
exit_is 0
has "no local version"
# shellcheck disable=SC2086
wheel check-platform --check flash_attn-2.8.3+cu12torch2.8cxx11abiTRUE-cp312-cp312-win_amd64.whl $M
exit_is 1
has "platform: wheel win_amd64"
# shellcheck disable=SC2086
wheel check-rocm --check flash_attn-2.8.3+rocm62torch2.8cxx11abiTRUE-cp312-cp312-linux_x86_64.whl $M
exit_is 1
has "a ROCm wheel"
# shellcheck disable=SC2086
wheel check-glibc --check flash_attn-2.8.3+cu12torch2.8cxx11abiTRUE-cp312-cp312-linux_x86_64.whl --glibc 2.31 --python 3.12 --torch 2.8 --cuda 12.8 --abi TRUE --cc 9.0
exit_is 1
has "GLIBC_2.32"
# the glibc a manylinux platform tag needs (PEP 600 manylinux_X_Y and the legacy aliases) against
# this machine's (--glibc); a wheel fits when one of its '.'-separated tags does
G="--python 3.12 --torch 2.8 --cuda 12.8 --abi TRUE --cc 9.0"
FA283=flash_attn-2.8.3+cu12torch2.8cxx11abiTRUE-cp312-cp312
# shellcheck disable=SC2086
wheel check-manylinux-2-40 --check $FA283-manylinux_2_40_x86_64.whl --glibc 2.36 $G
exit_is 1
has "[✗] glibc: wheel manylinux_2_40_x86_64 needs glibc >= 2.40, this machine has glibc 2.36"
has "flashattn wheel --build-script"
has "1 mismatch:"
# shellcheck disable=SC2086
wheel check-manylinux-2-28 --check $FA283-manylinux_2_28_x86_64.whl --glibc 2.36 $G
exit_is 0
has "[✓] glibc: the wheel needs glibc >= 2.28, this machine has glibc 2.36"
# shellcheck disable=SC2086
wheel check-manylinux-same --check $FA283-manylinux_2_36_x86_64.whl --glibc 2.36 $G
exit_is 0
# shellcheck disable=SC2086
wheel check-manylinux-compound --check $FA283-manylinux_2_40_x86_64.manylinux2014_x86_64.whl --glibc 2.36 $G
exit_is 0
has "[✓] glibc: the wheel needs glibc >= 2.17"
# shellcheck disable=SC2086
wheel check-manylinux1 --check foo-1.0-cp312-cp312-manylinux1_x86_64.whl --glibc 2.4 $G
exit_is 1
has "[✗] glibc: wheel manylinux1_x86_64 needs glibc >= 2.5, this machine has glibc 2.4"
# shellcheck disable=SC2086
wheel check-manylinux2010 --check foo-1.0-cp312-cp312-manylinux2010_x86_64.whl --glibc 2.11 $G
exit_is 1
has "needs glibc >= 2.12, this machine has glibc 2.11"
# shellcheck disable=SC2086
wheel check-manylinux2014 --check foo-1.0-cp312-cp312-manylinux2014_x86_64.whl --glibc 2.12 $G
exit_is 1
has "needs glibc >= 2.17, this machine has glibc 2.12"
# shellcheck disable=SC2086
wheel check-manylinux2014-ok --check foo-1.0-cp312-cp312-manylinux2014_x86_64.whl --glibc 2.17 $G
exit_is 0
# shellcheck disable=SC2086
wheel check-manylinux-arch --check $FA283-manylinux_2_28_aarch64.whl --glibc 2.36 $G
exit_is 1
has "[✗] platform: wheel manylinux_2_28_aarch64, this machine linux_x86_64"
# shellcheck disable=SC2086
wheel check-musllinux --check $FA283-musllinux_1_2_x86_64.whl --glibc 2.36 $G
exit_is 1
has "is for musl libc"
# shellcheck disable=SC2086
wheel check-manylinux-json --json --check $FA283-manylinux_2_40_x86_64.whl --glibc 2.36 $G
exit_is 1
has '"mismatches": ["glibc: wheel manylinux_2_40_x86_64 needs glibc >= 2.40'
# shellcheck disable=SC2086
wheel check-malformed --check flash_attn-2.8.3.tar.gz $M
exit_is 2
# shellcheck disable=SC2086
wheel check-json --json --check flash_attn-2.7.4.post1+cu11torch2.5cxx11abiFALSE-cp311-cp311-linux_x86_64.whl $M
exit_is 1
cp "$out" "$TMP/j4.json"

PY=$(command -v python3 || true)
if [ -n "$PY" ]; then
    scenario=json
    "$PY" - "$TMP"/j*.json <<'EOF' && ok || bad "JSON"
import json, sys
docs = [json.load(open(p, encoding="utf-8")) for p in sys.argv[1:]]
assert docs[0]["exists"] is True and docs[0]["url"].endswith(".whl")
assert docs[1]["exists"] is False and docs[1]["wheel"] is None and "torch 2.9" in docs[1]["why_not"]
assert docs[2]["exists"] is False and docs[2]["known_release"] is True
assert len(docs[3]["mismatches"]) == 4, docs[3]
EOF
fi

# ---- the machine probed: a fake one ----
FAKE_PY_DIR=$SRC/tests/tools/probe/py
. "$SRC/tests/tools/probe/fakeenv.sh"
fake_setup "$SRC" "$CC" || { echo "cannot build the fake environment"; exit 1; }
scenario=probed
fake_run "$FA" wheel > "$TMP/probed.out"
out=$TMP/probed.out
has "Python cp312, torch 2.8 with CUDA 12.8, C++11 ABI TRUE, x86_64, glibc 2.35, GPU sm_90"
has "flash_attn-2.8.3.post1+cu12torch2.8cxx11abiTRUE-cp312-cp312-linux_x86_64.whl"

# ---- --build-script ----
script() { # NAME VAR=value...: writes the script for a fake machine
    scenario=$1
    shift
    out=$TMP/$scenario.sh
    fake_run "$@" "$FA" wheel --build-script > "$out" 2> "$TMP/$scenario.err"
    rc=$?
    exit_is 0
    sh -n "$out" && ok || bad "sh -n"
}
script build-default
has 'export CUDA_HOME="${CUDA_HOME:-'"$TMP"'/cuda}"'
has 'export TORCH_CUDA_ARCH_LIST="9.0"'
has 'export FLASH_ATTN_CUDA_ARCHS="90"'
has 'export MAX_JOBS=6 NVCC_THREADS=4'
has 'export FLASH_ATTENTION_FORCE_CXX11_ABI=TRUE'
has 'CC/CXX stay unset'
has 'pip install --no-build-isolation --no-cache-dir -v "flash-attn==$FLASH_ATTN_VERSION"'
has "pip cache remove 'flash_attn*'"
has 'FLASH_ATTN_VERSION="${FLASH_ATTN_VERSION:-2.8.3.post1}"'
has 'flash_attn_func(q, k, v, causal=True)'

fake_host_config 12
ln -s gcc "$TMP/bin/gcc-12"
ln -s gcc "$TMP/bin/g++-12"
script build-gcc FAKE_GCC_VERSION=14.2.0 FAKE_NVCC_RELEASE=12.1 FLASHATTN_DOCTOR_MEM_GB=22.5 FLASHATTN_DOCTOR_NCPU=2 \
    FAKE_CUDA_GPUS="NVIDIA A10:8.6:24;NVIDIA A100:8.0:80" FAKE_PY_OUT="$SRC/tests/tools/probe/py/cpu_torch.txt"
has 'export CC=gcc-12 CXX=g++-12'
has 'export MAX_JOBS=1 NVCC_THREADS=2'
has 'export TORCH_CUDA_ARCH_LIST="8.0;8.6"'
has 'export FLASH_ATTN_CUDA_ARCHS="80"'
has 'unset FLASH_ATTENTION_FORCE_CXX11_ABI'
fake_host_config 14

script build-nogpu FLASHATTN_DOCTOR_LIBCUDA=none FAKE_PY_OUT="$SRC/tests/tools/probe/py/no_torch.txt"
has 'GPUs: none visible'
has 'torch: NOT INSTALLED'
has 'export TORCH_CUDA_ARCH_LIST="8.0;9.0"'

# run the default script against fake python/pip/nvcc: the steps, in order, and the final check
scenario=build-run
: > "$TMP/pip.log"
/usr/bin/env -i PATH="$TMP/bin:$TMP/cuda/bin:/usr/bin:/bin" HOME="$TMP" CUDA_HOME="$TMP/cuda" \
    PYTHON="$TMP/bin/python3" FAKE_PY_MODE=build FAKE_PIP_LOG="$TMP/pip.log" FAKE_NVCC_RELEASE=12.8 \
    sh "$TMP/build-default.sh" > "$TMP/run.out" 2>&1
rc=$?
exit_is 0
out=$TMP/run.out
has "building flash-attn 2.8.3.post1: nvcc 12.8, torch CUDA 12.8, MAX_JOBS=6 NVCC_THREADS=4"
has "flash-attn 2.8.3.post1 works"
out=$TMP/pip.log
has "python -m pip install --upgrade packaging ninja psutil wheel setuptools einops"
has "python -m pip uninstall -y flash-attn flash_attn"
has "python -m pip cache remove flash_attn*"
has "python -m pip install --no-build-isolation --no-cache-dir -v flash-attn==2.8.3.post1"
has "python - (import check)"
[ "$(sed -n 3p "$TMP/pip.log")" = "python -m pip cache remove flash_attn*" ] && ok || bad "the order of the steps: $(cat "$TMP/pip.log")"

scenario=build-run-mismatch
: > "$TMP/pip.log"
/usr/bin/env -i PATH="$TMP/bin:$TMP/cuda/bin:/usr/bin:/bin" HOME="$TMP" CUDA_HOME="$TMP/cuda" \
    PYTHON="$TMP/bin/python3" FAKE_PY_MODE=build FAKE_PIP_LOG="$TMP/pip.log" FAKE_NVCC_RELEASE=12.8 \
    FAKE_TORCH_CUDA=11.8 sh "$TMP/build-default.sh" > "$TMP/run2.out" 2>&1
rc=$?
exit_is 1
out=$TMP/run2.out
has "nvcc 12.8 and torch's CUDA 11.8 differ in major version"
[ ! -s "$TMP/pip.log" ] && ok || bad "pip ran although the check failed"

# --refresh: a fake listing (file://) parsed into the cache, then used by a later run; bad
# listings and failed fetches leave the cache as it was.
refresh() {
    scenario=$1
    url=$2
    out=$TMP/$scenario.out
    XDG_CACHE_HOME=$TMP/cache FLASHATTN_RELEASES_URL=$url "$FA" wheel --refresh > "$out" 2>&1
    rc=$?
}
LISTING=$SRC/tests/tools/wheel/releases.json
refresh refresh-ok "file://$LISTING"
exit_is 0
has "release table refreshed on $(date -u +%Y-%m-%d)"
has "newest release: flash-attn 2.8.4 (torch 2.8 2.9 2.10; CUDA 12 13; Python 3.10-3.13; \
aarch64 x86_64)"
grep -q "^2.8.3.post1	9	13	2.4 2.8	12	2.32	1	x86_64$" "$TMP/cache/flashattn/releases.tsv" && ok ||
    bad "2.8.3.post1's row from the listing: $(cat "$TMP/cache/flashattn/releases.tsv")"
grep -q "^2.5.0	7	11	" "$TMP/cache/flashattn/releases.tsv" && ok || bad "bundled rows kept"
cp "$TMP/cache/flashattn/releases.tsv" "$TMP/cache.good"

CACHE=$TMP/cache
wheel cached-cu13 --python 3.12 --torch 2.10 --cuda 13.0 --abi TRUE --glibc 2.35 --cc 9.0
exit_is 0
has "$U/v2.8.4/flash_attn-2.8.4+cu13torch2.10cxx11abiTRUE-cp312-cp312-linux_x86_64.whl"
has "release table was fetched on $(date -u +%Y-%m-%d) into $TMP/cache/flashattn/releases.tsv"
wheel cached-arm --python 3.12 --torch 2.9 --cuda 12.8 --abi TRUE --platform linux_aarch64 \
    --glibc 2.35 --cc 9.0
exit_is 0
has "flash_attn-2.8.4+cu12torch2.9cxx11abiTRUE-cp312-cp312-linux_aarch64.whl"
wheel cached-json --json --python 3.12 --torch 2.8 --cuda 12.8 --abi TRUE --glibc 2.35 --cc 9.0
has "\"release_table\": \"$TMP/cache/flashattn/releases.tsv\""
CACHE=

head -c 3000 "$LISTING" > "$TMP/cut.json"
refresh refresh-malformed "file://$TMP/cut.json"
exit_is 1
has "is not valid JSON"
has "the release table is unchanged"
echo '[]' > "$TMP/empty.json"
refresh refresh-empty "file://$TMP/empty.json"
exit_is 1
has "the listing names no flash_attn CUDA wheel for Linux"
refresh refresh-missing "file://$TMP/no-such.json"
exit_is 1
has "cannot read $TMP/no-such.json"
refresh refresh-offline "http://127.0.0.1:9/releases"
exit_is 1
has "the release table is unchanged"
[ "$(wc -l < "$out")" -eq 1 ] && ok || bad "one line, not: $(cat "$out")"
cmp -s "$TMP/cache.good" "$TMP/cache/flashattn/releases.tsv" && ok || bad "the cache changed"
[ "$(ls "$TMP/cache/flashattn")" = releases.tsv ] && ok || bad "left: $(ls "$TMP/cache/flashattn")"

scenario=refresh-args
"$FA" wheel --refresh --torch 2.8 > "$TMP/args.out" 2>&1
rc=$?
out=$TMP/args.out
exit_is 2
has "--refresh takes no other argument"

mkdir -p "$TMP/bad/flashattn"
printf 'checked\t2026-12-07\nnot a row\n' > "$TMP/bad/flashattn/releases.tsv"
CACHE=$TMP/bad
wheel bad-cache --python 3.12 --torch 2.8 --cuda 12.8 --abi TRUE --glibc 2.35 --cc 9.0
exit_is 0
has "ignoring the release cache ($TMP/bad/flashattn/releases.tsv line 2 is not a release row)"
has "flash-attn 2.8.3.post1 (the newest release)"
CACHE=

wheel windows --python 3.12 --torch 2.8 --cuda 12.8 --abi TRUE --platform win_amd64 --cc 9.0
exit_is 1
has "https://github.com/mjun0812/flash-attention-prebuild-wheels"
wheel old-glibc --python 3.10 --torch 2.8 --cuda 12.8 --abi TRUE --glibc 2.28 --cc 9.0
has "community-built wheels for older glibc"

echo "test_wheel: $pass passed, $fail failed"
[ $fail -eq 0 ]
