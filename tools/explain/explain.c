/* SPDX-License-Identifier: MIT */
/*
 * tools/explain/ — `flashattn explain`: a build or import log classified and its fix named; the
 * bounded log reader.
 *
 * explain.c — `flashattn explain [LOG|-]`: reads a pip / setup.py / ninja / nvcc build log or a
 * Python import traceback (a file or stdin), finds the first real error (logclass.c decides
 * which line that is), and prints its class, the evidence lines and the fix. `--json` prints
 * {"class": ..., "evidence": [...], "fix": ...}. `--demangle` demangles C++ symbols (arguments
 * or stdin lines) the way the fix texts do. Streams the input: memory stays bounded on any log.
 *
 * Exit status: 0 when the log was read (whatever the class), 1 when it could not be read,
 * 2 for bad usage.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../cli/cli.h"
#include "../cli/json.h"
#include "../cli/textwrap.h"
#include "../elf/demangle.h"
#include "../wheel/releases.h"
#include "logclass.h"
#include "logread.h"

static void explain_usage(FILE *f) {
    fprintf(
        f,
        "usage: flashattn explain [LOG|-] [--json] [--max-line BYTES]\n"
        "       flashattn explain --demangle [SYMBOL...]\n"
        "       flashattn explain --list-classes\n"
        "\n"
        "Finds the first real error in a flash-attn build log (pip, setup.py, ninja, nvcc) or\n"
        "an import traceback, read from LOG or stdin, and prints its class, the evidence and\n"
        "the fix. The noise after the real error (cascading compiler errors, the wheel-404\n"
        "traceback setup.py prints after a failed source build) is ignored.\n"
        "\n"
        "  --json            print {\"class\", \"evidence\", \"fix\"}\n"
        "  --max-line BYTES  keep at most this much of each line (default %d)\n"
        "  --demangle        demangle C++ symbols (from the arguments, else one per stdin line)\n"
        "  --list-classes    print the class names\n",
        LOGR_DEFAULT_MAX_LINE);
}

/* ---- fix texts ------------------------------------------------------------------------------- */

typedef struct fixbuf {
    char *s;
    size_t len, cap;
} fixbuf;

static void fx(fixbuf *b, const char *fmt, ...) {
    va_list ap;
    int n;
    if (b->len >= b->cap)
        return;
    va_start(ap, fmt);
    n = vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    if (n > 0)
        b->len += (size_t)n < b->cap - b->len ? (size_t)n : b->cap - b->len - 1;
}

/* "gcc N" for a GLIBCXX_3.4.M version (the first gcc whose libstdc++ has it). */
static const char *gcc_for_glibcxx(const char *v) {
    static const struct {
        const char *ver, *gcc;
    } map[] = {{"GLIBCXX_3.4.26", "gcc 9"},      {"GLIBCXX_3.4.27", "gcc 9.2"},
               {"GLIBCXX_3.4.28", "gcc 9.3/10"}, {"GLIBCXX_3.4.29", "gcc 11"},
               {"GLIBCXX_3.4.30", "gcc 12"},     {"GLIBCXX_3.4.31", "gcc 13.1"},
               {"GLIBCXX_3.4.32", "gcc 13.2"},   {"GLIBCXX_3.4.33", "gcc 14"},
               {"GLIBCXX_3.4.34", "gcc 15"}};
    size_t i;
    for (i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(v, map[i].ver))
            return map[i].gcc;
    return NULL;
}

/* What flashattn's release table says about the wheel setup.py guessed (its URL's file name):
 * published (then a 404 means the download path is at fault) or not (and why). */
static void guessed_wheel_note(const char *url, fixbuf *b) {
    const char *name = strrchr(url, '/');
    rel_wheel w;
    rel_target t;
    const rel_info *r;
    char err[128], why[512];
    if (rel_parse_wheel(name ? name + 1 : url, &w, err, sizeof err) != 0 || !w.local[0] ||
        !w.cu[0] || !w.torch_mm[0] || strncmp(w.pytag, "cp3", 3) != 0)
        return;
    r = rel_find(w.version);
    if (!r) {
        fx(b, " (flash-attn %s is not in flashattn's release table.)", w.version);
        return;
    }
    memset(&t, 0, sizeof t);
    env_copy(t.pytag, sizeof t.pytag, w.pytag);
    t.py_minor = atoi(w.pytag + 3);
    env_copy(t.torch_mm, sizeof t.torch_mm, w.torch_mm);
    snprintf(t.torch_cuda, sizeof t.torch_cuda, "%d.0", rel_cu_major(w.cu));
    t.abi = w.abi;
    env_copy(t.machine, sizeof t.machine, !strncmp(w.plat, "linux_", 6) ? w.plat + 6 : w.plat);
    if (rel_has_wheel(r, &t, why, sizeof why))
        fx(b,
           " That wheel is part of the %s release, so the 404 points at the download path (a "
           "proxy or mirror without it, or FLASH_ATTN_LOCAL_VERSION changing the name).",
           r->version);
    else
        fx(b, " flash-attn %s published no such wheel: %s.", r->version, why);
}

static const char REBUILD[] =
    "pip uninstall -y flash-attn && pip install flash-attn --no-build-isolation --no-cache-dir";

static void fix_for(const logc_result *r, fixbuf *b) {
    const char *c = r->cls, *rule = r->rule, *d = r->detail;
    const char *sym = r->demangled[0] ? r->demangled : d;

    if (!strcmp(c, "cxx11_abi_mismatch")) {
        int ext = r->ext_abi;
        fx(b,
           "C++ ABI mismatch. The extension was compiled with -D_GLIBCXX_USE_CXX11_ABI=%d: it "
           "needs `%s`, whose std::string is %s. The torch it loads was built with "
           "_GLIBCXX_USE_CXX11_ABI=%d and exports only the %s variant. ",
           ext == 0 ? 0 : 1, sym,
           ext == 0 ? "the old-ABI std::basic_string (mangled Ss)"
                    : "std::__cxx11::basic_string (the new ABI)",
           ext == 0 ? 1 : 0, ext == 0 ? "std::__cxx11::basic_string" : "old-ABI std::basic_string");
        fx(b,
           "Install the release wheel built for torch's ABI (its name says cxx11abi%s; "
           "`flashattn wheel` prints the exact file and URL), or rebuild against this torch, which "
           "takes torch's ABI flag automatically: %s. Check torch's flag with: python -c 'import "
           "torch; print(torch._C._GLIBCXX_USE_CXX11_ABI)' (pip torch >= 2.7 and NGC containers: "
           "True; pip torch <= 2.6: False).",
           ext == 0 ? "TRUE" : "FALSE", REBUILD);
    } else if (!strcmp(c, "torch_version_mismatch")) {
        if (!strcmp(rule, "torch_cpu")) {
            fx(b,
               "This torch is a CPU-only build (torch.version.cuda is None). Install a CUDA "
               "build whose CUDA major your driver supports, e.g. pip install torch "
               "--index-url https://download.pytorch.org/whl/cu128 (`flashattn doctor` shows the "
               "driver's CUDA version).");
        } else if (!strcmp(rule, "libopen")) {
            fx(b,
               "%s is one of torch's own libraries: the extension was built against a torch "
               "that is not the one installed now (or torch was not imported first). "
               "Reinstall flash-attn for the installed torch: %s.",
               d, REBUILD);
        } else {
            fx(b,
               "The extension was compiled against a different PyTorch release than the one "
               "installed: this torch does not export `%s` (its signature changed between "
               "releases). Reinstall flash-attn for this torch: %s; or install the release "
               "wheel `flashattn wheel` names for this torch; or install the torch version the "
               "wheel was built for (its name says torchX.Y).",
               sym, REBUILD);
        }
    } else if (!strcmp(c, "extension_missing")) {
        if (!strcmp(d, "flash_attn") || !strcmp(rule, "hf_none")) {
            fx(b, "flash-attn is not installed in this Python environment. `flashattn wheel` names "
                  "the prebuilt wheel for this machine (pip install that URL); otherwise pip "
                  "install flash-attn --no-build-isolation.");
        } else if (strstr(d, "flash_attn")) {
            fx(b,
               "flash_attn is installed but its compiled extension %s is not: the package was "
               "installed without compiling (FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE, or an sdist "
               "whose wheel download failed), or an earlier build failed. Reinstall: %s.",
               d[0] ? d : "flash_attn_2_cuda", REBUILD);
        } else {
            fx(b,
               "%s is an optional flash-attn extension from csrc/ (layer_norm, rotary, "
               "fused_dense, ...) that release wheels do not contain. Build it from a checkout: "
               "cd flash-attention/csrc/<its folder> && pip install --no-build-isolation . ; or "
               "avoid importing it (the Triton versions in flash_attn.ops.triton need no build).",
               d);
        }
    } else if (!strcmp(c, "torch_missing_at_build")) {
        fx(b, "flash-attn's setup.py imports torch, but torch is not importable where it runs: pip "
              "builds in an isolated environment without it unless told not to. Install torch "
              "first, then build without isolation: pip install torch && pip install flash-attn "
              "--no-build-isolation.");
    } else if (!strcmp(c, "build_deps_missing")) {
        if (!strcmp(d, "Python.h"))
            fx(b, "The Python development headers are missing: apt-get install python3-dev (the "
                  "python3.X-dev of this interpreter; dnf install python3-devel on Fedora/RHEL).");
        else
            fx(b,
               "A build dependency is missing%s%s. With --no-build-isolation they must already be "
               "installed: pip install packaging psutil ninja wheel setuptools einops (check "
               "ninja with: ninja --version).",
               d[0] ? ": " : "", d);
    } else if (!strcmp(c, "cuda_home_missing")) {
        fx(b, "No CUDA toolkit was found: CUDA_HOME is not set and nvcc is not on PATH. Install "
              "the toolkit whose major version equals torch.version.cuda (e.g. apt-get install "
              "cuda-toolkit-12-8, or conda install -c nvidia cuda-toolkit=12.8), then export "
              "CUDA_HOME=/usr/local/cuda-12.8 PATH=/usr/local/cuda-12.8/bin:$PATH. CUDA_HOME is "
              "needed even to reach the prebuilt-wheel download; `flashattn wheel` names the "
              "wheel so you can pip install it directly.");
    } else if (!strcmp(c, "nvcc_missing")) {
        fx(b, "nvcc is not where the build looked for it. Set CUDA_HOME to the directory that "
              "contains bin/nvcc and put it first on PATH: export CUDA_HOME=/usr/local/cuda "
              "PATH=/usr/local/cuda/bin:$PATH (a CUDA_HOME with a stray ':' or one pointing at a "
              "runtime-only install without bin/nvcc gives this error). Check with: "
              "$CUDA_HOME/bin/nvcc --version.");
    } else if (!strcmp(c, "nvcc_too_old")) {
        if (!strcmp(rule, "nvcc_option"))
            fx(b, "This nvcc does not know an option flash-attn passes (--threads needs nvcc >= "
                  "11.2); it is too old. ");
        fx(b,
           "flash-attn needs nvcc >= 11.7 (>= 11.6 for 2.5-2.6)%s%s. Point the build at a newer "
           "toolkit whose major equals torch.version.cuda: export CUDA_HOME=/usr/local/cuda-12.8 "
           "PATH=/usr/local/cuda-12.8/bin:$PATH, then check nvcc --version.",
           r->nvcc_release[0] ? "; the build used nvcc " : "", r->nvcc_release);
    } else if (!strcmp(c, "cuda_version_mismatch")) {
        if (!strcmp(rule, "torch_nvcc")) {
            fx(b,
               "nvcc (CUDA %s) and torch (built with CUDA %s) differ in their major version, and "
               "torch refuses to compile extensions then. Use a toolkit with torch's major: export "
               "CUDA_HOME=/usr/local/cuda-%s PATH=$CUDA_HOME/bin:$PATH; or install the torch "
               "built for your nvcc (pip install torch --index-url "
               "https://download.pytorch.org/whl/cuXYZ).",
               r->cuda_detected[0] ? r->cuda_detected : "?", r->cuda_torch[0] ? r->cuda_torch : "?",
               r->cuda_torch[0] ? r->cuda_torch : "<torch's>");
        } else {
            fx(b,
               "The extension was built for another CUDA major version than the CUDA runtime in "
               "this environment (%s). Install the flash-attn wheel whose name has cu<torch's "
               "CUDA major> (`flashattn wheel`), or rebuild against this torch: %s.",
               d[0] ? d : "see the evidence", REBUILD);
        }
    } else if (!strcmp(c, "missing_cuda_headers")) {
        fx(b,
           "The CUDA toolkit used for the build lacks %s. torch's extension headers include "
           "cuda_runtime.h, cublas_v2.h, cublasLt.h, cusparse.h and cusolverDn.h, so a full "
           "toolkit is needed, not just cuda-nvcc: apt-get install cuda-toolkit-12-8 (or conda "
           "install -c nvidia cuda-toolkit=12.8), then export CUDA_HOME to that install.",
           d[0] ? d : "a header or library");
    } else if (!strcmp(c, "submodule_missing")) {
        fx(b,
           "The CUTLASS submodule (csrc/cutlass) is empty: this checkout was cloned without "
           "--recursive. Run: git submodule update --init --recursive, then rebuild from a clean "
           "tree: rm -rf build dist *.egg-info && pip install --no-build-isolation .");
    } else if (!strcmp(c, "unsupported_arch")) {
        fx(b,
           "The build asked for a GPU architecture this nvcc does not support%s%s. sm_90 needs "
           "nvcc >= 11.8, sm_100/sm_120 need >= 12.8. Ask only for what this nvcc knows and your "
           "GPUs need, e.g. export TORCH_CUDA_ARCH_LIST='8.0;9.0' FLASH_ATTN_CUDA_ARCHS='80;90' "
           "(`flashattn doctor` prints the list for the GPUs present), or install a newer toolkit.",
           d[0] ? " " : "", d);
    } else if (!strcmp(c, "build_oom")) {
        fx(b, "The compiler was killed for lack of memory: each nvcc job of flash-attn needs "
              "several GB (up to ~9 GB with NVCC_THREADS=4) and ninja starts one per core. Limit "
              "the parallelism: MAX_JOBS=2 NVCC_THREADS=2 pip install flash-attn "
              "--no-build-isolation --no-cache-dir (`flashattn doctor` computes MAX_JOBS from this "
              "machine's RAM), build only your GPU's architecture (FLASH_ATTN_CUDA_ARCHS=80), add "
              "swap, or skip compiling with the prebuilt wheel `flashattn wheel` names.");
    } else if (!strcmp(c, "gcc_version")) {
        if (!strcmp(rule, "nvcc_gcc") || !strcmp(rule, "torch_gcc_new")) {
            const char *mx = r->gcc_max[0] ? r->gcc_max : "N";
            fx(b,
               "This nvcc does not accept the default gcc (it supports gcc <= %s). Install a "
               "supported one and use it for the build: apt-get install gcc-%s g++-%s; export "
               "CC=gcc-%s CXX=g++-%s (torch passes $CC to nvcc as -ccbin); or install a newer "
               "CUDA toolkit. (nvcc -allow-unsupported-compiler skips the check at your own "
               "risk.)",
               mx, mx, mx, mx, mx);
        } else if (!strcmp(rule, "gcc_ice")) {
            fx(b,
               "gcc crashed (an internal compiler error) on the code nvcc generated%s%s. Old gcc "
               "releases (7.x, 8.x) crash on flash-attn's templates: build with gcc >= 9 "
               "(apt-get install gcc-11 g++-11; export CC=gcc-11 CXX=g++-11). If the crash names "
               "'Killed' or a signal, it is memory instead: lower MAX_JOBS.",
               r->gcc_ver[0] ? "; the log shows gcc " : "", r->gcc_ver);
        } else if (!strcmp(rule, "gcc11_cuda11")) {
            fx(b,
               "A known incompatibility between CUDA 11.x nvcc and gcc 11's <functional>. Build "
               "with gcc 10 (apt-get install gcc-10 g++-10; export CC=gcc-10 CXX=g++-10) or use a "
               "CUDA 11.8 / 12.x toolkit.");
        } else {
            fx(b, "gcc is too old: torch's headers need C++17 and torch >= 2.1 requires gcc >= 9. "
                  "Install a newer gcc (e.g. gcc-11 from your distribution or conda install -c "
                  "conda-forge gxx=11) and export CC=gcc-11 CXX=g++-11.");
        }
    } else if (!strcmp(c, "msvc")) {
        if (!strcmp(rule, "cl_missing"))
            fx(b, "cl.exe, the MSVC compiler, is not on PATH: run the build from an 'x64 Native "
                  "Tools Command Prompt for VS 2022' (or call vcvars64.bat first). ");
        fx(b, "A Windows/MSVC build problem. flash-attn publishes no official Windows wheels; a "
              "source build needs Visual Studio 2022 Build Tools with the C++ workload, the CUDA "
              "toolkit, and DISTUTILS_USE_SDK=1 in an 'x64 Native Tools' prompt, and takes hours. "
              "Alternatives: WSL2 with the Linux wheel (`flashattn wheel` inside WSL), or "
              "flashattn, which builds with any C compiler.");
    } else if (!strcmp(c, "no_kernel_image")) {
        if (!strcmp(rule, "torch_sm"))
            fx(b,
               "This torch was not compiled for your GPU's architecture. Install a torch "
               "built for it; Blackwell (sm_100/sm_120) needs torch built with CUDA >= 12.8: pip "
               "install torch --index-url https://download.pytorch.org/whl/cu128. ");
        fx(b, "The binary contains no code for this GPU's architecture. flash-attn release wheels "
              "up to 2.7.4.post1 have sm_80/sm_90 only (sm_86/89 run the sm_80 code); Blackwell "
              "(sm_100/sm_120) needs flash-attn >= 2.8.0 wheels and a torch built with CUDA >= "
              "12.8. When building yourself include your architecture, e.g. "
              "FLASH_ATTN_CUDA_ARCHS=120 (`flashattn doctor` shows the GPUs' compute capability).");
    } else if (!strcmp(c, "gpu_unsupported")) {
        fx(b, "flash-attn 2 runs only on GPUs of compute capability >= 8.0 (Ampere, Ada, Hopper, "
              "Blackwell). On this GPU use PyTorch's scaled_dot_product_attention "
              "(attn_implementation='sdpa' in transformers), flash-attn 1.x on Turing, or "
              "flashattn on the CPU.");
    } else if (!strcmp(c, "driver_too_old")) {
        if (!strcmp(rule, "no_driver") || !strcmp(rule, "libopen"))
            fx(b, "No NVIDIA driver or GPU is visible here (no driver installed, or a container "
                  "started without --gpus all). Check with nvidia-smi; in Docker use --gpus all. "
                  "flashattn runs on the CPU without one.");
        else if (!strcmp(rule, "fatbin"))
            fx(b, "flash-attn 2.8.1's wheels were built with compressed fatbins that drivers older "
                  "than 550 cannot load. Upgrade the driver to >= 550, or install flash-attn 2.8.2 "
                  "or 2.8.0.post2.");
        else
            fx(b, "The NVIDIA driver is older than the CUDA version the code was built for (a "
                  "CUDA 12.x runtime needs driver >= 525, CUDA 13 needs >= 580; PTX from a newer "
                  "nvcc than the driver cannot be JIT-compiled). Upgrade the driver, or install "
                  "torch and flash-attn built for the CUDA version the driver supports "
                  "(`flashattn doctor` shows it).");
    } else if (!strcmp(c, "glibc_too_old")) {
        fx(b,
           "The binary needs %s but this system's glibc is older (check: ldd --version). "
           "flash-attn 2.8.x release wheels are built on Ubuntu 22.04 and need GLIBC_2.32; "
           "Ubuntu 20.04 and RHEL/Rocky 8 have older ones. Install flash-attn 2.7.4.post1 (built "
           "on Ubuntu 20.04), build from source on this machine (`flashattn wheel "
           "--build-script`), or use a newer distribution or container.",
           d[0] ? d : "a newer glibc");
    } else if (!strcmp(c, "glibcxx_too_old")) {
        const char *g = gcc_for_glibcxx(d);
        fx(b,
           "The libstdc++ that gets loaded lacks %s%s%s%s: an older libstdc++ (often a conda "
           "environment's) shadows the one the binary was built against. Update it: conda install "
           "-c conda-forge 'libstdcxx-ng>=13' (or the system's libstdc++6), or preload the "
           "system one: LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libstdc++.so.6. `flashattn doctor` "
           "prints the highest GLIBCXX of each libstdc++ it finds.",
           d[0] ? d : "a symbol version", g ? " (from " : "", g ? g : "", g ? ")" : "");
    } else if (!strcmp(c, "wheel_not_found")) {
        if (!strcmp(rule, "bad_wheel"))
            fx(b, "pip rejected the wheel's tags: its cpXY tag or platform does not match this "
                  "interpreter. `flashattn wheel --check FILE.whl` lists every mismatch and "
                  "`flashattn wheel` names the right file.");
        else if (!strcmp(rule, "url_404"))
            fx(b,
               "That wheel URL does not exist: flash-attn publishes wheels only for some "
               "combinations of Python, torch, CUDA and C++ ABI. `flashattn wheel` names one that "
               "exists for this machine.");
        else {
            fx(b,
               "setup.py looked for a prebuilt wheel%s%s and got HTTP 404, so pip compiles from "
               "source (hours).",
               r->wheel_url[0] ? " at " : "", r->wheel_url);
            if (r->wheel_url[0])
                guessed_wheel_note(r->wheel_url, b);
            fx(b, " `flashattn wheel` names the newest release with a wheel for this machine, or "
                  "the torch version to use instead.");
        }
    } else if (!strcmp(c, "wheel_download_failed")) {
        fx(b,
           "The wheel download failed for network reasons (offline, DNS, proxy or TLS)%s%s, so "
           "setup.py fell back to a long source build. Download the wheel where there is network "
           "(`flashattn wheel` prints its URL) and pip install the file; behind a proxy export "
           "https_proxy=http://HOST:PORT first.",
           r->wheel_url[0] ? ": " : "", r->wheel_url);
    } else if (!strcmp(c, "triton_mismatch")) {
        if (!strcmp(rule, "wrap_triton"))
            fx(b, "flash-attn 2.8's Triton kernels call torch.library.wrap_triton, which exists "
                  "only in torch >= 2.6 (2.8 wheels are also published for torch 2.4/2.5). Upgrade "
                  "torch (pip install 'torch>=2.6') or use flash-attn 2.7.4.post1.");
        else
            fx(b, "The installed triton does not match this torch. Reinstall the version torch "
                  "pins: python -c \"import importlib.metadata as m; print([r for r in "
                  "m.requires('torch') if r.startswith('triton')])\" then pip install "
                  "--force-reinstall 'triton==<that version>'.");
    } else if (!strcmp(c, "version_pin")) {
        if (!strcmp(rule, "no_version") || !strcmp(rule, "python_range"))
            fx(b, "No flash-attn release satisfies the requested version for this Python: check "
                  "that the version exists and that this Python is within its python_requires "
                  "(>= 3.9 from 2.7.1.post2; the 2.8.x wheels cover 3.9-3.13). Pin an existing "
                  "release, e.g. flash-attn==2.8.3.");
        else if (!strcmp(rule, "pkg_pin"))
            fx(b, "The installed flash-attn works; another package refuses its version at import "
                  "(see the evidence for the range it accepts). Install a flash-attn inside that "
                  "range (pip install 'flash-attn==X' --no-build-isolation, or its wheel from "
                  "`flashattn wheel --version X`), or upgrade the package that pins it.");
        else if (!strcmp(d, "flash_attn.flash_attention"))
            fx(b, "The code imports flash_attn.flash_attention, a flash-attn 1.x module that 2.x "
                  "removed: install flash-attn 1.x for it (pip install 'flash-attn<2') or port "
                  "the code to flash_attn.modules.mha / flash_attn_func.");
        else if (!strcmp(rule, "hf_min"))
            fx(b, "transformers needs a newer flash-attn than the one installed: pip install -U "
                  "flash-attn --no-build-isolation (or the wheel `flashattn wheel` names).");
        else
            fx(b, "Another package pins a different flash-attn (or torch) version than the one "
                  "being installed (see the evidence). Install the versions it requires, or "
                  "install flash-attn last with --no-deps after checking its torch requirement.");
    } else if (!strcmp(c, "windows_long_path")) {
        fx(b,
           "pip could not write a file of the flash-attn source tree: its path is %s characters, "
           "past Windows' 260-character limit. Enable long paths (as administrator: reg add "
           "HKLM\\SYSTEM\\CurrentControlSet\\Control\\FileSystem /v LongPathsEnabled /t "
           "REG_DWORD /d 1 /f, then open a new prompt), or build from a short directory "
           "(set TMP=C:\\t and TEMP=C:\\t). flash-attn publishes no Windows wheels; WSL2 "
           "with the Linux wheel avoids the build.",
           d[0] ? d : "over 250");
    } else if (r->tier == 0) {
        fx(b,
           "No error found in %llu lines. If the problem is at run time, run `flashattn "
           "doctor` to check the environment.",
           (unsigned long long)r->lines);
    } else {
        fx(b, "Not an error flashattn recognizes; the evidence is the first error in the log. "
              "Run `flashattn doctor` to check the environment (driver, nvcc, gcc, torch, C++ "
              "ABI, RAM).");
    }
    /* what happened before the error */
    if (strncmp(c, "wheel_", 6) != 0 && r->tier > 0) {
        if (r->saw_wheel_404) {
            fx(b,
               " Note: before this, setup.py's prebuilt-wheel download got HTTP 404%s%s, so it "
               "compiled from source; `flashattn wheel` names a wheel that exists.",
               r->wheel_url[0] ? " for " : "", r->wheel_url);
            if (r->wheel_url[0])
                guessed_wheel_note(r->wheel_url, b);
        } else if (r->saw_url_error)
            fx(b, " Note: before this, setup.py could not download the prebuilt wheel (network "
                  "error), so it compiled from source.");
    }
}

/* ---- output ---------------------------------------------------------------------------------- */

static void print_text(const char *src, const logc_result *r, const char *fix) {
    int i;
    printf("flashattn explain: %s (%llu lines, %llu bytes%s)\n", src, (unsigned long long)r->lines,
           (unsigned long long)r->bytes, r->truncated_lines ? ", long lines cut" : "");
    printf("class:    %s\n", r->cls);
    printf("language: %s\n", r->lang[0] ? r->lang : "en");
    if (r->n_evidence) {
        printf("line:     %llu\n", (unsigned long long)r->line_no);
        printf("evidence:\n");
        for (i = 0; i < r->n_evidence; i++)
            printf("  %s\n", r->evidence[i]);
        if (r->english[0])
            printf("  (in English: %s)\n", r->english);
    }
    if (r->demangled[0])
        printf("symbol:   %s\n", r->demangled);
    wrap_print(stdout, "fix:      ", "          ", fix, 100);
}

static void print_json(const logc_result *r, const char *fix) {
    int i;
    printf("{\"class\": ");
    json_string(stdout, r->cls);
    printf(", \"language\": ");
    json_string(stdout, r->lang[0] ? r->lang : "en");
    printf(", \"evidence\": [");
    for (i = 0; i < r->n_evidence; i++) {
        if (i)
            printf(", ");
        json_string(stdout, r->evidence[i]);
    }
    printf("], \"evidence_english\": ");
    if (r->english[0])
        json_string(stdout, r->english);
    else
        printf("null");
    printf(", \"fix\": ");
    json_string(stdout, fix);
    printf("}\n");
}

static int demangle_one(const char *s) {
    unsigned flags = 0;
    char *d;
    size_t n = strlen(s);
    while (n && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' '))
        n--;
    d = dmg_demangle_n(s, n, &flags);
    if (d) {
        printf("%s\n", d);
        free(d);
        return 0;
    }
    printf("%.*s\n", (int)n, s);
    return 1;
}

/* Prints each name demangled, or as it is when it does not demangle; without a demangler says
 * so once on stderr (exit status 0 either way: the names are printed). */
static int run_demangle(int argc, char **argv, int first) {
    int i, any = 0;
    const char *why = dmg_unavailable();
    if (why)
        fprintf(stderr,
                "flashattn: no C++ demangler could be loaded (%s): names are printed as they "
                "are; `c++filt` demangles them\n",
                why);
    for (i = first; i < argc; i++) {
        demangle_one(argv[i]);
        any = 1;
    }
    if (!any) {
        logr rd;
        const char *line;
        size_t len;
        if (logr_init_fd(&rd, 0, 65536) != 0)
            return 1;
        while (logr_next(&rd, &line, &len))
            demangle_one(line);
        logr_free(&rd);
    }
    return 0;
}

int cmd_explain(int argc, char **argv) {
    const char *path = NULL;
    int json = 0, i, fd, rc;
    long max_line = LOGR_DEFAULT_MAX_LINE;
    logc_result *r;
    char fix[4096];
    fixbuf fb;

    for (i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            explain_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (!strcmp(argv[i], "--demangle")) {
            return run_demangle(argc, argv, i + 1);
        } else if (!strcmp(argv[i], "--list-classes")) {
            int k;
            for (k = 0; logc_class_names[k]; k++)
                printf("%s\n", logc_class_names[k]);
            return 0;
        } else if (cli_opt_value(argc, argv, &i, "--max-line", &v)) {
            if (cli_parse_long(v, 80, 1 << 20, &max_line) != 0) {
                fprintf(stderr, "flashattn explain: --max-line wants 80..1048576\n");
                return 2;
            }
        } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
            fprintf(stderr, "flashattn explain: unknown option '%s'\n\n", argv[i]);
            explain_usage(stderr);
            return 2;
        } else if (!path) {
            path = argv[i];
        } else {
            fprintf(stderr, "flashattn explain: one log at a time ('%s' and '%s')\n", path,
                    argv[i]);
            return 2;
        }
    }
    if (!path || !strcmp(path, "-")) {
        fd = 0;
        path = "<stdin>";
    } else {
        fd = open(path, O_RDONLY);
        if (fd < 0) {
            fprintf(stderr, "flashattn explain: %s: %s\n", path, strerror(errno));
            return 1;
        }
    }
    r = malloc(sizeof *r);
    if (!r) {
        if (fd > 0)
            close(fd);
        fprintf(stderr, "flashattn explain: out of memory\n");
        return 1;
    }
    rc = logc_classify_fd(fd, (size_t)max_line, r);
    if (fd > 0)
        close(fd);
    if (rc != 0) {
        fprintf(stderr, "flashattn explain: %s: read error\n", path);
        free(r);
        return 1;
    }
    fb.s = fix;
    fb.len = 0;
    fb.cap = sizeof fix;
    fix[0] = '\0';
    fix_for(r, &fb);
    if (json)
        print_json(r, fix);
    else
        print_text(path, r, fix);
    free(r);
    return 0;
}
