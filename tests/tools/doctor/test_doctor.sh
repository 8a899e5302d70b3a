#!/bin/sh
# test_doctor.sh FLASHATTN SRCDIR CC FAKE_PLUGIN — `flashattn doctor` against fake machines: a fake
# driver library (fake_driver.c) and fake nvcc, gcc and python on PATH, chosen through environment
# variables (see fakeenv.sh and envprobe.h). A healthy setup and, one at a time, the broken ones
# people meet: no driver, a driver older than the toolkit and torch, a GPU below sm_80, nvcc vs
# torch CUDA majors, a gcc nvcc rejects, missing headers, a bad CUDA_HOME, cuInit errors, low RAM,
# old glibc, CPU-only or absent torch, a C++ ABI mismatch with the undefined symbol read from a real
# .so (when g++ is there), and a Python that is absent, broken, crashes, hangs or prints garbage.
# Each is checked through --json (finding id and status, exit status) and a few through the text
# output. What flashattn's CUDA plug-in runs on each GPU generation, and the line of each device
# through a loaded plug-in (FAKE_PLUGIN: tests/fake_cuda_plugin.c).
set -u
FA=$1
SRC=$2
CC=$3
FAKE_PLUGIN=$4
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT INT TERM
FAKE_PY_DIR=$TMP/py
mkdir -p "$FAKE_PY_DIR"
cp "$SRC"/tests/tools/probe/py/*.txt "$FAKE_PY_DIR/"
for f in /usr/lib/x86_64-linux-gnu/libstdc++.so.6 /usr/lib64/libstdc++.so.6 /usr/lib/aarch64-linux-gnu/libstdc++.so.6; do
    [ -f "$f" ] && FAKE_LIBSTDCXX=$f && break
done
. "$SRC/tests/tools/probe/fakeenv.sh"
fake_setup "$SRC" "$CC" || { echo "cannot build the fake environment"; exit 1; }

fail=0
pass=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL [$scenario]: $*"; fail=$((fail + 1)); }
n_json=0

# doctor NAME VAR=value...: runs doctor --json in the fake machine; $rc, $out (the JSON file)
doctor() {
    scenario=$1
    shift
    out=$TMP/$scenario.json
    fake_run "$@" "$FA" doctor --json > "$out" 2> "$TMP/$scenario.err"
    rc=$?
    n_json=$((n_json + 1))
}
# finding ID STATUS [TEXT]: a finding with this id and status (and text in its line) exists
finding() {
    if grep "\"id\": \"$1\", \"status\": \"$2\"" "$out" | grep -q -- "${3:-}"; then ok; else
        bad "no finding id=$1 status=$2 ${3:+containing '$3'}"
        grep "\"id\": \"$1\"" "$out" | head -2
    fi
}
no_finding() { grep -q "\"id\": \"$1\", \"status\": \"$2\"" "$out" && bad "unexpected $1 $2" || ok; }
exit_is() { [ "$rc" -eq "$1" ] && ok || bad "exit status $rc, want $1"; }
problems_is() { grep -q "\"problems\": $1}" "$out" && ok || bad "problems != $1: $(grep '"summary"' "$out")"; }

# ---- healthy ----
doctor healthy
exit_is 0
problems_is 0
finding library ok
finding driver ok "570.86.15"
finding gpu ok "sm_90"
finding cuda_home ok
finding nvcc ok "nvcc 12.8"
finding headers ok
finding driver_vs_toolkit ok
finding gcc ok "12.2.0"
finding gcc_vs_nvcc ok "accepts gcc 12 (<= 14)"
finding glibc ok "2.35"
finding max_jobs ok "MAX_JOBS=6 NVCC_THREADS=4"
finding arch_list ok "TORCH_CUDA_ARCH_LIST='9.0'"
finding python ok "cp312"
finding build_deps ok
finding torch ok "_GLIBCXX_USE_CXX11_ABI=True"
finding nvcc_vs_torch ok
finding flash_attn ok "2.8.3"
grep -q '"max_jobs": 6' "$out" && grep -q '"flash_attn_cuda_archs": "90"' "$out" && ok || bad "facts"
grep -q '"compute_capability": "9.0"' "$out" && ok || bad "facts: GPU"

# the same machine in text: marks, sections, the closing line
fake_run "$FA" doctor > "$TMP/healthy.txt"
scenario=healthy-text
grep -q '^\[✓\] NVIDIA driver 570.86.15, supports CUDA 12.8, 1 GPU$' "$TMP/healthy.txt" && ok || bad "driver line"
grep -q '^NVIDIA driver and GPUs$' "$TMP/healthy.txt" && ok || bad "section heading"
grep -q '^• No issues found!' "$TMP/healthy.txt" || grep -q 'Doctor found 0 problems' "$TMP/healthy.txt" && ok || bad "footer"

# ---- the driver ----
doctor no-driver FLASHATTN_DOCTOR_LIBCUDA="$TMP/no-such-libcuda.so"
exit_is 0
finding driver warning "no NVIDIA driver"
finding arch_list warning "no GPU visible"
doctor driver-none FLASHATTN_DOCTOR_LIBCUDA=none
finding driver warning
doctor old-driver FAKE_CUDA_DRIVER_VERSION=11040 FAKE_NVCC_RELEASE=12.4
exit_is 1
finding driver_vs_toolkit problem "older than the toolkit"
finding driver_vs_torch problem "only CUDA 11.4"
doctor driver-minor FAKE_CUDA_DRIVER_VERSION=12040 FAKE_NVCC_RELEASE=12.8
finding driver_vs_toolkit warning "same major"
grep -q 'flashattn.s CUDA plug-in: tensor-core kernels for fp16 and bf16 (mma.sync m16n8k16), fp32 on CUDA cores; machine code in the default build' "$out" &&
    ok || bad "flashattn's kernels on sm_90"
doctor turing FAKE_CUDA_GPUS="Tesla T4:7.5:15"
exit_is 1
finding gpu problem "sm_75"
grep -q 'Turing tensor-core kernels for fp16 (mma.sync m16n8k8), bf16 and fp32 on CUDA cores' "$out" &&
    ok || bad "flashattn's kernels on sm_75"
grep -q 'flash-attn 1.x, or flashattn.s CUDA plug-in (fp16 on this GPU.s tensor cores)' "$out" && ok || bad "sm_75 fix"
doctor volta FAKE_CUDA_GPUS="Tesla V100-SXM2-16GB:7.0:16" FAKE_NVCC_RELEASE=13.0 FAKE_CUDA_DRIVER_VERSION=13000
exit_is 1
finding gpu problem "sm_70"
grep -q 'only when built with a CUDA 12 toolkit (CUDA 13 dropped sm_70)' "$out" && ok || bad "flashattn on sm_70"
grep -q "nvcc is CUDA 13.0: it cannot build the plug-in for sm_70" "$out" && ok || bad "sm_70 and nvcc 13"
grep -q "FA_CUDA_ARCHS='70;80'" "$out" && ok || bad "sm_70 fix"
doctor volta-nvcc12 FAKE_CUDA_GPUS="Tesla V100-SXM2-16GB:7.0:16"
grep -q "cannot build the plug-in" "$out" && bad "nvcc 12.8 said unable to build for sm_70" || ok
doctor pascal FAKE_CUDA_GPUS="Tesla P100-PCIE-16GB:6.0:16"
exit_is 1
finding gpu problem "sm_60"
grep -q 'does not support sm_60 (it needs sm_70 or newer)' "$out" && ok || bad "flashattn on sm_60"
grep -q 'or flashattn on the CPU' "$out" && ok || bad "sm_60 fix"
doctor ada FAKE_CUDA_GPUS="NVIDIA L4:8.9:24"
finding gpu ok "sm_89"
grep -q "fp32 on CUDA cores; runs the default build's sm_80 code" "$out" && ok || bad "flashattn on sm_89"
doctor blackwell FAKE_CUDA_GPUS="NVIDIA GeForce RTX 5090:12.0:32;NVIDIA H100:9.0:80"
finding gpu ok "sm_120"
finding arch_list ok "TORCH_CUDA_ARCH_LIST='9.0;12.0'"
finding arch_list ok "FLASH_ATTN_CUDA_ARCHS='90;120'"
doctor blackwell-old-nvcc FAKE_CUDA_GPUS="NVIDIA B200:10.0:180" FAKE_NVCC_RELEASE=12.4 FAKE_CUDA_DRIVER_VERSION=12080
finding arch_vs_nvcc problem "sm_100"
grep -q "the driver compiles the default build's sm_80 PTX" "$out" && ok || bad "flashattn on sm_100"

# ---- flashattn's CUDA plug-in, loaded: one line per device ----
doctor plugin FA_CUDA_PLUGIN="$FAKE_PLUGIN"
finding cuda_plugin ok "(FA_CUDA_PLUGIN)"
grep -q '"cuda:0: fake device (host memory)"' "$out" && ok || bad "no line for cuda:0"
doctor plugin-missing FA_CUDA_PLUGIN="$TMP/no-such-plugin.so"
finding cuda_plugin warning "not found"
grep -q "FA_CUDA_PLUGIN's $TMP/no-such-plugin.so is not there" "$out" && ok || bad "the missing FA_CUDA_PLUGIN file"
grep -q '"cuda:0: ' "$out" && bad "a device line without a plug-in" || ok
doctor no-device FAKE_CUDA_INIT=100
finding driver warning "no GPU is visible"
doctor stub FAKE_CUDA_INIT=34
exit_is 1
finding driver problem "stub"
doctor mismatch803 FAKE_CUDA_INIT=803
exit_is 1
finding driver problem "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"
grep -q 'reboot' "$out" && ok || bad "803 fix"
doctor no-nvml FAKE_NVML_VERSION=fail
finding driver ok "supports CUDA 12.8"

# ---- the toolkit ----
doctor nvcc-vs-torch FAKE_NVCC_RELEASE=11.8
exit_is 1
finding nvcc_vs_torch problem "nvcc 11.8 and torch's CUDA 12.8"
doctor nvcc-minor FAKE_NVCC_RELEASE=12.6
finding nvcc_vs_torch warning "minor"
doctor nvcc-too-old FAKE_NVCC_RELEASE=11.5 FAKE_CUDA_DRIVER_VERSION=12080
finding nvcc_version problem "too old"
doctor nvcc-broken FAKE_NVCC_BROKEN=1
finding nvcc problem "does not run"
doctor bad-cuda-home CUDA_HOME="$TMP/nowhere"
exit_is 1
finding cuda_home problem "does not exist"
grep -q "export CUDA_HOME=$TMP/cuda" "$out" && ok || bad "CUDA_HOME fix names the toolkit on PATH"
doctor no-toolkit CUDA_HOME= PATH="$TMP/bin"
finding cuda_home warning "no CUDA toolkit"
rm "$TMP/cuda/include/cusparse.h"
doctor no-headers
exit_is 1
finding headers problem "cusparse.h"
: > "$TMP/cuda/include/cusparse.h"

# ---- the host compiler ----
fake_host_config 12
ln -s gcc "$TMP/bin/gcc-12"
ln -s gcc "$TMP/bin/g++-12"
doctor gcc-too-new FAKE_GCC_VERSION=14.2.0 FAKE_NVCC_RELEASE=12.1 FAKE_CUDA_DRIVER_VERSION=12080
exit_is 1
finding gcc_vs_nvcc problem "accepts gcc <= 12"
grep -q 'export CC=gcc-12 CXX=g++-12' "$out" && ok || bad "gcc fix names gcc-12"
rm "$TMP/bin/gcc-12" "$TMP/bin/g++-12"
doctor gcc-too-new-no-alt FAKE_GCC_VERSION=14.2.0 FAKE_NVCC_RELEASE=12.1
grep -q 'apt-get install gcc-12 g++-12' "$out" && ok || bad "gcc fix installs gcc-12"
fake_host_config 14
doctor gcc-old FAKE_GCC_VERSION=8.5.0
finding gcc_old problem "too old"

# ---- runtime and resources ----
doctor low-ram FLASHATTN_DOCTOR_MEM_GB=6 FLASHATTN_DOCTOR_NCPU=8
finding max_jobs warning "MAX_JOBS=1 NVCC_THREADS=2"
doctor small FLASHATTN_DOCTOR_MEM_GB=22.5 FLASHATTN_DOCTOR_NCPU=2
finding max_jobs ok "MAX_JOBS=1 NVCC_THREADS=2"
doctor max-jobs-env MAX_JOBS=64
finding max_jobs_env warning "MAX_JOBS=64"
doctor old-glibc FLASHATTN_DOCTOR_GLIBC=2.31
finding glibc warning "GLIBC_2.32"
doctor ancient-glibc FLASHATTN_DOCTOR_GLIBC=2.17
finding glibc warning "2.28"
if [ -n "${FAKE_LIBSTDCXX:-}" ]; then
    doctor libstdcxx
    finding libstdcxx ok "GLIBCXX_3.4"
fi
doctor arch-env TORCH_CUDA_ARCH_LIST=7.0
finding arch_list_env warning "differs"

# ---- Python, torch, flash-attn ----
doctor no-torch FAKE_PY_OUT="$FAKE_PY_DIR/no_torch.txt" FLASHATTN_DOCTOR_MEM_GB=22.5
exit_is 0
finding torch warning "not installed"
finding build_deps warning "packaging ninja psutil einops"
finding flash_attn warning "not installed"
grep -q 'download.pytorch.org/whl/cu128' "$out" && ok || bad "torch install fix"
doctor cpu-torch FAKE_PY_OUT="$FAKE_PY_DIR/cpu_torch.txt"
finding torch_cuda warning "CPU-only"
doctor no-python PATH="$TMP/cuda/bin"
exit_is 0
finding python warning "no python3"
doctor py-broken FAKE_PY_MODE=broken
exit_is 1
finding python problem "libpython3.11.so.1.0"
doctor py-crash FAKE_PY_MODE=crash
exit_is 1
finding python problem "signal 11"
doctor py-garbage FAKE_PY_MODE=garbage
exit_is 1
finding python problem "no answer"
start=$(date +%s)
doctor py-hang FAKE_PY_MODE=hang FLASHATTN_DOCTOR_TIMEOUT=1
end=$(date +%s)
exit_is 1
finding python problem "did not answer"
[ $((end - start)) -lt 15 ] && ok || bad "the hang took $((end - start)) s"
doctor py-explicit FLASHATTN_DOCTOR_PYTHON="$TMP/nope/python9"
finding python problem "not found"
doctor no-python-flag
fake_run "$FA" doctor --no-python --json > "$out"
finding python ok "not checked"

# a C++ ABI mismatch, with the extension's undefined symbols read from a real .so
CXX=$(command -v g++ || command -v c++ || true)
if [ -n "$CXX" ] && echo 'int main(){}' | "$CXX" -x c++ - -o "$TMP/cxx-ok" 2> /dev/null; then
    mkdir -p "$TMP/torch/lib" "$TMP/site"
    cat > "$TMP/c10.cpp" <<'EOF'
#include <string>
namespace c10 { namespace detail {
void torchCheckFail(const char *, const char *, unsigned, const std::string &) {}
} }
EOF
    cat > "$TMP/ext.cpp" <<'EOF'
#include <string>
namespace c10 { namespace detail {
void torchCheckFail(const char *, const char *, unsigned, const std::string &);
} }
extern "C" void ext_entry() { c10::detail::torchCheckFail("f", "file", 1, std::string("x")); }
EOF
    "$CXX" -shared -fPIC -D_GLIBCXX_USE_CXX11_ABI=0 -o "$TMP/torch/lib/libc10.so" "$TMP/c10.cpp" &&
        "$CXX" -shared -fPIC -D_GLIBCXX_USE_CXX11_ABI=1 -o "$TMP/site/flash_attn_2_cuda.cpython-310-x86_64-linux-gnu.so" \
            "$TMP/ext.cpp" -L"$TMP/torch/lib" -lc10 || bad "building the ABI fixtures"
    sed -e "s|@TORCH_LIB@|$TMP/torch/lib|g" -e "s|@EXT_PATH@|$TMP/site/flash_attn_2_cuda.cpython-310-x86_64-linux-gnu.so|g" \
        "$FAKE_PY_DIR/abi_mismatch.txt" > "$FAKE_PY_DIR/abi_mismatch_real.txt"
    doctor abi-mismatch FAKE_PY_OUT="$FAKE_PY_DIR/abi_mismatch_real.txt" FAKE_NVCC_RELEASE=12.1
    exit_is 1
    finding flash_attn problem "import flash_attn fails"
    grep -q 'demangled: c10::detail::torchCheckFail(char const\*, char const\*, unsigned int, std::__cxx11::basic_string' "$out" && ok ||
        bad "the import error's symbol demangled"
    grep -q 'C++ ABI mismatch: the module was built with _GLIBCXX_USE_CXX11_ABI=1, torch with 0' "$out" && ok ||
        bad "the ELF verdict"
    finding abi problem "(1) differs from torch's (0)"
    grep -q 'flash_attn-2.6.3+cu123torch2.4cxx11abiFALSE-cp310-cp310-linux_x86_64.whl\|cxx11abiFALSE' "$out" && ok ||
        bad "the fix names the FALSE wheel"
else
    echo "skipped the ABI scenario: no C++ compiler"
fi

# every output is valid JSON
PY=$(command -v python3 || true)
if [ -n "$PY" ]; then
    scenario=json
    if "$PY" - "$TMP"/*.json <<'EOF'
import json, sys
for path in sys.argv[1:]:
    d = json.load(open(path, encoding="utf-8"))
    assert {"findings", "facts", "summary"} <= set(d), path
    for f in d["findings"]:
        assert f["status"] in ("ok", "warning", "problem"), path
        assert f["mark"] in ("[✓]", "[!]", "[✗]"), path
        assert isinstance(f["evidence"], list), path
        assert f["fix"] is None or isinstance(f["fix"], str), path
    s = d["summary"]
    assert s["problems"] == sum(f["status"] == "problem" for f in d["findings"]), path
print("JSON: %d doctor reports valid" % (len(sys.argv) - 1))
EOF
    then ok; else bad "JSON validation"; fi
fi

echo "test_doctor: $pass passed, $fail failed"
[ $fail -eq 0 ]
