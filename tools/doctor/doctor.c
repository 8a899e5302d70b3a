/* SPDX-License-Identifier: MIT */
/*
 * tools/doctor/ — the install doctor: `flashattn doctor`, its findings and the extension-module
 * check.
 *
 * doctor.c — `flashattn doctor`: the checks people do by hand when flash-attn will not install
 * or import, as one command, with no network access. It probes the machine (envprobe.h), turns
 * the facts into findings — each with a mark, its evidence and the exact command that fixes it
 * — and prints them as text or JSON. Exit status 1 when a problem ([✗]) was found.
 *
 * Sections: flashattn itself; CPU; NVIDIA driver and GPUs; CUDA toolkit; host compiler; C and
 * C++ runtime; build resources (MAX_JOBS, arch lists); Python; PyTorch; flash-attn (import, and
 * when its extension does not load, its undefined symbols read from the ELF file, demangled).
 *
 * `flashattn doctor --so FILE` runs only the extension check on any module.
 */
#define _GNU_SOURCE /* dladdr */

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../cli/cli.h"
#include "../cli/json.h"
#include "../elf/demangle.h"
#include "../explain/logread.h"
#include "../probe/envprobe.h"
#include "../probe/verutil.h"
#include "../wheel/releases.h"
#include "extcheck.h"
#include "findings.h"
#include "flashattn.h"

#define S_FLASHATTN "flashattn"
#define S_CPU "CPU"
#define S_DRIVER "NVIDIA driver and GPUs"
#define S_TOOLKIT "CUDA toolkit"
#define S_COMPILER "Host compiler"
#define S_RUNTIME "C and C++ runtime"
#define S_BUILD "Build resources"
#define S_PYTHON "Python"
#define S_TORCH "PyTorch"
#define S_FA "flash-attn"

#define DOCTOR_MAX_LIBDIRS 8

static void doctor_usage(FILE *f) {
    fprintf(f,
            "usage: flashattn doctor [--json] [--verbose] [--python PATH | --no-python]\n"
            "                        [--timeout SECONDS]\n"
            "       flashattn doctor --so MODULE.so [--lib-dir DIR]... [--json]\n"
            "\n"
            "Checks this machine for what installing and importing flash-attn (and running\n"
            "flashattn) needs: flashattn's own build, CPU features, the NVIDIA driver and GPUs\n"
            "(through the driver library, loaded at run time), the CUDA toolkit, gcc, glibc and\n"
            "libstdc++, RAM and cores (-> MAX_JOBS), TORCH_CUDA_ARCH_LIST, Python, PyTorch and an\n"
            "installed flash_attn. Every finding has a mark ([✓] ok, [!] warning, [✗] problem),\n"
            "its evidence and the command that fixes it. No network access.\n"
            "\n"
            "  --json            machine-readable output (findings, facts, summary)\n"
            "  --verbose         all evidence lines\n"
            "  --python PATH     the interpreter to check (default: python3, then python)\n"
            "  --no-python       skip Python, PyTorch and flash-attn\n"
            "  --timeout S       seconds Python may take to import torch (default 60)\n"
            "  --so MODULE.so    only check an extension module: its C++ ABI, needed libraries\n"
            "                    and the undefined symbols none of them defines (demangled)\n"
            "  --lib-dir DIR     where --so looks for libraries first (torch/lib)\n"
            "\n"
            "Exit status: 0 no problem (warnings allowed), 1 a problem was found, 2 bad usage.\n");
}

/* ---- small helpers --------------------------------------------------------------------------- */

static int tool_ok(const env_tool *t) { return t->found && t->ran; }

/* The nvcc a build would use: the toolkit's (CUDA_HOME) if present, else the one on PATH. */
static const env_tool *build_nvcc(const fa_env *e) {
    if (tool_ok(&e->cuda.home_nvcc))
        return &e->cuda.home_nvcc;
    if (tool_ok(&e->cuda.nvcc))
        return &e->cuda.nvcc;
    return NULL;
}

/* The pip index for a torch that this driver can run. */
static const char *torch_index_for_driver(int driver_cuda) {
    if (driver_cuda >= 12080)
        return "https://download.pytorch.org/whl/cu128";
    if (driver_cuda >= 12060)
        return "https://download.pytorch.org/whl/cu126";
    if (driver_cuda >= 12040)
        return "https://download.pytorch.org/whl/cu124";
    if (driver_cuda >= 11080)
        return "https://download.pytorch.org/whl/cu118";
    if (driver_cuda > 0)
        return "https://download.pytorch.org/whl/cu118 (after a driver upgrade)";
    return "https://download.pytorch.org/whl/cu128";
}

/* The oldest Linux driver branch for a CUDA major (NVIDIA's compatibility table). */
static const char *driver_for_cuda(int major) {
    return major >= 13 ? "580" : major == 12 ? "525.60.13" : major == 11 ? "450.80.02" : "?";
}

static int gcc_version_ok_for(int gcc_major, int max) { return max <= 0 || gcc_major <= max; }

/* ---- flashattn ------------------------------------------------------------------------------- */

static void check_flashattn(findings *f, const fa_env *e) {
    const char *info = fa_build_info();
    const char *inuse = strstr(info, "in use: ");
    const char *cuda = strstr(info, "cuda: ");
    char isa[64] = "?", cudastate[128] = "", libdir[ENV_PATH_LEN] = "", plugin[ENV_PATH_LEN + 32];
    finding *x;
    Dl_info dl;
    void *sym;
    struct stat st;
    int have_plugin = 0;

    x = find_add(f, S_FLASHATTN, "library",
                 fa_version() == (unsigned)FA_VERSION_HEX ? FIND_OK : FIND_WARN,
                 "library %s (header %d.%d.%d)", fa_version_string(), FA_VERSION_MAJOR,
                 FA_VERSION_MINOR, FA_VERSION_PATCH);
    find_evidence(x, "build: %s", info);
    if (x && x->status != FIND_OK)
        find_fix(x, "rebuild the tool and the library together: make && make install");

    if (inuse)
        snprintf(isa, sizeof isa, "%.*s", (int)strcspn(inuse + 8, ";"), inuse + 8);
    if (cuda)
        snprintf(cudastate, sizeof cudastate, "%.*s", (int)strcspn(cuda + 6, ";"), cuda + 6);
    x = find_add(f, S_FLASHATTN, "isa", FIND_OK, "CPU kernels in use: %s", isa);
    if (e->cpu.simd[0])
        find_evidence(x, "this CPU has: %s", e->cpu.simd);
    find_evidence(x, "FA_CPU_ISA=ref|avx2|avx512|avx512bf16|neon|refbf16 overrides the choice");

    {
        unsigned (*fn)(void) = fa_version;
        memcpy(&sym, &fn, sizeof sym);
    }
    if (dladdr(sym, &dl) && dl.dli_fname) {
        const char *slash = strrchr(dl.dli_fname, '/');
        if (slash)
            snprintf(libdir, sizeof libdir, "%.*s", (int)(slash - dl.dli_fname), dl.dli_fname);
    }
    /* the file the library loads: FA_CUDA_PLUGIN's, else the one next to it */
    const char *env_plugin = getenv("FA_CUDA_PLUGIN");
    if (env_plugin && *env_plugin) {
        snprintf(plugin, sizeof plugin, "%s", env_plugin);
        have_plugin = stat(plugin, &st) == 0;
    } else if (libdir[0]) {
        snprintf(plugin, sizeof plugin, "%s/libflashattn_cuda.so", libdir);
        have_plugin = stat(plugin, &st) == 0;
    }
    if (have_plugin) {
        int32_t ndev = 0;
        const int usable = fa_device_count(FA_DEVICE_CUDA, &ndev) == FA_OK;
        x = find_add(f, S_FLASHATTN, "cuda_plugin", usable || !e->drv.ngpus ? FIND_OK : FIND_WARN,
                     "CUDA plug-in found: %s%s", plugin,
                     env_plugin && *env_plugin ? " (FA_CUDA_PLUGIN)" : "");
        if (usable)
            find_evidence(x, "it loads and sees %d CUDA device%s", (int)ndev, ndev == 1 ? "" : "s");
        else
            find_evidence(x, "it cannot be used: %s", fa_last_error_message());
        for (int32_t d = 0; usable && d < ndev; d++) {
            char line[1024];
            if (fa_device_describe(FA_DEVICE_CUDA, d, line, sizeof line) == FA_OK)
                find_evidence(x, "cuda:%d: %s", (int)d, line);
            else
                find_evidence(x, "cuda:%d: %s", (int)d, fa_last_error_message());
        }
    } else {
        int gpus = e->drv.ngpus > 0;
        x = find_add(f, S_FLASHATTN, "cuda_plugin", gpus ? FIND_WARN : FIND_OK,
                     "CUDA plug-in: not found%s", gpus ? "" : " (not needed: no GPU here)");
        if (env_plugin && *env_plugin)
            find_evidence(x,
                          "why: the library reports \"cuda: %s\" and FA_CUDA_PLUGIN's %s is "
                          "not there",
                          cudastate[0] ? cudastate : "?", env_plugin);
        else
            find_evidence(x, "why: the library reports \"cuda: %s\"%s%s",
                          cudastate[0] ? cudastate : "?",
                          libdir[0] ? " and there is no libflashattn_cuda.so in " : "", libdir);
        find_evidence(x, "the CPU backend runs every feature; the plug-in is loaded only when a "
                         "GPU tensor arrives");
        if (gpus)
            find_fix(x, "build the plug-in with nvcc present (cmake -DFA_CUDA=ON, or pip install . "
                        "-C cmake.define.FA_CUDA=ON) and keep libflashattn_cuda.so next to "
                        "libflashattn.so, or point FA_CUDA_PLUGIN at it; until then flashattn "
                        "runs on the CPU");
    }
}

/* ---- CPU ------------------------------------------------------------------------------------- */

static void check_cpu(findings *f, const fa_env *e) {
    finding *x = find_add(f, S_CPU, "cpu", FIND_OK, "%s, %d CPU%s (%s)",
                          e->cpu.model[0] ? e->cpu.model : "unknown model", e->cpu.ncpu,
                          e->cpu.ncpu == 1 ? "" : "s", e->cpu.arch[0] ? e->cpu.arch : "?");
    find_evidence(x, "SIMD: %s", e->cpu.simd[0] ? e->cpu.simd : "unknown (no /proc/cpuinfo)");
}

/* ---- driver and GPUs ------------------------------------------------------------------------- */

/* What flashattn's CUDA plug-in runs on a GPU of compute capability cc (major cc_major) in its
 * default build (cuda/plugin.cu chooses the same way), from cc alone: the plug-in need not be
 * built here. With the nvcc a build would use when it cannot compile for the GPU. */
static void flashattn_on_gpu(finding *x, const fa_env *e, int cc_major, int cc) {
    if (cc >= 80) {
        char code[80]; /* sm_86/89 run sm_80's code, sm_121 sm_120's: the same major version */
        if (cc == 80 || cc == 90 || cc == 120)
            snprintf(code, sizeof code, "machine code in the default build");
        else if (cc_major == 8 || cc_major == 9 || cc_major == 12)
            snprintf(code, sizeof code, "runs the default build's sm_%d0 code", cc_major);
        else
            snprintf(code, sizeof code, "the driver compiles the default build's sm_80 PTX");
        find_evidence(x,
                      "flashattn's CUDA plug-in: tensor-core kernels for fp16 and bf16 "
                      "(mma.sync m16n8k16), fp32 on CUDA cores; %s",
                      code);
    } else if (cc >= 75) {
        find_evidence(x, "flashattn's CUDA plug-in: Turing tensor-core kernels for fp16 (mma.sync "
                         "m16n8k8), bf16 and fp32 on CUDA cores; machine code in the default "
                         "build");
    } else if (cc >= 70) {
        find_evidence(x, "flashattn's CUDA plug-in: only when built with a CUDA 12 toolkit (CUDA "
                         "13 dropped sm_70), then CUDA-core kernels (fp32 arithmetic) for every "
                         "dtype, no tensor cores; a plug-in built with CUDA 13 refuses every call "
                         "here");
        const env_tool *nvcc = build_nvcc(e);
        if (nvcc && nvcc->major >= 13)
            find_evidence(x,
                          "this machine's nvcc is CUDA %s: it cannot build the plug-in for "
                          "sm_%d",
                          nvcc->version, cc);
    } else {
        find_evidence(x,
                      "flashattn's CUDA plug-in does not support sm_%d (it needs sm_70 or "
                      "newer); flashattn runs on the CPU",
                      cc);
    }
}

static void check_driver(findings *f, const fa_env *e) {
    const env_driver *d = &e->drv;
    char cv[16];
    finding *x;
    int i;
    env_cuda_version_str(d->cuda_version, cv, sizeof cv);
    if (!d->found) {
        x = find_add(f, S_DRIVER, "driver", FIND_WARN, "no NVIDIA driver: %s could not be loaded",
                     d->lib);
        find_evidence(x, "dlopen: %s", d->error);
        find_evidence(x,
                      "flash-attn needs an NVIDIA GPU and its driver; flashattn runs on this CPU "
                      "without one");
        find_fix(x, "install the NVIDIA driver (Ubuntu: sudo ubuntu-drivers install; others: "
                    "https://www.nvidia.com/drivers) and check with nvidia-smi; in a container "
                    "start it with --gpus all");
        return;
    }
    if (d->init_rc == 34) {
        x = find_add(f, S_DRIVER, "driver", FIND_PROBLEM,
                     "the CUDA toolkit's stub libcuda is loaded instead of the driver");
        find_evidence(x, "library: %s", d->lib);
        find_evidence(x, "cuInit: %s (%d)", d->init_name, d->init_rc);
        find_fix(x, "remove the toolkit's lib64/stubs directory from LD_LIBRARY_PATH (the stub "
                    "is for linking only)");
        return;
    }
    if (d->init_rc == 100) {
        x = find_add(f, S_DRIVER, "driver", FIND_WARN,
                     "NVIDIA driver %s (CUDA %s) found, but no GPU is visible",
                     d->version[0] ? d->version : "", cv);
        find_evidence(x, "library: %s", d->lib);
        find_evidence(x, "cuInit: %s (%d)", d->init_name, d->init_rc);
        find_fix(x,
                 "check nvidia-smi and CUDA_VISIBLE_DEVICES (currently %s); in a container "
                 "start it with --gpus all",
                 getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "unset");
        return;
    }
    if (d->init_rc != 0) {
        x = find_add(f, S_DRIVER, "driver", FIND_PROBLEM,
                     "NVIDIA driver found but cuInit failed: %s (%d)", d->init_name, d->init_rc);
        find_evidence(x, "library: %s, driver CUDA version %s", d->lib, cv);
        if (d->init_rc == 803)
            find_fix(x, "the kernel module and the user-space driver differ (typically after a "
                        "driver upgrade): reboot, or reload the nvidia kernel modules; nvidia-smi "
                        "then shows one version");
        else if (d->init_rc == 804)
            find_fix(x, "a cuda-compat (forward compatibility) library is loaded on a GPU that "
                        "does not support it: remove it from LD_LIBRARY_PATH");
        else if (d->init_rc == 35)
            find_fix(x, "the driver is older than this libcuda expects: reinstall or upgrade the "
                        "NVIDIA driver");
        else
            find_fix(x, "run nvidia-smi and check dmesg for NVRM errors; reinstall the driver if "
                        "nvidia-smi fails too");
        return;
    }
    x = find_add(f, S_DRIVER, "driver", FIND_OK, "NVIDIA driver %s%ssupports CUDA %s, %d GPU%s",
                 d->version, d->version[0] ? ", " : "", cv, d->ngpus, d->ngpus == 1 ? "" : "s");
    find_evidence(x, "library: %s", d->lib);
    for (i = 0; i < d->ngpus; i++) {
        const env_gpu *g = &d->gpus[i];
        int cc = g->cc_major * 10 + g->cc_minor;
        x = find_add(f, S_DRIVER, "gpu", cc >= 80 ? FIND_OK : FIND_PROBLEM,
                     "GPU %d: %s, compute capability %d.%d (sm_%d), %.0f GB", i, g->name,
                     g->cc_major, g->cc_minor, cc, g->mem_gb);
        if (cc < 80)
            find_evidence(x, "flash-attn 2 runs only on sm_80 and newer (Ampere, Ada, Hopper, "
                             "Blackwell): its import works but every call fails with "
                             "\"FlashAttention only supports Ampere GPUs or newer\"");
        flashattn_on_gpu(x, e, g->cc_major, cc);
        if (cc >= 75 && cc < 80)
            find_fix(x, "use PyTorch's scaled_dot_product_attention (attn_implementation='sdpa' in "
                        "transformers), flash-attn 1.x, or flashattn's CUDA plug-in (fp16 on "
                        "this GPU's tensor cores)");
        else if (cc >= 70 && cc < 75)
            find_fix(x, "use PyTorch's scaled_dot_product_attention (attn_implementation='sdpa' in "
                        "transformers), or flashattn's CUDA plug-in built with a CUDA 12 toolkit "
                        "(cmake -DFA_CUDA=ON -DFA_CUDA_ARCHS='70;80')");
        else if (cc < 70)
            find_fix(x, "use PyTorch's scaled_dot_product_attention (attn_implementation='sdpa' in "
                        "transformers), or flashattn on the CPU");
        else if (g->cc_major >= 10) {
            find_evidence(x, "Blackwell: needs flash-attn >= 2.8.0 wheels (sm_100/sm_120 code) and "
                             "a torch built with CUDA >= 12.8");
        } else if (cc == 86 || cc == 89) {
            find_evidence(x, "runs flash-attn's sm_80 code");
        }
    }
}

/* ---- CUDA toolkit ---------------------------------------------------------------------------- */

static void check_toolkit(findings *f, const fa_env *e) {
    const env_cuda *c = &e->cuda;
    const env_tool *nv = build_nvcc(e);
    finding *x;

    if (c->cuda_home_env[0] && !c->home_exists) {
        x = find_add(f, S_TOOLKIT, "cuda_home", FIND_PROBLEM, "CUDA_HOME=%s does not exist",
                     c->cuda_home_env);
        if (c->nvcc.found) {
            char dir[ENV_PATH_LEN];
            env_copy(dir, sizeof dir, c->nvcc.path);
            if (strrchr(dir, '/'))
                *strrchr(dir, '/') = '\0';
            if (strrchr(dir, '/'))
                *strrchr(dir, '/') = '\0';
            find_fix(x, "export CUDA_HOME=%s", dir);
        } else {
            find_fix(x, "export CUDA_HOME=<the directory that contains bin/nvcc>, e.g. "
                        "/usr/local/cuda-12.8");
        }
    } else if (!c->home[0]) {
        x = find_add(f, S_TOOLKIT, "cuda_home", FIND_WARN,
                     "no CUDA toolkit: CUDA_HOME unset, no nvcc on PATH, no /usr/local/cuda");
        find_evidence(x, "needed only to build flash-attn from source (and for setup.py to reach "
                         "its prebuilt-wheel download)");
        find_fix(x,
                 "install the toolkit whose major version equals torch.version.cuda (e.g. "
                 "apt-get install cuda-toolkit-12-8), then export CUDA_HOME=/usr/local/cuda-12.8 "
                 "PATH=/usr/local/cuda-12.8/bin:$PATH");
    } else if (!c->home_nvcc.found) {
        x = find_add(f, S_TOOLKIT, "cuda_home", FIND_PROBLEM, "%s (from %s) has no bin/nvcc",
                     c->home, c->home_source);
        find_evidence(x, "a runtime-only CUDA install, or CUDA_HOME pointing at the wrong level");
        find_fix(x, "export CUDA_HOME=<the directory that contains bin/nvcc>");
    } else {
        x = find_add(f, S_TOOLKIT, "cuda_home", FIND_OK, "toolkit %s (from %s)", c->home,
                     c->home_source);
        if (!c->cuda_home_env[0])
            find_evidence(x, "CUDA_HOME is not set; torch's cpp_extension will use this one");
    }

    if (c->nvcc.found && c->nvcc.ran) {
        x = find_add(f, S_TOOLKIT, "nvcc", FIND_OK, "nvcc %s on PATH: %s", c->nvcc.version,
                     c->nvcc.path);
        find_evidence(x, "%s", c->nvcc.line);
    } else if (c->nvcc.found) {
        x = find_add(f, S_TOOLKIT, "nvcc", FIND_PROBLEM, "nvcc on PATH does not run: %s",
                     c->nvcc.path);
        find_evidence(x, "%s", c->nvcc.error);
        find_fix(x, "reinstall the CUDA toolkit, or put a working one first on PATH");
    } else if (c->home_nvcc.found) {
        x = find_add(f, S_TOOLKIT, "nvcc", FIND_WARN, "nvcc is not on PATH (the build uses %s)",
                     c->home_nvcc.path);
        find_fix(x, "export PATH=%s/bin:$PATH", c->home);
    }
    if (tool_ok(&c->nvcc) && tool_ok(&c->home_nvcc) && strcmp(c->nvcc.path, c->home_nvcc.path) &&
        strcmp(c->nvcc.version, c->home_nvcc.version)) {
        x = find_add(f, S_TOOLKIT, "two_toolkits", FIND_WARN,
                     "two toolkits: nvcc %s on PATH, nvcc %s in %s (the build uses the latter)",
                     c->nvcc.version, c->home_nvcc.version, c->home);
        find_fix(x, "use one: export CUDA_HOME=<the toolkit matching torch.version.cuda> "
                    "PATH=$CUDA_HOME/bin:$PATH");
    }
    if (nv && (nv->major * 100 + nv->minor) < 1107) {
        x = find_add(f, S_TOOLKIT, "nvcc_version", FIND_PROBLEM,
                     "nvcc %s is too old for flash-attn (needs >= 11.7; 11.6 for 2.5-2.6)",
                     nv->version);
        find_fix(x, "install CUDA toolkit 12.x (the major of torch.version.cuda) and export "
                    "CUDA_HOME to it");
    }
    if (c->headers_checked && c->home_nvcc.found) {
        if (c->missing_headers[0]) {
            x = find_add(f, S_TOOLKIT, "headers", FIND_PROBLEM, "%s/include lacks: %s", c->home,
                         c->missing_headers);
            find_evidence(x, "torch's extension headers include cuda_runtime.h, cublas_v2.h, "
                             "cusparse.h and cusolverDn.h: a build fails with \"fatal error: "
                             "cusparse.h: No such file or directory\"");
            find_fix(x,
                     "install the full toolkit, not only cuda-nvcc: apt-get install "
                     "cuda-toolkit-%d-%d (or conda install -c nvidia cuda-toolkit=%d.%d)",
                     nv ? nv->major : 12, nv ? nv->minor : 8, nv ? nv->major : 12,
                     nv ? nv->minor : 8);
        } else {
            find_add(f, S_TOOLKIT, "headers", FIND_OK,
                     "headers present: cuda_runtime.h cublas_v2.h cusparse.h cusolverDn.h");
        }
    }
    if (nv && e->drv.found && e->drv.init_rc == 0 && e->drv.cuda_version > 0) {
        int dmaj = e->drv.cuda_version / 1000, dmin = (e->drv.cuda_version % 1000) / 10;
        char cv[16];
        env_cuda_version_str(e->drv.cuda_version, cv, sizeof cv);
        if (dmaj < nv->major) {
            x = find_add(f, S_TOOLKIT, "driver_vs_toolkit", FIND_PROBLEM,
                         "the driver supports CUDA %s, older than the toolkit's %s", cv,
                         nv->version);
            find_evidence(x, "binaries built by this nvcc fail with \"CUDA driver version is "
                             "insufficient for CUDA runtime version\"");
            find_fix(x,
                     "upgrade the driver to >= %s (for CUDA %d), or use a CUDA %d.x toolkit "
                     "and torch",
                     driver_for_cuda(nv->major), nv->major, dmaj);
        } else if (dmaj == nv->major && dmin < nv->minor) {
            x = find_add(f, S_TOOLKIT, "driver_vs_toolkit", FIND_WARN,
                         "the driver supports CUDA %s, the toolkit is %s (same major)", cv,
                         nv->version);
            find_evidence(x, "fine for flash-attn (SASS only, minor-version compatibility); "
                             "PTX JIT from this nvcc would fail");
        } else {
            find_add(f, S_TOOLKIT, "driver_vs_toolkit", FIND_OK,
                     "the driver (CUDA %s) can run what nvcc %s builds", cv, nv->version);
        }
    }
}

/* ---- host compiler --------------------------------------------------------------------------- */

static void check_compiler(findings *f, const fa_env *e) {
    const env_cxx *x = &e->cxx;
    const env_tool *nv = build_nvcc(e);
    finding *y;
    int max = 0;
    if (!x->gcc.found) {
        y = find_add(f, S_COMPILER, "gcc", FIND_WARN, "no gcc on PATH");
        find_evidence(y, "a flash-attn source build needs gcc and g++");
        find_fix(y, "apt-get install build-essential (dnf install gcc-c++ on Fedora/RHEL)");
        return;
    }
    y = find_add(f, S_COMPILER, "gcc", x->gcc.ran ? FIND_OK : FIND_WARN, "gcc %s: %s",
                 x->gcc.ran ? x->gcc.version : "(version unknown)", x->gcc.path);
    if (x->gcc.line[0])
        find_evidence(y, "%s", x->gcc.line);
    if (x->other_gcc[0])
        find_evidence(y, "also on PATH: gcc-N for N = %s", x->other_gcc);
    if (!x->gxx.found) {
        y = find_add(f, S_COMPILER, "gxx", FIND_WARN, "no g++ on PATH");
        find_fix(y, "apt-get install g++");
    } else if (x->gxx.ran && x->gcc.ran && x->gxx.major != x->gcc.major) {
        y = find_add(f, S_COMPILER, "gxx", FIND_WARN, "g++ %s and gcc %s differ", x->gxx.version,
                     x->gcc.version);
        find_fix(y, "install the matching g++: apt-get install g++-%d", x->gcc.major);
    }
    if (!x->gcc.ran)
        return;
    if (x->gcc.major < 9) {
        y = find_add(f, S_COMPILER, "gcc_old", FIND_PROBLEM,
                     "gcc %s is too old: torch >= 2.1 extensions need gcc >= 9 (C++17)",
                     x->gcc.version);
        find_fix(y, "install gcc 11 or newer (conda install -c conda-forge gxx=11, or a newer "
                    "distribution) and export CC=gcc-11 CXX=g++-11");
    }
    if (!nv)
        return;
    max = e->cuda.host_gcc_max ? e->cuda.host_gcc_max : rel_nvcc_gcc_max(nv->major, nv->minor);
    if (!gcc_version_ok_for(x->gcc.major, max)) {
        char alt[16] = "";
        const char *p = x->other_gcc;
        while (*p) {
            int v = atoi(p);
            if (v >= 9 && v <= max)
                snprintf(alt, sizeof alt, "%d", v);
            p += strcspn(p, " ");
            while (*p == ' ')
                p++;
        }
        y = find_add(f, S_COMPILER, "gcc_vs_nvcc", FIND_PROBLEM,
                     "nvcc %s accepts gcc <= %d; the default gcc is %s", nv->version, max,
                     x->gcc.version);
        find_evidence(y, "%s",
                      e->cuda.host_gcc_max ? e->cuda.host_config : "NVIDIA's host compiler table");
        find_evidence(y,
                      "builds fail with \"#error -- unsupported GNU version! gcc versions later "
                      "than %d are not supported!\"",
                      max);
        if (alt[0])
            find_fix(y, "export CC=gcc-%s CXX=g++-%s (torch passes $CC to nvcc as -ccbin)", alt,
                     alt);
        else
            find_fix(y, "apt-get install gcc-%d g++-%d && export CC=gcc-%d CXX=g++-%d", max, max,
                     max, max);
    } else {
        y = find_add(f, S_COMPILER, "gcc_vs_nvcc", FIND_OK, "nvcc %s accepts gcc %d (<= %d)",
                     nv->version, x->gcc.major, max);
        find_evidence(y, "from %s",
                      e->cuda.host_gcc_max ? e->cuda.host_config : "NVIDIA's host compiler table");
    }
}

/* ---- C and C++ runtime ----------------------------------------------------------------------- */

static void check_runtime(findings *f, const fa_env *e) {
    const env_libc *l = &e->libc;
    finding *x;
    if (!l->glibc[0]) {
        x = find_add(f, S_RUNTIME, "glibc", FIND_WARN, "glibc version unknown (not glibc?)");
        find_evidence(x, "flash-attn and torch wheels are built for glibc (manylinux/linux)");
    } else if (ver_cmp(l->glibc, "2.28") < 0) {
        x = find_add(f, S_RUNTIME, "glibc", FIND_WARN, "glibc %s", l->glibc);
        find_evidence(x, "pip torch >= 2.6 needs glibc 2.28 (manylinux_2_28); flash-attn 2.8.x "
                         "wheels need GLIBC_2.32");
        find_fix(x, "use a newer distribution or container (Ubuntu 22.04+, RHEL 9+)");
    } else if (ver_cmp(l->glibc, "2.32") < 0) {
        x = find_add(f, S_RUNTIME, "glibc", FIND_WARN,
                     "glibc %s: too old for flash-attn 2.8.x "
                     "wheels (they need GLIBC_2.32)",
                     l->glibc);
        find_fix(x, "install flash-attn 2.7.4.post1 (built on Ubuntu 20.04), or build from source "
                    "here: flashattn wheel --build-script > build.sh");
    } else {
        find_add(f, S_RUNTIME, "glibc", FIND_OK, "glibc %s", l->glibc);
    }
    if (l->libstdcxx[0] && l->glibcxx_max[0]) {
        x = find_add(f, S_RUNTIME, "libstdcxx", FIND_OK, "libstdc++: up to %s, %s", l->glibcxx_max,
                     l->cxxabi_max);
        find_evidence(x, "%s", l->libstdcxx);
    } else {
        x = find_add(f, S_RUNTIME, "libstdcxx", FIND_WARN,
                     "libstdc++.so.6 not found or unreadable");
        find_evidence(x, "%s", l->libstdcxx_error[0] ? l->libstdcxx_error : "not found");
        find_fix(x, "apt-get install libstdc++6");
    }
    if (l->conda_libstdcxx[0] && l->conda_glibcxx_max[0] && l->glibcxx_max[0] &&
        ver_cmp(l->conda_glibcxx_max, l->glibcxx_max) < 0) {
        x = find_add(f, S_RUNTIME, "conda_libstdcxx", FIND_WARN,
                     "the conda environment's libstdc++ (%s) is older than the system's (%s)",
                     l->conda_glibcxx_max, l->glibcxx_max);
        find_evidence(x,
                      "%s shadows the system one for Python in this environment: modules built "
                      "with the system gcc fail with \"version `%s' not found\"",
                      l->conda_libstdcxx, l->glibcxx_max);
        find_fix(x, "conda install -c conda-forge 'libstdcxx-ng>=12'");
    }
}

/* ---- build resources ------------------------------------------------------------------------- */

static void check_build(findings *f, const fa_env *e) {
    int jobs, threads;
    const char *env_jobs = getenv("MAX_JOBS");
    const char *env_arch = getenv("TORCH_CUDA_ARCH_LIST");
    char tlist[128], falist[64];
    finding *x;
    rel_build_jobs(e->mem.build_gb, e->cpu.ncpu, &jobs, &threads);
    x = find_add(f, S_BUILD, "max_jobs", e->mem.build_gb < 10.0 ? FIND_WARN : FIND_OK,
                 "MAX_JOBS=%d NVCC_THREADS=%d for a flash-attn build (%.1f GB available, %d CPUs)",
                 jobs, threads, e->mem.build_gb, e->cpu.ncpu);
    find_evidence(x, "rule: %s", rel_jobs_rule);
    find_evidence(x, "RAM: %.1f GB total, %.1f GB available%s (%s)", e->mem.total_gb,
                  e->mem.avail_gb, e->mem.cgroup_gb > 0 ? ", cgroup limit" : "", e->mem.source);
    if (e->mem.cgroup_gb > 0)
        find_evidence(x, "cgroup memory limit: %.1f GB (what kills container builds)",
                      e->mem.cgroup_gb);
    find_evidence(x, "use: export MAX_JOBS=%d NVCC_THREADS=%d", jobs, threads);
    if (e->mem.build_gb < 10.0)
        find_fix(x, "less than 10 GB: even MAX_JOBS=1 may be killed; use a prebuilt wheel "
                    "(flashattn wheel), NVCC_THREADS=1, or add swap");
    if (env_jobs && atoi(env_jobs) > jobs) {
        x = find_add(f, S_BUILD, "max_jobs_env", FIND_WARN,
                     "MAX_JOBS=%s is set, more than this machine's RAM allows (%d)", env_jobs,
                     jobs);
        find_fix(x, "export MAX_JOBS=%d", jobs);
    }
    rel_arch_lists(e->drv.gpus, e->drv.ngpus, tlist, sizeof tlist, falist, sizeof falist);
    if (e->drv.ngpus == 0) {
        x = find_add(f, S_BUILD, "arch_list", FIND_WARN,
                     "no GPU visible: name the GPUs the build is for");
        find_evidence(x, "without a GPU torch compiles other extensions for every architecture it "
                         "knows; flash-attn compiles its own list (FLASH_ATTN_CUDA_ARCHS, 2.7.3+)");
        if (env_arch)
            find_evidence(x, "TORCH_CUDA_ARCH_LIST=%s is set", env_arch);
        find_fix(x, "export TORCH_CUDA_ARCH_LIST='8.0;9.0' FLASH_ATTN_CUDA_ARCHS='80;90' (A100 + "
                    "H100; 8.6 = RTX 30xx/A10, 8.9 = RTX 40xx/L4/L40, 9.0 = H100/H200, 10.0 = "
                    "B200, 12.0 = RTX 50xx)");
    } else {
        const env_tool *nv = build_nvcc(e);
        int i, bad = 0;
        x = find_add(f, S_BUILD, "arch_list", FIND_OK,
                     "TORCH_CUDA_ARCH_LIST='%s' for the GPUs "
                     "present (FLASH_ATTN_CUDA_ARCHS='%s')",
                     tlist, falist[0] ? falist : "none: no GPU >= sm_80");
        find_evidence(x, "flash-attn passes its own -gencode flags and ignores "
                         "TORCH_CUDA_ARCH_LIST; FLASH_ATTN_CUDA_ARCHS (2.7.3+) narrows them and "
                         "shortens the build");
        find_evidence(x, "use: export TORCH_CUDA_ARCH_LIST='%s' FLASH_ATTN_CUDA_ARCHS='%s'", tlist,
                      falist);
        if (env_arch && !strstr(env_arch, tlist)) {
            x = find_add(f, S_BUILD, "arch_list_env", FIND_WARN,
                         "TORCH_CUDA_ARCH_LIST=%s is set and differs from the GPUs present (%s)",
                         env_arch, tlist);
            find_fix(x, "export TORCH_CUDA_ARCH_LIST='%s'", tlist);
        }
        for (i = 0; nv && i < e->drv.ngpus && !bad; i++) {
            const env_gpu *g = &e->drv.gpus[i];
            int need = rel_nvcc_min_for_cc(g->cc_major, g->cc_minor);
            if (nv->major * 100 + nv->minor < need) {
                bad = 1;
                x = find_add(f, S_BUILD, "arch_vs_nvcc", FIND_PROBLEM,
                             "nvcc %s cannot compile for sm_%d%d (needs nvcc >= %d.%d)",
                             nv->version, g->cc_major, g->cc_minor, need / 100, need % 100);
                find_fix(x, "install CUDA toolkit >= %d.%d and export CUDA_HOME to it", need / 100,
                         need % 100);
            } else if (nv->major >= 13 && g->cc_major * 10 + g->cc_minor < 75) {
                bad = 1;
                x = find_add(f, S_BUILD, "arch_vs_nvcc", FIND_PROBLEM,
                             "nvcc %s no longer compiles for sm_%d%d (CUDA 13 dropped < sm_75)",
                             nv->version, g->cc_major, g->cc_minor);
                find_fix(x, "use a CUDA 12.x toolkit");
            }
        }
    }
}

/* ---- Python ---------------------------------------------------------------------------------- */

static int check_python(findings *f, const fa_env *e, int skipped) {
    const env_python *p = &e->py;
    finding *x;
    char missing[128] = "";
    size_t len = 0;
    if (skipped) {
        find_add(f, S_PYTHON, "python", FIND_OK, "not checked (--no-python)");
        return 0;
    }
    if (!p->found && !p->error[0]) {
        x = find_add(f, S_PYTHON, "python", FIND_WARN, "no python3 or python on PATH");
        find_fix(x, "install Python 3.9-3.13 (apt-get install python3 python3-pip python3-venv)");
        return 0;
    }
    if (!p->found) {
        x = find_add(f, S_PYTHON, "python", FIND_PROBLEM, "%s", p->error);
        find_fix(x, "pass an existing interpreter: flashattn doctor --python /path/to/python3");
        return 0;
    }
    if (p->timed_out) {
        x = find_add(f, S_PYTHON, "python", FIND_PROBLEM, "%s did not answer: %s", p->path,
                     p->error);
        find_evidence(x, "it got as far as: Python %s%s%s", p->version[0] ? p->version : "?",
                      p->torch_present ? ", torch " : "", p->torch_version);
        find_fix(x,
                 "run %s -c 'import torch' to see where it hangs (a network file system, a "
                 "stuck GPU); flashattn doctor --timeout 300 waits longer",
                 p->path);
        return 0;
    }
    if (!p->version[0]) {
        x = find_add(f, S_PYTHON, "python", FIND_PROBLEM, "%s does not run: %s", p->path, p->error);
        find_fix(x, "repair or reinstall this interpreter, or pass another one with --python");
        return 0;
    }
    if (!p->ok) { /* it started answering, then died: typically importing torch */
        x = find_add(f, S_PYTHON, "python", FIND_PROBLEM,
                     "Python %s at %s stopped before the checks finished: %s", p->version, p->path,
                     p->error);
        find_evidence(x, "it got as far as: %s%s", p->torch_present ? "torch " : "Python ",
                      p->torch_present ? p->torch_version : p->version);
        find_fix(x,
                 "run %s -c 'import torch' to see the crash; a torch built for another "
                 "Python or CPU, or a broken CUDA library, are the usual causes",
                 p->path);
        return 0;
    }
    x = find_add(f, S_PYTHON, "python", FIND_OK, "Python %s (%s, %s)", p->version, p->tag,
                 p->soabi[0] ? p->soabi : "?");
    find_evidence(x, "%s", p->path);
    if (p->minor < 9 || p->minor > 13) {
        x = find_add(f, S_PYTHON, "python_range", FIND_WARN,
                     "flash-attn publishes wheels for Python 3.9-3.13 (2.8.x); this is 3.%d",
                     p->minor);
        find_fix(x, "use Python 3.12 (e.g. python3.12 -m venv venv && . venv/bin/activate)");
    }
#define MISSING(flag, name)                                                                        \
    if (!p->flag)                                                                                  \
    len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%s", len ? " " : "", name)
    MISSING(has_packaging, "packaging");
    MISSING(has_ninja, "ninja");
    MISSING(has_psutil, "psutil");
    MISSING(has_wheel, "wheel");
    MISSING(has_setuptools, "setuptools");
    MISSING(has_einops, "einops");
#undef MISSING
    if (missing[0]) {
        x = find_add(f, S_PYTHON, "build_deps", FIND_WARN,
                     "not installed, needed to build or run flash-attn: %s", missing);
        find_evidence(x, "with --no-build-isolation setup.py imports them from this environment");
        find_fix(x, "%s -m pip install %s", p->path, missing);
    } else {
        find_add(f, S_PYTHON, "build_deps", FIND_OK,
                 "packaging, ninja, psutil, wheel, setuptools, einops are installed");
    }
    return 1;
}

/* ---- PyTorch --------------------------------------------------------------------------------- */

static void check_torch(findings *f, const fa_env *e) {
    const env_python *p = &e->py;
    const env_tool *nv = build_nvcc(e);
    finding *x;
    int tmaj = 0, tmin = 0, has_cuda;
    if (!p->torch_present) {
        if (!p->torch_error[0] || strstr(p->torch_error, "No module named 'torch'")) {
            x = find_add(f, S_TORCH, "torch", FIND_WARN, "torch is not installed in %s", p->path);
            find_evidence(x, "flash-attn needs a CUDA build of torch, installed first");
            if (nv && nv->major >= 13)
                find_evidence(x,
                              "nvcc here is %s: a source build needs a torch built for CUDA %d "
                              "(https://download.pytorch.org/whl/cu%d%d); the prebuilt "
                              "flash-attn wheels (<= 2.8.3) need a CUDA 12 torch and no nvcc",
                              nv->version, nv->major, nv->major, nv->minor);
            find_fix(x, "%s -m pip install torch --index-url %s", p->path,
                     torch_index_for_driver(e->drv.init_rc == 0 ? e->drv.cuda_version : 0));
        } else {
            x = find_add(f, S_TORCH, "torch", FIND_PROBLEM, "import torch fails");
            find_evidence(x, "%s", p->torch_error);
            find_fix(x, "reinstall it: %s -m pip install --force-reinstall torch --index-url %s",
                     p->path, torch_index_for_driver(e->drv.cuda_version));
        }
        return;
    }
    has_cuda = p->torch_cuda[0] && strcmp(p->torch_cuda, "None") != 0 &&
               env_parse_mm(p->torch_cuda, &tmaj, &tmin) == 0;
    x = find_add(f, S_TORCH, "torch", FIND_OK,
                 "torch %s, CUDA %s, _GLIBCXX_USE_CXX11_ABI=%s, CUDA available: %s",
                 p->torch_version, has_cuda ? p->torch_cuda : "none (CPU-only build)",
                 p->torch_abi == 1   ? "True"
                 : p->torch_abi == 0 ? "False"
                                     : "?",
                 p->torch_cuda_available == 1   ? "yes"
                 : p->torch_cuda_available == 0 ? "no"
                                                : "?");
    if (p->torch_lib[0])
        find_evidence(x, "%s", p->torch_lib);
    if (p->torch_arch_list[0])
        find_evidence(x, "compiled for: %s", p->torch_arch_list);
    if (p->torch_hip[0] && strcmp(p->torch_hip, "None") != 0)
        find_evidence(x, "ROCm build (HIP %s): flash-attn's CUDA wheels do not apply",
                      p->torch_hip);
    if (!has_cuda) {
        x = find_add(f, S_TORCH, "torch_cuda", FIND_WARN,
                     "a CPU-only torch: flash-attn needs a CUDA build");
        find_fix(x, "%s -m pip install --force-reinstall torch --index-url %s", p->path,
                 torch_index_for_driver(e->drv.cuda_version));
        return;
    }
    if (e->drv.found && e->drv.init_rc == 0 && e->drv.cuda_version > 0) {
        char cv[16];
        env_cuda_version_str(e->drv.cuda_version, cv, sizeof cv);
        if (e->drv.cuda_version / 1000 < tmaj) {
            x = find_add(f, S_TORCH, "driver_vs_torch", FIND_PROBLEM,
                         "torch was built for CUDA %s but the driver supports only CUDA %s",
                         p->torch_cuda, cv);
            find_evidence(x, "torch.cuda.is_available() is False: \"The NVIDIA driver on your "
                             "system is too old\"");
            find_fix(x,
                     "upgrade the driver to >= %s, or: %s -m pip install --force-reinstall "
                     "torch --index-url %s",
                     driver_for_cuda(tmaj), p->path, torch_index_for_driver(e->drv.cuda_version));
        } else if (p->torch_cuda_available == 0 && e->drv.ngpus > 0) {
            x = find_add(f, S_TORCH, "driver_vs_torch", FIND_PROBLEM,
                         "torch does not see the GPU although the driver does");
            if (p->torch_cuda_error[0])
                find_evidence(x, "%s", p->torch_cuda_error);
            find_fix(x,
                     "check CUDA_VISIBLE_DEVICES and run: %s -c 'import torch; "
                     "torch.cuda.init()' for the error",
                     p->path);
        }
        if (p->torch_arch_list[0]) {
            int i;
            for (i = 0; i < e->drv.ngpus; i++) {
                char sm[16];
                const env_gpu *g = &e->drv.gpus[i];
                snprintf(sm, sizeof sm, "sm_%d%d", g->cc_major, g->cc_minor);
                if (!strstr(p->torch_arch_list, sm) && g->cc_major >= 10) {
                    x = find_add(f, S_TORCH, "torch_arch", FIND_PROBLEM,
                                 "this torch has no %s code for GPU %d (%s)", sm, i, g->name);
                    find_evidence(x, "torch is compiled for: %s", p->torch_arch_list);
                    find_fix(x,
                             "%s -m pip install --force-reinstall torch --index-url "
                             "https://download.pytorch.org/whl/cu128",
                             p->path);
                    break;
                }
            }
        }
    }
    if (nv) {
        if (nv->major != tmaj) {
            char dir[64];
            struct stat st;
            snprintf(dir, sizeof dir, "/usr/local/cuda-%d.%d", tmaj, tmin);
            x = find_add(f, S_TORCH, "nvcc_vs_torch", FIND_PROBLEM,
                         "nvcc %s and torch's CUDA %s differ in major version", nv->version,
                         p->torch_cuda);
            find_evidence(x,
                          "torch refuses to build extensions: \"The detected CUDA version (%s) "
                          "mismatches the version that was used to compile PyTorch (%s)\"",
                          nv->version, p->torch_cuda);
            if (stat(dir, &st) == 0)
                find_fix(x, "export CUDA_HOME=%s PATH=%s/bin:$PATH", dir, dir);
            else
                find_fix(x,
                         "install CUDA toolkit %d.x and export CUDA_HOME to it, or install the "
                         "torch built for CUDA %d (pip install torch --index-url "
                         "https://download.pytorch.org/whl/cu%d%d)",
                         tmaj, nv->major, nv->major, nv->minor);
        } else if (nv->minor != tmin) {
            x = find_add(f, S_TORCH, "nvcc_vs_torch", FIND_WARN,
                         "nvcc %s and torch's CUDA %s differ in minor version only", nv->version,
                         p->torch_cuda);
            find_evidence(x, "torch only warns; builds work");
        } else {
            find_add(f, S_TORCH, "nvcc_vs_torch", FIND_OK, "nvcc %s matches torch's CUDA %s",
                     nv->version, p->torch_cuda);
        }
    }
}

/* ---- flash-attn ------------------------------------------------------------------------------ */

static void print_wheel_fix(finding *x, const fa_env *e) {
    rel_target t;
    rel_choice c;
    rel_target_from_env(e, &t);
    if (t.torch_mm[0] && t.torch_cuda[0] && t.abi >= 0 && rel_choose(&t, &c))
        find_fix(x, "%s -m pip install %s", e->py.path, c.url);
    else
        find_fix(x, "flashattn wheel (names the wheel for this machine, or why none exists)");
}

static void check_flash_attn(findings *f, const fa_env *e) {
    const env_python *p = &e->py;
    finding *x;
    ext_report *rep = NULL;
    const char *dirs[1];
    char verdict[512];
    int i;
    if (access("flash_attn/__init__.py", F_OK) == 0) {
        char cwd[ENV_PATH_LEN];
        x = find_add(f, S_FA, "source_checkout", FIND_WARN,
                     "the current directory holds a flash_attn source tree (%s/flash_attn)",
                     getcwd(cwd, sizeof cwd) ? cwd : ".");
        find_evidence(x, "Python run from here imports it instead of the installed package, and "
                         "it has no compiled extension: \"No module named 'flash_attn_2_cuda'\"");
        find_fix(x, "run Python from another directory (the checks above ignore this one)");
    }
    if (!p->fa_present) {
        x = find_add(f, S_FA, "flash_attn", FIND_WARN, "flash_attn is not installed in %s",
                     p->path);
        print_wheel_fix(x, e);
        return;
    }
    if (!p->torch_present) {
        x = find_add(f, S_FA, "flash_attn", FIND_PROBLEM,
                     "flash_attn is installed (%s) but torch does not import", p->fa_path);
        find_fix(x, "install torch first (see the PyTorch section), then check again");
        return;
    }
    if (p->fa_ext_path[0]) {
        rep = calloc(1, sizeof *rep);
        if (rep) {
            dirs[0] = p->torch_lib;
            ext_check(p->fa_ext_path, dirs, p->torch_lib[0] ? 1 : 0, rep);
            ext_verdict(rep, p->torch_abi, verdict, sizeof verdict);
        }
    }
    if (p->fa_import_ok && (!p->fa_ext_path[0] || p->fa_ext_import_ok)) {
        x = find_add(f, S_FA, "flash_attn", FIND_OK, "flash_attn %s imports", p->fa_version);
        find_evidence(x, "%s", p->fa_path);
        if (rep && rep->ok && rep->abi >= 0)
            find_evidence(x, "extension built with _GLIBCXX_USE_CXX11_ABI=%d (torch: %d)", rep->abi,
                          p->torch_abi);
    } else {
        const char *err = p->fa_import_error[0] ? p->fa_import_error : p->fa_ext_error;
        const char *u = strstr(err, "undefined symbol: ");
        x = find_add(f, S_FA, "flash_attn", FIND_PROBLEM, "import flash_attn fails");
        find_evidence(x, "%.600s", err);
        if (u) {
            char sym[512];
            char *d;
            unsigned flags = 0;
            u += strlen("undefined symbol: ");
            snprintf(sym, sizeof sym, "%.*s", (int)strcspn(u, " ,'\"\\"), u);
            d = dmg_demangle(sym, &flags);
            if (d) {
                find_evidence(x, "demangled: %s", d);
                free(d);
            } else if (dmg_unavailable()) {
                find_evidence(x, "not demangled (%s): `c++filt %s` shows it", dmg_unavailable(),
                              sym);
            }
        }
        if (rep && rep->ok) {
            find_evidence(x, "%s", verdict);
            for (i = 0; i < rep->n_shown && i < 4; i++)
                find_evidence(x, "missing: %s",
                              rep->missing[i].demangled[0] ? rep->missing[i].demangled
                                                           : rep->missing[i].mangled);
        }
        if (rep && rep->ok &&
            ((rep->abi >= 0 && p->torch_abi >= 0 && rep->abi != p->torch_abi) ||
             rep->n_missing_cxx11 || rep->n_missing_oldstr)) {
            rel_target t;
            rel_choice c;
            rel_target_from_env(e, &t);
            if (rel_choose(&t, &c))
                find_fix(x, "%s -m pip install --force-reinstall --no-deps %s", p->path, c.url);
            else
                find_fix(x,
                         "%s -m pip uninstall -y flash-attn && %s -m pip install flash-attn "
                         "--no-build-isolation --no-cache-dir",
                         p->path, p->path);
        } else {
            find_fix(x,
                     "%s -m pip uninstall -y flash-attn && %s -m pip install flash-attn "
                     "--no-build-isolation --no-cache-dir (or the wheel `flashattn wheel` "
                     "names)",
                     p->path, p->path);
        }
    }
    if (rep && rep->ok) {
        int tmaj = 0, tmin = 0;
        if (rep->abi >= 0 && p->torch_abi >= 0 && rep->abi != p->torch_abi) {
            x = find_add(f, S_FA, "abi", FIND_PROBLEM,
                         "the extension's C++ ABI (%d) differs from torch's (%d)", rep->abi,
                         p->torch_abi);
            find_evidence(x, "%s", rep->path);
            find_fix(x, "install the wheel named cxx11abi%s: flashattn wheel",
                     p->torch_abi ? "TRUE" : "FALSE");
        }
        if (rep->cudart_major && env_parse_mm(p->torch_cuda, &tmaj, &tmin) == 0 &&
            rep->cudart_major != tmaj) {
            x = find_add(f, S_FA, "cudart", FIND_PROBLEM,
                         "the extension needs libcudart.so.%d but torch uses CUDA %d",
                         rep->cudart_major, tmaj);
            find_fix(x, "install the wheel named cu%d: flashattn wheel", tmaj);
        }
        if (rep->glibc_needed[0] && e->libc.glibc[0] &&
            ver_cmp(ver_after(rep->glibc_needed, "GLIBC_"), e->libc.glibc) > 0) {
            x = find_add(f, S_FA, "glibc_needed", FIND_PROBLEM,
                         "the extension needs %s, this system has glibc %s", rep->glibc_needed,
                         e->libc.glibc);
            find_fix(x, "install flash-attn 2.7.4.post1 or build it here: flashattn wheel "
                        "--build-script > build.sh && sh build.sh");
        }
        if (rep->glibcxx_needed[0] && e->libc.glibcxx_max[0] &&
            ver_cmp(rep->glibcxx_needed, e->libc.glibcxx_max) > 0) {
            x = find_add(f, S_FA, "glibcxx_needed", FIND_PROBLEM,
                         "the extension needs %s, the libstdc++ here stops at %s",
                         rep->glibcxx_needed, e->libc.glibcxx_max);
            find_fix(x, "conda install -c conda-forge 'libstdcxx-ng>=13' (in a conda "
                        "environment), or upgrade the system's libstdc++6");
        }
    }
    {
        const char *v = p->fa_version[0] ? p->fa_version : p->fa_dist_version;
        int blackwell = 0;
        for (i = 0; i < e->drv.ngpus; i++)
            blackwell |= e->drv.gpus[i].cc_major >= 10;
        if (v[0] && blackwell && ver_cmp(v, "2.8.0") < 0) {
            x = find_add(f, S_FA, "fa_blackwell", FIND_PROBLEM,
                         "flash_attn %s has no sm_100/sm_120 code for this Blackwell GPU", v);
            find_evidence(x, "calls fail with \"no kernel image is available for execution on "
                             "the device\"");
            find_fix(x, "install flash-attn >= 2.8.0 with a torch built for CUDA >= 12.8: "
                        "flashattn wheel");
        }
        if (v[0] && !strcmp(v, "2.8.1") && e->drv.cuda_version && e->drv.cuda_version < 12040) {
            x = find_add(f, S_FA, "fa_fatbin", FIND_PROBLEM,
                         "flash_attn 2.8.1 wheels need driver >= 550 (compressed fatbins)");
            find_fix(x, "install flash-attn 2.8.2 or 2.8.0.post2, or upgrade the driver");
        }
        if (v[0] && ver_cmp(v, "2.8.0") >= 0 && p->torch_present &&
            ver_cmp(p->torch_version, "2.6") < 0) {
            x = find_add(f, S_FA, "fa_triton", FIND_WARN,
                         "flash_attn %s's Triton ops need torch >= 2.6 (torch %s)", v,
                         p->torch_version);
            find_evidence(x, "importing flash_attn.ops.triton fails: module 'torch.library' has "
                             "no attribute 'wrap_triton'");
            find_fix(x, "pip install 'torch>=2.6', or flash-attn 2.7.4.post1");
        }
    }
    free(rep);
}

/* ---- JSON facts ------------------------------------------------------------------------------ */

static void jkv_str(FILE *o, const char *k, const char *v, int comma) {
    fprintf(o, "%s\"%s\": ", comma ? ", " : "", k);
    if (v && *v)
        json_string(o, v);
    else
        fputs("null", o);
}

static void jkv_num(FILE *o, const char *k, double v, int comma) {
    fprintf(o, "%s\"%s\": %.4g", comma ? ", " : "", k, v);
}

static void jkv_int(FILE *o, const char *k, long v, int comma) {
    fprintf(o, "%s\"%s\": %ld", comma ? ", " : "", k, v);
}

static void jkv_tri(FILE *o, const char *k, int v, int comma) {
    fprintf(o, "%s\"%s\": %s", comma ? ", " : "", k, v < 0 ? "null" : v ? "true" : "false");
}

static void print_facts(FILE *o, const fa_env *e, int skipped_python) {
    char cv[16], tlist[128], falist[64];
    int jobs, threads, i;
    rel_build_jobs(e->mem.build_gb, e->cpu.ncpu, &jobs, &threads);
    rel_arch_lists(e->drv.gpus, e->drv.ngpus, tlist, sizeof tlist, falist, sizeof falist);
    env_cuda_version_str(e->drv.cuda_version, cv, sizeof cv);
    fputs("{\n    \"cpu\": {", o);
    jkv_str(o, "arch", e->cpu.arch, 0);
    jkv_str(o, "model", e->cpu.model, 1);
    jkv_int(o, "cpus", e->cpu.ncpu, 1);
    jkv_str(o, "simd", e->cpu.simd, 1);
    fputs("},\n    \"memory\": {", o);
    jkv_num(o, "total_gb", e->mem.total_gb, 0);
    jkv_num(o, "available_gb", e->mem.avail_gb, 1);
    jkv_num(o, "cgroup_limit_gb", e->mem.cgroup_gb, 1);
    jkv_num(o, "build_gb", e->mem.build_gb, 1);
    fputs("},\n    \"driver\": {", o);
    jkv_tri(o, "found", e->drv.found, 0);
    jkv_str(o, "library", e->drv.lib, 1);
    jkv_str(o, "error", e->drv.error, 1);
    jkv_int(o, "cu_init", e->drv.init_rc, 1);
    jkv_str(o, "cuda_version", e->drv.cuda_version ? cv : NULL, 1);
    jkv_str(o, "version", e->drv.version, 1);
    fputs(", \"gpus\": [", o);
    for (i = 0; i < e->drv.ngpus; i++) {
        char ccs[16];
        snprintf(ccs, sizeof ccs, "%d.%d", e->drv.gpus[i].cc_major, e->drv.gpus[i].cc_minor);
        fputs(i ? ", {" : "{", o);
        jkv_str(o, "name", e->drv.gpus[i].name, 0);
        jkv_str(o, "compute_capability", ccs, 1);
        jkv_num(o, "memory_gb", e->drv.gpus[i].mem_gb, 1);
        fputc('}', o);
    }
    fputs("]},\n    \"cuda_toolkit\": {", o);
    jkv_str(o, "cuda_home", e->cuda.home, 0);
    jkv_str(o, "cuda_home_source", e->cuda.home_source, 1);
    jkv_str(o, "nvcc_on_path", e->cuda.nvcc.path, 1);
    jkv_str(o, "nvcc_version", e->cuda.nvcc.version, 1);
    jkv_str(o, "toolkit_nvcc_version", e->cuda.home_nvcc.version, 1);
    jkv_str(o, "missing_headers", e->cuda.missing_headers, 1);
    jkv_int(o, "host_gcc_max", e->cuda.host_gcc_max, 1);
    fputs("},\n    \"compiler\": {", o);
    jkv_str(o, "gcc", e->cxx.gcc.path, 0);
    jkv_str(o, "gcc_version", e->cxx.gcc.version, 1);
    jkv_str(o, "gxx", e->cxx.gxx.path, 1);
    jkv_str(o, "gxx_version", e->cxx.gxx.version, 1);
    fputs("},\n    \"runtime\": {", o);
    jkv_str(o, "glibc", e->libc.glibc, 0);
    jkv_str(o, "libstdcxx", e->libc.libstdcxx, 1);
    jkv_str(o, "glibcxx_max", e->libc.glibcxx_max, 1);
    jkv_str(o, "cxxabi_max", e->libc.cxxabi_max, 1);
    fputs("},\n    \"build\": {", o);
    jkv_int(o, "max_jobs", jobs, 0);
    jkv_int(o, "nvcc_threads", threads, 1);
    jkv_str(o, "max_jobs_rule", rel_jobs_rule, 1);
    jkv_str(o, "torch_cuda_arch_list", tlist, 1);
    jkv_str(o, "flash_attn_cuda_archs", falist, 1);
    fputs("},\n    \"python\": {", o);
    jkv_tri(o, "checked", !skipped_python, 0);
    jkv_str(o, "path", e->py.path, 1);
    jkv_str(o, "version", e->py.version, 1);
    jkv_str(o, "tag", e->py.tag, 1);
    jkv_str(o, "soabi", e->py.soabi, 1);
    jkv_str(o, "error", e->py.error, 1);
    fputs("},\n    \"torch\": {", o);
    jkv_tri(o, "installed", e->py.torch_present, 0);
    jkv_str(o, "version", e->py.torch_version, 1);
    jkv_str(o, "cuda", e->py.torch_cuda, 1);
    jkv_tri(o, "cxx11_abi", e->py.torch_abi, 1);
    jkv_tri(o, "cuda_available", e->py.torch_cuda_available, 1);
    jkv_str(o, "error", e->py.torch_error, 1);
    fputs("},\n    \"flash_attn\": {", o);
    jkv_tri(o, "installed", e->py.fa_present, 0);
    jkv_str(o, "version", e->py.fa_version[0] ? e->py.fa_version : e->py.fa_dist_version, 1);
    jkv_tri(o, "imports", e->py.fa_present ? e->py.fa_import_ok : -1, 1);
    jkv_str(o, "error", e->py.fa_import_error, 1);
    jkv_str(o, "extension", e->py.fa_ext_path, 1);
    fputs("}\n  }", o);
}

/* ---- --so ------------------------------------------------------------------------------------ */

/* The report's strings made safe for a terminal, as explain shows a log (logread.h): the names
 * it holds were read from the module and its libraries (needed libraries, run paths, symbols,
 * version names) and may contain escape sequences. */
static void clean_report(ext_report *rep, char *verdict, size_t vcap) {
    int i;
    logr_clean(rep->path, sizeof rep->path, rep->path);
    logr_clean(rep->error, sizeof rep->error, rep->error);
    logr_clean(rep->machine, sizeof rep->machine, rep->machine);
    logr_clean(rep->torch_lib, sizeof rep->torch_lib, rep->torch_lib);
    logr_clean(rep->glibc_needed, sizeof rep->glibc_needed, rep->glibc_needed);
    logr_clean(rep->glibcxx_needed, sizeof rep->glibcxx_needed, rep->glibcxx_needed);
    logr_clean(rep->cxxabi_needed, sizeof rep->cxxabi_needed, rep->cxxabi_needed);
    for (i = 0; i < rep->nlibs; i++) {
        logr_clean(rep->libs[i].name, sizeof rep->libs[i].name, rep->libs[i].name);
        logr_clean(rep->libs[i].path, sizeof rep->libs[i].path, rep->libs[i].path);
    }
    for (i = 0; i < rep->n_shown; i++) {
        ext_missing *m = &rep->missing[i];
        logr_clean(m->mangled, sizeof m->mangled, m->mangled);
        logr_clean(m->demangled, sizeof m->demangled, m->demangled);
    }
    logr_clean(verdict, vcap, verdict);
}

static int run_so(const char *path, const char *const *dirs, int ndirs, int json) {
    ext_report *rep = calloc(1, sizeof *rep);
    char verdict[512], shown[4096];
    int i, bad;
    if (!rep) {
        fprintf(stderr, "flashattn doctor: out of memory\n");
        return 1;
    }
    ext_check(path, dirs, ndirs, rep);
    ext_verdict(rep, -1, verdict, sizeof verdict);
    bad = !rep->ok || rep->n_missing > 0 ||
          (rep->abi >= 0 && rep->torch_abi >= 0 && rep->abi != rep->torch_abi);
    if (json) {
        printf("{");
        jkv_str(stdout, "module", path, 0);
        jkv_tri(stdout, "read", rep->ok, 1);
        jkv_str(stdout, "error", rep->error, 1);
        jkv_str(stdout, "machine", rep->machine, 1);
        printf(", \"cxx11_abi\": %s", rep->abi < 0 ? "null" : rep->abi ? "1" : "0");
        printf(", \"libraries_cxx11_abi\": %s", rep->torch_abi < 0 ? "null"
                                                : rep->torch_abi   ? "1"
                                                                   : "0");
        jkv_int(stdout, "undefined", (long)rep->n_undefined, 1);
        jkv_int(stdout, "missing", (long)rep->n_missing, 1);
        printf(", \"needed\": [");
        for (i = 0; i < rep->nlibs; i++) {
            printf("%s{", i ? ", " : "");
            jkv_str(stdout, "name", rep->libs[i].name, 0);
            jkv_str(stdout, "path", rep->libs[i].path, 1);
            printf("}");
        }
        printf("], \"missing_symbols\": [");
        for (i = 0; i < rep->n_shown; i++) {
            printf("%s{", i ? ", " : "");
            jkv_str(stdout, "symbol", rep->missing[i].mangled, 0);
            jkv_str(stdout, "demangled", rep->missing[i].demangled, 1);
            printf("}");
        }
        printf("]");
        jkv_str(stdout, "glibc_needed", rep->glibc_needed, 1);
        jkv_str(stdout, "glibcxx_needed", rep->glibcxx_needed, 1);
        jkv_str(stdout, "verdict", verdict, 1);
        printf("}\n");
    } else {
        clean_report(rep, verdict, sizeof verdict);
        printf("module:   %s\n", logr_clean(shown, sizeof shown, path));
        if (!rep->ok) {
            printf("[✗] cannot read it: %s\n", rep->error);
        } else {
            printf("machine:  %s\n", rep->machine);
            printf("C++ ABI:  %s (%zu undefined symbols: %zu std::__cxx11, %zu old std::string)\n",
                   rep->abi < 0 ? "unknown (no std::string in its interface)"
                   : rep->abi   ? "_GLIBCXX_USE_CXX11_ABI=1"
                                : "_GLIBCXX_USE_CXX11_ABI=0",
                   rep->n_undefined, rep->n_cxx11, rep->n_oldstr);
            if (rep->torch_abi >= 0)
                printf("torch:    %s built with _GLIBCXX_USE_CXX11_ABI=%d\n", rep->torch_lib,
                       rep->torch_abi);
            if (rep->glibc_needed[0] || rep->glibcxx_needed[0])
                printf("needs:    %s %s %s\n", rep->glibc_needed, rep->glibcxx_needed,
                       rep->cxxabi_needed);
            printf("needed libraries:\n");
            for (i = 0; i < rep->nlibs; i++)
                printf("  %s%-28s %s\n", rep->libs[i].depth > 1 ? "  " : "", rep->libs[i].name,
                       rep->libs[i].path[0] ? rep->libs[i].path : "NOT FOUND");
            if (rep->n_missing) {
                printf("undefined symbols no library defines (%zu):\n", rep->n_missing);
                for (i = 0; i < rep->n_shown; i++) {
                    printf("  %s\n", rep->missing[i].mangled);
                    if (rep->missing[i].demangled[0])
                        printf("    = %s\n", rep->missing[i].demangled);
                }
                if (dmg_unavailable())
                    printf("  (not demangled: %s; `c++filt` demangles them)\n", dmg_unavailable());
            }
            printf("%s %s\n", bad ? "[✗]" : "[✓]", verdict);
        }
    }
    free(rep);
    return bad ? 1 : 0;
}

/* ---- the command ----------------------------------------------------------------------------- */

int cmd_doctor(int argc, char **argv) {
    int json = 0, verbose = 0, i, ok, warn, problem, color;
    const char *so = NULL;
    const char *libdirs[DOCTOR_MAX_LIBDIRS];
    int nlibdirs = 0;
    env_options opts;
    fa_env *e;
    findings f = {NULL, 0, 0};

    memset(&opts, 0, sizeof opts);
    for (i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            doctor_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (!strcmp(argv[i], "--verbose") || !strcmp(argv[i], "-v")) {
            verbose = 1;
        } else if (!strcmp(argv[i], "--no-python")) {
            opts.skip_python = 1;
        } else if (cli_opt_value(argc, argv, &i, "--python", &v)) {
            if (!v) {
                fprintf(stderr, "flashattn doctor: --python needs a path\n");
                return 2;
            }
            opts.python = v;
        } else if (cli_opt_value(argc, argv, &i, "--timeout", &v)) {
            long t;
            if (cli_parse_long(v, 1, 3600, &t) != 0) {
                fprintf(stderr, "flashattn doctor: --timeout wants 1..3600 seconds\n");
                return 2;
            }
            opts.timeout_s = (double)t;
        } else if (cli_opt_value(argc, argv, &i, "--so", &v)) {
            if (!v) {
                fprintf(stderr, "flashattn doctor: --so needs a file\n");
                return 2;
            }
            so = v;
        } else if (cli_opt_value(argc, argv, &i, "--lib-dir", &v)) {
            if (!v || nlibdirs >= DOCTOR_MAX_LIBDIRS) {
                fprintf(stderr, "flashattn doctor: --lib-dir needs a directory (at most %d)\n",
                        DOCTOR_MAX_LIBDIRS);
                return 2;
            }
            libdirs[nlibdirs++] = v;
        } else {
            fprintf(stderr, "flashattn doctor: unknown argument '%s'\n\n", argv[i]);
            doctor_usage(stderr);
            return 2;
        }
    }
    if (so)
        return run_so(so, libdirs, nlibdirs, json);

    e = calloc(1, sizeof *e);
    if (!e) {
        fprintf(stderr, "flashattn doctor: out of memory\n");
        return 1;
    }
    env_probe(e, &opts);
    check_flashattn(&f, e);
    check_cpu(&f, e);
    check_driver(&f, e);
    check_toolkit(&f, e);
    check_compiler(&f, e);
    check_runtime(&f, e);
    check_build(&f, e);
    if (check_python(&f, e, opts.skip_python) && e->py.ok) {
        check_torch(&f, e);
        check_flash_attn(&f, e);
    }
    find_count(&f, &ok, &warn, &problem);
    if (json) {
        printf("{\n  \"tool\": \"flashattn doctor\",\n  \"flashattn\": {");
        jkv_str(stdout, "version", fa_version_string(), 0);
        jkv_str(stdout, "build", fa_build_info(), 1);
        printf("},\n  \"findings\": ");
        find_print_json_array(&f, stdout);
        printf(",\n  \"facts\": ");
        print_facts(stdout, e, opts.skip_python);
        printf(",\n  \"summary\": {\"ok\": %d, \"warnings\": %d, \"problems\": %d}\n}\n", ok, warn,
               problem);
    } else {
        const char *nc = getenv("NO_COLOR");
        color = isatty(1) && !(nc && *nc);
        printf("flashattn doctor: flashattn %s; no network access used\n", fa_version_string());
        find_print_text(&f, stdout, color, verbose);
    }
    find_free(&f);
    free(e);
    return problem ? 1 : 0;
}
