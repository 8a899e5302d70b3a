/* SPDX-License-Identifier: MIT */
/*
 * tools/explain/ — `flashattn explain`: a build or import log classified and its fix named; the
 * bounded log reader.
 *
 * logclass.c — the rules that recognize flash-attn install and import failures in a log, and
 * the matcher that applies them line by line (see logclass.h for the tiers).
 *
 * A rule's pattern is a glob matched anywhere in the line: '*' stands for any run of
 * characters, everything else is literal. Matching every rule against every line would be slow
 * on a 100 MB log, so an Aho-Corasick automaton over each rule's longest literal piece (lower
 * case) picks the few candidate rules of a line in one pass over its bytes; only those are
 * matched in full. Some rules hand the line to a function that pulls out the detail (the
 * undefined symbol, the missing header, module or library) and decides the class from it.
 */
#define _POSIX_C_SOURCE 200809L

#include "logclass.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../elf/demangle.h"
#include "logmsg.h"
#include "logread.h"

const char *const logc_class_names[] = {
    "cxx11_abi_mismatch",
    "torch_version_mismatch",
    "extension_missing",
    "torch_missing_at_build",
    "build_deps_missing",
    "cuda_home_missing",
    "nvcc_missing",
    "nvcc_too_old",
    "cuda_version_mismatch",
    "missing_cuda_headers",
    "submodule_missing",
    "unsupported_arch",
    "build_oom",
    "gcc_version",
    "msvc",
    "no_kernel_image",
    "gpu_unsupported",
    "driver_too_old",
    "glibc_too_old",
    "glibcxx_too_old",
    "wheel_not_found",
    "wheel_download_failed",
    "triton_mismatch",
    "version_pin",
    "windows_long_path",
    "unknown",
    NULL,
};

/* ---- rules ----------------------------------------------------------------------------------- */

enum logc_handler {
    H_NONE,
    H_UNDEF,   /* "undefined symbol: X" */
    H_MODULE,  /* "No module named 'X'" */
    H_HEADER,  /* "fatal error: X: No such file or directory" */
    H_LIBOPEN, /* "X: cannot open shared object file" */
    H_VERNF,   /* "version `X' not found" */
    H_KILLED,  /* a line that is just "Killed" */
    H_EXC,     /* "SomeError: message" at the start of a line */
    H_WINPATH  /* "No such file or directory: 'C:\\...'": a path past Windows' MAX_PATH */
};

#define ICASE 1u

typedef struct logc_rule {
    const char *cls;
    int tier;
    unsigned flags;
    int handler;
    const char *pattern;
    const char *id;
} logc_rule;

/* Order matters within a line: the first rule that matches a line decides it. Tier 0 rules only
 * make the line's context (wheel URL, nvcc release, torch version) be noted. */
static const logc_rule rules[] = {
    {NULL, 0, 0, H_NONE, "Guessing wheel URL:", "context"},
    {NULL, 0, 0, H_NONE, "Building from source", "context"},
    {NULL, 0, 0, H_NONE, "Cuda compilation tools, release ", "context"},
    {NULL, 0, 0, H_NONE, "torch.__version__", "context"},
    {NULL, 0, 0, H_NONE, "PyTorch (", "context"},
    {NULL, 0, 0, H_NONE, "gcc (", "context"},

    /* setup.py gave up on the download (older releases raise instead of building) */
    {"wheel_download_failed", 1, 0, H_NONE, "error: <urlopen error", "pip_network"},
    /* tier 4/5 first: these lines must never count as generic errors */
    {"wheel_not_found", 4, 0, H_NONE, "HTTP Error 404", "guess_404"},
    {"wheel_download_failed", 4, 0, H_NONE, "urlopen error", "guess_urlerror"},
    {"wheel_download_failed", 4, 0, H_NONE, "Temporary failure in name resolution",
     "guess_urlerror"},
    {"wheel_download_failed", 4, 0, H_NONE, "Network is unreachable", "guess_urlerror"},
    {"wheel_not_found", 5, 0, H_NONE, "Precompiled wheel not found", "guess_miss"},

    /* import-time symbol and library problems */
    {"unknown", 1, 0, H_UNDEF, "undefined symbol: ", "undef"},
    {"unknown", 1, 0, H_VERNF, "version `* not found", "vernf"},
    {"unknown", 1, 0, H_VERNF, "version '* not found", "vernf"},
    {"unknown", 1, 0, H_LIBOPEN, "cannot open shared object file", "libopen"},
    {"unknown", 1, 0, H_MODULE, "No module named ", "module"},

    /* versions that do not fit together */
    {"cuda_version_mismatch", 1, 0, H_NONE,
     "detected CUDA version*mismatches the version that was used to compile", "torch_nvcc"},
    {"nvcc_too_old", 1, 0, H_NONE, "FlashAttention is only supported on CUDA 1", "fa_nvcc"},
    {"nvcc_too_old", 1, 0, H_NONE, "nvcc fatal*Unknown option", "nvcc_option"},
    {"gcc_version", 1, 0, H_NONE, "unsupported GNU version", "nvcc_gcc"},
    {"gcc_version", 1, 0, H_NONE, "too old version of GCC", "torch_gcc_old"},
    {"gcc_version", 1, 0, H_NONE, "is greater than the maximum required version by CUDA",
     "torch_gcc_new"},
    {"gcc_version", 1, 0, H_NONE, "unrecognized command*option*-std=c++17", "gcc_cxx17"},
    {"gcc_version", 1, 0, H_NONE, "parameter packs not expanded with", "gcc11_cuda11"},
    {"unsupported_arch", 1, 0, H_NONE, "Unsupported gpu architecture", "nvcc_arch"},
    {"unsupported_arch", 1, 0, H_NONE, "Unknown CUDA arch", "torch_arch"},
    {"unsupported_arch", 1, 0, H_NONE, "is not defined for option 'gpu-", "nvcc_arch"},
    {"triton_mismatch", 1, 0, H_NONE, "has no attribute 'wrap_triton'", "wrap_triton"},
    {"triton_mismatch", 1, 0, H_NONE, "cannot import name*from 'triton", "triton_import"},
    {"triton_mismatch", 1, 0, H_NONE, "module 'triton*has no attribute", "triton_attr"},
    {"triton_mismatch", 1, 0, H_NONE, "triton*CompilationError", "triton_compile"},
    {"version_pin", 1, 0, H_NONE, "Requires Flash-Attention version", "pkg_pin"},

    /* the toolkit */
    {"cuda_home_missing", 1, 0, H_NONE, "CUDA_HOME environment variable is not set", "cuda_home"},
    {"cuda_home_missing", 1, 0, H_NONE, "nvcc was not found", "fa_no_nvcc"},
    {"unknown", 1, 0, H_HEADER, "fatal error: *No such file or directory", "header"},
    {"unknown", 1, 0, H_HEADER, "cannot open source file", "header"},
    {"unknown", 1, 0, H_HEADER, "Cannot open include file*No such file or directory", "header"},
    {"missing_cuda_headers", 1, 0, H_NONE, "cannot find -lcu", "cuda_lib"},
    {"submodule_missing", 1, 0, H_NONE, "No such file or directory*csrc/cutlass", "cutlass"},
    {"submodule_missing", 1, 0, H_NONE, "No such file or directory*csrc/composable_kernel", "ck"},
    {"nvcc_missing", 1, 0, H_NONE, "nvcc: not found", "nvcc"},
    {"nvcc_missing", 1, 0, H_NONE, "nvcc: command not found", "nvcc"},
    {"nvcc_missing", 1, 0, H_NONE, "nvcc*No such file or directory", "nvcc"},

    /* build deps */
    {"build_deps_missing", 1, 0, H_NONE, "Ninja is required to load C++ extensions", "ninja"},
    {"build_deps_missing", 1, 0, H_NONE, "No such file or directory: 'ninja'", "ninja"},
    {"build_deps_missing", 1, 0, H_NONE, "invalid command 'bdist_wheel'", "wheel"},
    {"torch_missing_at_build", 1, 0, H_NONE, "depends on `torch`, but doesn't declare it",
     "uv_hint"},

    /* memory */
    {"build_oom", 1, 0, H_NONE, "Killed signal terminated program", "oom"},
    {"build_oom", 1, 0, H_NONE, "died due to signal 9", "oom"},
    {"build_oom", 1, 0, H_NONE, "internal compiler error: Killed", "oom"},
    {"build_oom", 1, 0, H_NONE, "virtual memory exhausted", "oom"},
    {"build_oom", 1, 0, H_NONE, "out of memory allocating", "oom"},
    {"build_oom", 1, 0, H_NONE, "Cannot allocate memory", "oom"},
    {"build_oom", 1, 0, H_NONE, "std::bad_alloc", "oom"},
    {"build_oom", 1, 0, H_NONE, "non-zero exit status -9", "oom"},
    {"build_oom", 1, 0, H_KILLED, "Killed", "oom"},
    {"build_oom", 1, 0, H_NONE, "LLVM error*out of memory", "oom"},
    {"build_oom", 1, 0, H_NONE, "catastrophic error*out of memory", "oom"},
    /* any other crash of gcc: an old gcc (7.x) with nvcc-generated code */
    {"gcc_version", 1, 0, H_NONE, "internal compiler error: ", "gcc_ice"},

    /* Windows */
    {"msvc", 1, ICASE, H_NONE, "Microsoft Visual C++ 14", "msvc"},
    {"msvc", 1, 0, H_NONE, "error: Microsoft Visual C++", "msvc"},
    {"msvc", 1, 0, H_NONE, "compatible Visual Studio installation", "msvc"},
    {"msvc", 1, 0, H_NONE, "'cl' is not recognized", "msvc"},
    {"msvc", 1, 0, H_NONE, "Error checking compiler version for cl", "cl_missing"},
    {"msvc", 1, 0, H_NONE, "LINK : fatal error LNK", "msvc"},
    {"msvc", 1, 0, H_NONE, "fatal error C1", "msvc"},
    {"msvc", 1, 0, H_NONE, "): error C", "msvc"},
    {"msvc", 1, 0, H_NONE, "error MSB", "msvc"},

    /* run time on the GPU */
    {"no_kernel_image", 1, 0, H_NONE, "no kernel image is available for execution", "no_image"},
    {"no_kernel_image", 1, 0, H_NONE, "cudaErrorNoKernelImageForDevice", "no_image"},
    {"no_kernel_image", 1, 0, H_NONE, "is not compatible with the current PyTorch installation",
     "torch_sm"},
    {"gpu_unsupported", 1, 0, H_NONE, "FlashAttention only supports Ampere GPUs or newer",
     "ampere"},
    {"gpu_unsupported", 1, 0, H_NONE, "requires A100", "a100"},
    {"gpu_unsupported", 1, 0, H_NONE, "which is of cuda capability", "torch_old_gpu"},
    {"driver_too_old", 1, 0, H_NONE, "CUDA driver version is insufficient", "driver"},
    {"driver_too_old", 1, 0, H_NONE, "NVIDIA driver on your system is too old", "driver"},
    {"driver_too_old", 1, 0, H_NONE, "PTX was compiled with an unsupported toolchain", "ptx"},
    {"driver_too_old", 1, 0, H_NONE, "device kernel image is invalid", "fatbin"},
    {"driver_too_old", 1, 0, H_NONE, "cudaErrorInsufficientDriver", "driver"},
    {"driver_too_old", 1, 0, H_NONE, "forward compatibility was attempted", "driver"},
    {"driver_too_old", 1, 0, H_NONE, "Found no NVIDIA driver", "no_driver"},
    {"driver_too_old", 1, 0, H_NONE, "couldn't communicate with the NVIDIA driver", "no_driver"},
    {"driver_too_old", 1, 0, H_NONE, "no CUDA-capable device is detected", "no_driver"},
    {"torch_version_mismatch", 1, 0, H_NONE, "Torch not compiled with CUDA enabled", "torch_cpu"},

    /* installing */
    {"wheel_not_found", 1, 0, H_NONE, "is not a supported wheel on this platform", "bad_wheel"},
    {"wheel_not_found", 1, 0, H_NONE, "HTTP error 404 while getting", "url_404"},
    {"wheel_not_found", 1, 0, H_NONE, "404 Client Error", "url_404"},
    {"wheel_download_failed", 1, 0, H_NONE, "HTTPSConnectionPool", "pip_network"},
    {"wheel_download_failed", 1, 0, H_NONE, "ProxyError", "pip_network"},
    {"wheel_download_failed", 1, 0, H_NONE, "CERTIFICATE_VERIFY_FAILED", "pip_network"},
    {"wheel_download_failed", 1, 0, H_NONE, "ReadTimeoutError", "pip_network"},
    {"version_pin", 1, 0, H_NONE, "ResolutionImpossible", "resolver"},
    {"version_pin", 1, 0, H_NONE, "conflicting dependencies", "resolver"},
    {"version_pin", 1, 0, H_NONE, "No matching distribution found for flash", "no_version"},
    {"version_pin", 1, 0, H_NONE, "satisfies the requirement flash", "no_version"},
    {"version_pin", 1, 0, H_NONE, "flash_attn package version to be greater or equal", "hf_min"},
    {"version_pin", 1, 0, H_NONE, "requires a different Python", "python_range"},
    {"extension_missing", 1, 0, H_NONE, "package flash_attn seems to be not installed", "hf_none"},
    {"version_pin", 2, 0, H_NONE, "which is incompatible", "pip_conflict"},
    {"unknown", 1, 0, H_WINPATH, "No such file or directory: '", "winpath"},

    /* tier 3: markers that follow an error */
    {"unknown", 3, 0, H_NONE, "Error compiling objects for extension", "marker"},
    {"unknown", 3, 0, H_NONE, "CalledProcessError", "marker"},
    {"unknown", 3, 0, H_NONE, "returned non-zero exit status", "marker"},
    {"unknown", 3, 0, H_NONE, "FAILED: ", "marker"},
    {"unknown", 3, 0, H_NONE, "ninja: build stopped", "marker"},
    {"unknown", 3, 0, H_NONE, "error: command '", "marker"},
    {"unknown", 3, 0, H_NONE, "Failed building wheel", "marker"},
    {"unknown", 3, 0, H_NONE, "Failed to build ", "marker"},
    {"unknown", 3, 0, H_NONE, "subprocess-exited-with-error", "marker"},
    {"unknown", 3, 0, H_NONE, "metadata-generation-failed", "marker"},
    {"unknown", 3, 0, H_NONE, "Could not build wheels", "marker"},
    {"unknown", 3, 0, H_NONE, "did not run successfully", "marker"},

    /* tier 2: generic errors */
    {"unknown", 2, 0, H_NONE, ": error: ", "generic"},
    {"unknown", 2, 0, H_NONE, "): error: ", "generic"},
    {"unknown", 2, 0, H_NONE, "fatal error: ", "generic"},
    {"unknown", 2, 0, H_NONE, "error: ", "generic"},
    {"unknown", 2, 0, H_EXC, "Error:", "exception"},
    {"unknown", 2, 0, H_EXC, "Exception:", "exception"},
    {"unknown", 3, 0, H_NONE, "ERROR: ", "marker"},
};

#define NUM_RULES (sizeof rules / sizeof rules[0])
#define NWORDS ((NUM_RULES + 63) / 64)
#define AC_ALPHA 128

/* ---- the automaton --------------------------------------------------------------------------- */

struct logc {
    uint16_t (*next)[AC_ALPHA];
    uint64_t (*out)[NWORDS];
    unsigned char *has_out;
    size_t nstates;
    uint64_t always[NWORDS]; /* rules with no literal piece */
    logc_result r;
    int have_best;
    char *tbuf; /* the line in English (logmsg.c) */
    size_t tcap;
    /* a traceback whose exception line is missing: its innermost informative frame, and what
     * pip said around it; used only when no error line was found */
    const char *frame_cls, *ctx_cls;
    char frame_ev[LOGC_EVIDENCE_LEN], ctx_ev[LOGC_EVIDENCE_LEN];
    uint64_t frame_line, ctx_line;
};

static unsigned char fold(unsigned char c) {
    if (c >= 'A' && c <= 'Z')
        return (unsigned char)(c + 32);
    return c < AC_ALPHA ? c : 0;
}

/* The longest run of literal characters in a pattern. */
static void anchor_of(const char *pat, const char **start, size_t *len) {
    const char *best = pat, *p = pat;
    size_t blen = 0;
    while (*p) {
        size_t n = strcspn(p, "*");
        if (n > blen) {
            best = p;
            blen = n;
        }
        p += n;
        if (*p == '*')
            p++;
    }
    *start = best;
    *len = blen;
}

static int build(logc *c) {
    size_t total = 1, i, s;
    size_t *queue, qh = 0, qt = 0;
    uint16_t *fail;
    for (i = 0; i < NUM_RULES; i++)
        total += strlen(rules[i].pattern);
    if (total >= 65535)
        return -1;
    c->next = calloc(total, sizeof *c->next);
    c->out = calloc(total, sizeof *c->out);
    c->has_out = calloc(total, 1);
    fail = calloc(total, sizeof *fail);
    queue = calloc(total, sizeof *queue);
    if (!c->next || !c->out || !c->has_out || !fail || !queue) {
        free(fail);
        free(queue);
        return -1;
    }
    c->nstates = 1;
    /* 0xffff = no edge yet; state 0 is the root */
    for (s = 0; s < total; s++)
        memset(c->next[s], 0xff, sizeof c->next[s]);
    for (i = 0; i < NUM_RULES; i++) {
        const char *a;
        size_t len, k;
        size_t st = 0;
        anchor_of(rules[i].pattern, &a, &len);
        if (len == 0) {
            c->always[i / 64] |= 1ull << (i % 64);
            continue;
        }
        for (k = 0; k < len; k++) {
            unsigned char ch = fold((unsigned char)a[k]);
            if (c->next[st][ch] == 0xffff)
                c->next[st][ch] = (uint16_t)c->nstates++;
            st = c->next[st][ch];
        }
        c->out[st][i / 64] |= 1ull << (i % 64);
        c->has_out[st] = 1;
    }
    /* breadth-first: failure links, complete transitions, merged outputs */
    for (s = 0; s < AC_ALPHA; s++) {
        if (c->next[0][s] == 0xffff) {
            c->next[0][s] = 0;
        } else {
            fail[c->next[0][s]] = 0;
            queue[qt++] = c->next[0][s];
        }
    }
    while (qh < qt) {
        size_t u = queue[qh++], w;
        for (s = 0; s < AC_ALPHA; s++) {
            uint16_t v = c->next[u][s];
            if (v == 0xffff) {
                c->next[u][s] = c->next[fail[u]][s];
                continue;
            }
            fail[v] = c->next[fail[u]][s];
            for (w = 0; w < NWORDS; w++)
                c->out[v][w] |= c->out[fail[v]][w];
            c->has_out[v] |= c->has_out[fail[v]];
            queue[qt++] = v;
        }
    }
    free(fail);
    free(queue);
    return 0;
}

logc *logc_new(void) {
    logc *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    if (build(c) != 0) {
        logc_free(c);
        return NULL;
    }
    logc_reset(c);
    return c;
}

void logc_free(logc *c) {
    if (!c)
        return;
    free(c->next);
    free(c->out);
    free(c->has_out);
    free(c->tbuf);
    free(c);
}

void logc_reset(logc *c) {
    memset(&c->r, 0, sizeof c->r);
    c->r.cls = "unknown";
    c->r.rule = "none";
    c->r.ext_abi = -1;
    c->have_best = 0;
    c->frame_cls = c->ctx_cls = NULL;
}

/* ---- matching -------------------------------------------------------------------------------- */

static int eqc(char p, char s, int icase) {
    if (icase)
        return fold((unsigned char)p) == fold((unsigned char)s);
    return p == s;
}

/* Does the glob match somewhere in s[0..n)? ('*' = any run; implicit '*' at both ends.) */
static int glob_match(const char *pat, const char *s, size_t n, int icase) {
    size_t plen = strlen(pat), pi = 0, si = 0, mark = 0;
    long star = 0; /* the implicit leading '*' */
    while (si < n) {
        if (pi < plen && pat[pi] != '*' && eqc(pat[pi], s[si], icase)) {
            pi++;
            si++;
        } else if (pi < plen && pat[pi] == '*') {
            star = (long)pi + 1;
            pi++;
            mark = si;
        } else if (star >= 0) {
            pi = (size_t)star;
            si = ++mark;
        } else {
            return 0;
        }
        if (pi == plen)
            return 1; /* the implicit trailing '*' */
    }
    while (pi < plen && pat[pi] == '*')
        pi++;
    return pi == plen;
}

static void copy_str(char *dst, size_t cap, const char *s, size_t n) {
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, s, n);
    dst[n] = '\0';
}

/* The token that starts at p and ends before any of `stop` (or the end). */
static size_t token_len(const char *p, const char *stop) { return strcspn(p, stop); }

static int starts_with(const char *s, const char *prefix) {
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* What a rule found in a line: its class and tier (possibly changed by a handler). */
typedef struct logc_hit {
    const char *cls;
    int tier;
    char detail[512];
    char demangled[1024];
    int ext_abi;
} logc_hit;

static int is_torch_symbol(const char *m) {
    const char *p = m;
    if (!starts_with(p, "_Z"))
        return 0;
    p += 2;
    if (p[0] == 'T' && (p[1] == 'V' || p[1] == 'I' || p[1] == 'S'))
        p += 2;
    if (*p == 'N')
        p++;
    if (*p == 'K')
        p++;
    return starts_with(p, "3c10") || starts_with(p, "2at") || starts_with(p, "5torch") ||
           starts_with(p, "6caffe2");
}

static void handle_undef(const char *line, logc_hit *h) {
    const char *p = strstr(line, "undefined symbol: ");
    char sym[512];
    unsigned flags = 0;
    char *dem;
    if (!p)
        return;
    p += strlen("undefined symbol: ");
    copy_str(sym, sizeof sym, p, token_len(p, " \t,'\")"));
    copy_str(h->detail, sizeof h->detail, sym, strlen(sym));
    dem = dmg_demangle(sym, &flags);
    if (dem) {
        copy_str(h->demangled, sizeof h->demangled, dem, strlen(dem));
        free(dem);
    }
    if (flags & DMG_FLAG_CXX11) {
        h->cls = "cxx11_abi_mismatch";
        h->ext_abi = 1;
    } else if (flags & DMG_FLAG_OLD_STRING) {
        h->cls = "cxx11_abi_mismatch";
        h->ext_abi = 0;
    } else if (is_torch_symbol(sym)) {
        h->cls = "torch_version_mismatch";
    } else if (starts_with(sym, "cuda") || starts_with(sym, "cublas") ||
               starts_with(sym, "cusparse") || starts_with(sym, "cudnn") ||
               starts_with(sym, "__cuda") || starts_with(sym, "nvrtc") ||
               strstr(line, "libcudart")) {
        h->cls = "cuda_version_mismatch";
    } else if (starts_with(sym, "Py") || starts_with(sym, "_Py")) {
        h->cls = "unknown";
        h->tier = 2;
    } else if (strstr(line, "flash_attn") || strstr(line, "torch")) {
        h->cls = "torch_version_mismatch";
    } else {
        h->cls = "unknown";
        h->tier = 2;
    }
}

static void handle_module(const char *line, logc_hit *h) {
    static const char *const ext[] = {"flash_attn",
                                      "flash_attn_2_cuda",
                                      "flash_attn_cuda",
                                      "flash_attn_3",
                                      "flash_attn_3_cuda",
                                      "flash_attn_interface",
                                      "dropout_layer_norm",
                                      "rotary_emb",
                                      "fused_dense_lib",
                                      "fused_softmax_lib",
                                      "xentropy_cuda_lib",
                                      "ft_attention",
                                      "hopper",
                                      NULL};
    /* flash-attn 1.x modules that 2.x no longer has: the importing code pins 1.x */
    static const char *const v1_only[] = {"flash_attn.flash_attention", NULL};
    static const char *const deps[] = {"packaging", "psutil",   "ninja", "wheel", "setuptools",
                                       "einops",    "pybind11", "pip",   NULL};
    const char *p = strstr(line, "No module named ");
    char mod[256], top[256];
    int i;
    if (!p)
        return;
    p += strlen("No module named ");
    if (*p == '\'' || *p == '"')
        p++;
    copy_str(mod, sizeof mod, p,
             strspn(p, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                       "0123456789_."));
    copy_str(top, sizeof top, mod, strcspn(mod, "."));
    copy_str(h->detail, sizeof h->detail, mod, strlen(mod));
    if (!strcmp(mod, "torch")) {
        h->cls = "torch_missing_at_build";
        return;
    }
    if (!strcmp(top, "torch")) {
        h->cls = "torch_version_mismatch";
        return;
    }
    if (!strcmp(top, "triton")) {
        h->cls = "triton_mismatch";
        return;
    }
    for (i = 0; v1_only[i]; i++) {
        if (!strcmp(mod, v1_only[i])) {
            h->cls = "version_pin";
            return;
        }
    }
    for (i = 0; ext[i]; i++) {
        if (!strcmp(top, ext[i])) {
            h->cls = "extension_missing";
            return;
        }
    }
    for (i = 0; deps[i]; i++) {
        if (!strcmp(top, deps[i])) {
            h->cls = "build_deps_missing";
            return;
        }
    }
    h->cls = "unknown";
    h->tier = 2;
}

static void handle_header(const char *line, logc_hit *h) {
    const char *p = strstr(line, "fatal error: ");
    char hdr[256];
    if (p) {
        p += strlen("fatal error: ");
        copy_str(hdr, sizeof hdr, p, token_len(p, ":"));
    } else if ((p = strstr(line, "Cannot open include file: ")) != NULL) {
        p += strlen("Cannot open include file: ");
        p += strspn(p, " \"'");
        copy_str(hdr, sizeof hdr, p, token_len(p, "\"'"));
    } else if ((p = strstr(line, "cannot open source file")) != NULL) {
        p += strlen("cannot open source file");
        p += strspn(p, " \"'");
        copy_str(hdr, sizeof hdr, p, token_len(p, "\"'"));
    } else {
        return;
    }
    /* strip quotes gcc may put around the name */
    {
        char *q = hdr;
        size_t n;
        while (*q == '\'' || *q == '"' || (unsigned char)*q >= 0x80)
            q++;
        n = strcspn(q, "'\"");
        memmove(hdr, q, n);
        hdr[n] = '\0';
    }
    copy_str(h->detail, sizeof h->detail, hdr, strlen(hdr));
    if (starts_with(hdr, "cutlass") || starts_with(hdr, "cute/") || starts_with(hdr, "ck/") ||
        strstr(hdr, "composable_kernel"))
        h->cls = "submodule_missing";
    else if (!strcmp(hdr, "Python.h"))
        h->cls = "build_deps_missing";
    else if (starts_with(hdr, "ATen/") || starts_with(hdr, "c10/") || starts_with(hdr, "torch/"))
        h->cls = "torch_version_mismatch"; /* a torch older (or newer) than the code expects */
    else if (starts_with(hdr, "cu") || starts_with(hdr, "nv") || starts_with(hdr, "thrust/") ||
             starts_with(hdr, "crt/") || starts_with(hdr, "cub/") || starts_with(hdr, "math_") ||
             starts_with(hdr, "device_") || starts_with(hdr, "vector_types"))
        h->cls = "missing_cuda_headers";
    else {
        h->cls = "unknown";
        h->tier = 2;
    }
}

static void handle_libopen(const char *line, logc_hit *h) {
    const char *e = strstr(line, ": cannot open shared object file");
    const char *b;
    char lib[256];
    if (!e)
        return;
    b = e;
    while (b > line && b[-1] != ' ' && b[-1] != '\t' && b[-1] != '\'' && b[-1] != '"' &&
           b[-1] != ':')
        b--;
    copy_str(lib, sizeof lib, b, (size_t)(e - b));
    copy_str(h->detail, sizeof h->detail, lib, strlen(lib));
    if (starts_with(lib, "libcudart") || starts_with(lib, "libcublas") ||
        starts_with(lib, "libcusparse") || starts_with(lib, "libcusolver") ||
        starts_with(lib, "libnvrtc") || starts_with(lib, "libcufft") ||
        starts_with(lib, "libcurand") || starts_with(lib, "libnvToolsExt") ||
        starts_with(lib, "libnvJitLink") || starts_with(lib, "libcudnn"))
        h->cls = "cuda_version_mismatch";
    else if (starts_with(lib, "libcuda.so") || starts_with(lib, "libnvidia-ml"))
        h->cls = "driver_too_old";
    else if (starts_with(lib, "libc10") || starts_with(lib, "libtorch") ||
             starts_with(lib, "libshm"))
        h->cls = "torch_version_mismatch";
    else {
        h->cls = "unknown";
        h->tier = 2;
    }
}

static void handle_vernf(const char *line, logc_hit *h) {
    const char *p = strstr(line, "version `");
    char ver[128];
    if (!p)
        p = strstr(line, "version '");
    if (!p)
        return;
    p += strlen("version `");
    copy_str(ver, sizeof ver, p, token_len(p, "'`"));
    copy_str(h->detail, sizeof h->detail, ver, strlen(ver));
    if (starts_with(ver, "GLIBCXX_") || starts_with(ver, "CXXABI_"))
        h->cls = "glibcxx_too_old";
    else if (starts_with(ver, "GLIBC_"))
        h->cls = "glibc_too_old";
    else if (strstr(ver, "libcudart") || strstr(ver, "CUDA"))
        h->cls = "cuda_version_mismatch";
    else {
        h->cls = "unknown";
        h->tier = 2;
    }
}

static int handle_killed(const char *line) {
    const char *p = line + strspn(line, " \t");
    if (!starts_with(p, "Killed"))
        return 0;
    p += strlen("Killed");
    return p[strspn(p, " \t")] == '\0';
}

/* pip's "No such file or directory: 'C:\\Users\\...'" for a path longer than Windows'
 * MAX_PATH (260) without long paths enabled: the file exists in the sdist, Windows cannot open
 * it. Shorter paths stay a generic error. */
static void handle_winpath(const char *line, logc_hit *h) {
    const char *p = strstr(line, "No such file or directory: '");
    size_t n = 0;
    h->cls = "unknown";
    h->tier = 2;
    if (!p)
        return;
    p += strlen("No such file or directory: '");
    if (!((p[0] >= 'A' && p[0] <= 'Z') || (p[0] >= 'a' && p[0] <= 'z')) || p[1] != ':' ||
        p[2] != '\\')
        return;
    for (; *p && *p != '\''; p++) {
        if (p[0] == '\\' && p[1] == '\\')
            p++; /* Python's repr doubles the backslashes */
        n++;
    }
    if (n >= 250) {
        h->cls = "windows_long_path";
        h->tier = 1;
        snprintf(h->detail, sizeof h->detail, "%zu", n);
    }
}

/* "ModuleNotFoundError: ..." / "torch.cuda.OutOfMemoryError: ..." at the start of the line. */
static int handle_exc(const char *line) {
    const char *p = line + strspn(line, " \t");
    size_t n = strspn(p, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.");
    if (p[n] != ':' || n < 5)
        return 0;
    return (n >= 5 && !strncmp(p + n - 5, "Error", 5)) ||
           (n >= 9 && !strncmp(p + n - 9, "Exception", 9));
}

/* Frames that say what failed when a traceback is cut off before its exception line: a
 * function name or a path piece, and the class it means (innermost informative frame wins). */
static const struct {
    const char *func, *path, *cls;
} frame_rules[] = {
    /* setup.py runs $CUDA_HOME/bin/nvcc -V inside subprocess: nvcc is not there */
    {"get_cuda_bare_metal_version", NULL, "nvcc_missing"},
    {"raise_if_cuda_home_none", NULL, "cuda_home_missing"},
    /* a PEP 517 hook in pip's isolated build env: flash-attn's setup.py imports torch */
    {"get_requires_for_build_wheel", NULL, "torch_missing_at_build"},
    {NULL, "triton/compiler", "triton_mismatch"},
    {NULL, "triton\\compiler", "triton_mismatch"},
};

/* Lines pip prints around a traceback that say which step failed, for the same use. */
static const struct {
    const char *text, *cls;
} context_rules[] = {
    {"Getting requirements to build wheel did not run successfully", "torch_missing_at_build"},
};

static void copy_evidence(char *dst, const char *line, size_t len) {
    while (len && (*line == ' ' || *line == '\t')) {
        line++;
        len--;
    }
    copy_str(dst, LOGC_EVIDENCE_LEN, line, len);
}

/* `File "PATH", line N, in FUNC`: notes the frame when it is informative. A new traceback or
 * an exception line forgets the frames before it. */
static void note_frame(logc *c, const char *line, size_t len, uint64_t line_no) {
    const char *p = strstr(line, "File \""), *q, *fn;
    size_t i;
    for (i = 0; i < sizeof context_rules / sizeof context_rules[0]; i++)
        if (strstr(line, context_rules[i].text) && !c->ctx_cls) {
            c->ctx_cls = context_rules[i].cls;
            copy_evidence(c->ctx_ev, line, len);
            c->ctx_line = line_no;
        }
    if (strstr(line, "Traceback (most recent call last)") || handle_exc(line)) {
        c->frame_cls = NULL;
        return;
    }
    if (!p || !(q = strstr(p + 6, "\", line ")) || !(fn = strstr(q, ", in ")))
        return;
    fn += strlen(", in ");
    for (i = 0; i < sizeof frame_rules / sizeof frame_rules[0]; i++) {
        const char *m = frame_rules[i].path ? strstr(p, frame_rules[i].path) : NULL;
        int hit = frame_rules[i].func
                      ? !strncmp(fn, frame_rules[i].func, strlen(frame_rules[i].func))
                      : m && m < q;
        if (hit) {
            c->frame_cls = frame_rules[i].cls;
            copy_evidence(c->frame_ev, line, len);
            c->frame_line = line_no;
            return;
        }
    }
}

/* Context worth knowing whatever the verdict. */
static void note_context(logc_result *r, const char *line) {
    const char *p;
    if ((p = strstr(line, "Guessing wheel URL:")) != NULL && !r->wheel_url[0]) {
        p += strlen("Guessing wheel URL:");
        p += strspn(p, " \t");
        copy_str(r->wheel_url, sizeof r->wheel_url, p, token_len(p, " \t"));
    }
    if (strstr(line, "HTTP Error 404"))
        r->saw_wheel_404 = 1;
    if (strstr(line, "urlopen error"))
        r->saw_url_error = 1;
    if (strstr(line, "Building from source"))
        r->saw_build_from_source = 1;
    if ((p = strstr(line, "Cuda compilation tools, release ")) != NULL && !r->nvcc_release[0]) {
        p += strlen("Cuda compilation tools, release ");
        copy_str(r->nvcc_release, sizeof r->nvcc_release, p, token_len(p, ", "));
    }
    if ((p = strstr(line, "torch.__version__")) != NULL && !r->torch_version[0]) {
        p += strlen("torch.__version__");
        p += strspn(p, " =:");
        copy_str(r->torch_version, sizeof r->torch_version, p, token_len(p, " \t"));
    }
    if ((p = strstr(line, "detected CUDA version (")) != NULL && !r->cuda_detected[0] &&
        strstr(line, "mismatches the version")) {
        const char *q;
        p += strlen("detected CUDA version (");
        copy_str(r->cuda_detected, sizeof r->cuda_detected, p, token_len(p, ")"));
        q = strstr(p, "compile PyTorch (");
        if (q) {
            q += strlen("compile PyTorch (");
            copy_str(r->cuda_torch, sizeof r->cuda_torch, q, token_len(q, ")"));
        }
    }
    /* torch prints "...used to compile\nPyTorch (12.1). Please ..." over two lines */
    p = line + strspn(line, " \t");
    if (r->cuda_detected[0] && !r->cuda_torch[0] && !strncmp(p, "PyTorch (", 9)) {
        p += 9;
        copy_str(r->cuda_torch, sizeof r->cuda_torch, p, token_len(p, ")"));
    }
    p = line + strspn(line, " \t");
    if (!strncmp(p, "gcc (", 5) && (p = strchr(p, ')')) != NULL && !r->gcc_ver[0]) {
        p += strspn(p, ") ");
        copy_str(r->gcc_ver, sizeof r->gcc_ver, p, token_len(p, " "));
    }
    if ((p = strstr(line, "gcc versions later than ")) != NULL && !r->gcc_max[0]) {
        p += strlen("gcc versions later than ");
        copy_str(r->gcc_max, sizeof r->gcc_max, p, token_len(p, " "));
    }
}

static void add_evidence(logc_result *r, const char *line, size_t len) {
    const char *p = line;
    int i;
    while (len && (*p == ' ' || *p == '\t')) {
        p++;
        len--;
    }
    if (r->n_evidence >= LOGC_MAX_EVIDENCE)
        return;
    for (i = 0; i < r->n_evidence; i++)
        if (strlen(r->evidence[i]) == len && !memcmp(r->evidence[i], p, len))
            return;
    if (len >= LOGC_EVIDENCE_LEN) {
        copy_str(r->evidence[r->n_evidence], LOGC_EVIDENCE_LEN - 4, p, len);
        strcat(r->evidence[r->n_evidence], "...");
    } else {
        copy_str(r->evidence[r->n_evidence], LOGC_EVIDENCE_LEN, p, len);
    }
    r->n_evidence++;
}

void logc_feed(logc *c, const char *line, size_t len, uint64_t line_no) {
    uint64_t cand[NWORDS];
    size_t i, w, st = 0;
    int any = 0;
    logc_result *r = &c->r;
    const char *orig = line, *lang;
    size_t orig_len = len;
    r->lines++;
    r->bytes += len + 1;
    /* a localized message is matched in English; the original is what the evidence quotes */
    if (c->tcap < 2 * len + 64) {
        char *t = realloc(c->tbuf, 2 * len + 64);
        if (t) {
            c->tbuf = t;
            c->tcap = 2 * len + 64;
        }
    }
    lang = c->tcap >= 2 * len + 64 ? logm_to_english(line, len, c->tbuf, c->tcap) : NULL;
    if (lang) {
        if (!r->lang[0])
            copy_str(r->lang, sizeof r->lang, lang, strlen(lang));
        line = c->tbuf;
        len = strlen(c->tbuf);
    }
    note_frame(c, line, len, line_no);
    memcpy(cand, c->always, sizeof cand);
    for (i = 0; i < len; i++) {
        st = c->next[st][fold((unsigned char)line[i])];
        if (c->has_out[st]) {
            for (w = 0; w < NWORDS; w++)
                cand[w] |= c->out[st][w];
            any = 1;
        }
    }
    if (!any)
        return;
    note_context(r, line);
    for (i = 0; i < NUM_RULES; i++) {
        const logc_rule *rule = &rules[i];
        logc_hit h;
        if (rule->tier == 0 || !(cand[i / 64] >> (i % 64) & 1))
            continue;
        if (!glob_match(rule->pattern, line, len, rule->flags & ICASE))
            continue;
        memset(&h, 0, sizeof h);
        h.cls = rule->cls;
        h.tier = rule->tier;
        h.ext_abi = -1;
        switch (rule->handler) {
        case H_UNDEF:
            handle_undef(line, &h);
            break;
        case H_MODULE:
            handle_module(line, &h);
            break;
        case H_HEADER:
            handle_header(line, &h);
            break;
        case H_LIBOPEN:
            handle_libopen(line, &h);
            break;
        case H_VERNF:
            handle_vernf(line, &h);
            break;
        case H_KILLED:
            if (!handle_killed(line))
                continue;
            break;
        case H_EXC:
            if (!handle_exc(line))
                continue;
            break;
        case H_WINPATH:
            handle_winpath(line, &h);
            break;
        default:
            break;
        }
        /* a better tier replaces the verdict; the same class adds evidence */
        if (!c->have_best || h.tier < r->tier) {
            c->have_best = 1;
            r->cls = h.cls;
            r->tier = h.tier;
            r->rule = rule->id;
            r->line_no = line_no;
            r->n_evidence = 0;
            r->ext_abi = h.ext_abi;
            copy_str(r->detail, sizeof r->detail, h.detail, strlen(h.detail));
            copy_str(r->demangled, sizeof r->demangled, h.demangled, strlen(h.demangled));
            add_evidence(r, orig, orig_len);
            r->english[0] = '\0';
            if (lang)
                copy_evidence(r->english, line, len);
        } else if (h.tier == r->tier && !strcmp(h.cls, r->cls) && r->tier <= 2) {
            add_evidence(r, orig, orig_len);
        }
        if (h.tier <= 2)
            c->frame_cls = NULL; /* the traceback had its exception line */
        return; /* the first matching rule decides the line */
    }
}

void logc_result_get(const logc *c, logc_result *out) {
    const char *cls = c->frame_cls ? c->frame_cls : c->ctx_cls;
    *out = c->r;
    if (!cls || (out->tier != 0 && out->tier < 3))
        return;
    /* no error line: the cut-off traceback's frames, else pip's words, say what failed */
    out->cls = cls;
    out->tier = 2;
    out->rule = c->frame_cls ? "frame" : "pip_step";
    out->line_no = c->frame_cls ? c->frame_line : c->ctx_line;
    out->n_evidence = 1;
    out->detail[0] = out->english[0] = '\0';
    copy_str(out->evidence[0], LOGC_EVIDENCE_LEN, c->frame_cls ? c->frame_ev : c->ctx_ev,
             strlen(c->frame_cls ? c->frame_ev : c->ctx_ev));
}

static int classify(logr *rd, logc_result *out) {
    logc *c = logc_new();
    const char *line;
    size_t len;
    if (!c)
        return -1;
    while (logr_next(rd, &line, &len))
        logc_feed(c, line, len, rd->line_no);
    logc_result_get(c, out);
    out->bytes = rd->bytes;
    out->lines = rd->line_no;
    out->truncated_lines = rd->truncated_lines;
    logc_free(c);
    return rd->error ? -1 : 0;
}

int logc_classify_fd(int fd, size_t max_line, logc_result *out) {
    logr rd;
    int r;
    if (logr_init_fd(&rd, fd, max_line) != 0)
        return -1;
    r = classify(&rd, out);
    logr_free(&rd);
    return r;
}

int logc_classify_mem(const void *data, size_t size, size_t max_line, logc_result *out) {
    logr rd;
    int r;
    if (logr_init_mem(&rd, data, size, max_line) != 0)
        return -1;
    r = classify(&rd, out);
    logr_free(&rd);
    return r;
}
