/* SPDX-License-Identifier: MIT */
/*
 * tools/explain/ — `flashattn explain`: a build or import log classified and its fix named; the
 * bounded log reader.
 *
 * logclass.h — finds the first real error in a pip / setup.py / ninja / nvcc build log or a
 * Python import traceback and names its class.
 *
 * Every line is matched against a table of rules; each rule has a class and a tier:
 *   1  a root cause with a known class (undefined symbol, nvcc #error about gcc, OOM kill, ...)
 *   2  a generic error message (a compiler "error:", an exception line "XError: ...")
 *   3  a failure marker that only follows an error (ninja "FAILED:", "Failed building wheel")
 *   4  setup.py's failed wheel download (the 404 / URLError traceback printed after a failed
 *      source build, or before a successful one)
 *   5  "Precompiled wheel not found. Building from source..."
 * The answer is the earliest line of the best (lowest) tier, so cascades of compiler errors and
 * the tracebacks that follow the real error never win over it. A log with no line of tier 1 or
 * 2 whose last traceback lost its exception line is classified from that traceback's innermost
 * informative frame (or the pip step that failed), at tier 2. Lines in another language are
 * matched in English (logmsg.h); the evidence quotes the original and `english` its meaning.
 * The log is streamed; memory is bounded by the line cap.
 */
#ifndef FA_TOOLS_LOGCLASS_H
#define FA_TOOLS_LOGCLASS_H

#include <stddef.h>
#include <stdint.h>

#define LOGC_MAX_EVIDENCE 4
#define LOGC_EVIDENCE_LEN 1024

typedef struct logc_result {
    const char *cls;  /* one of logc_class_names; "unknown" when nothing was recognized */
    int tier;         /* 0 when no error line was found at all */
    const char *rule; /* short id of the rule that matched (for the fix text) */
    uint64_t line_no; /* line of the first evidence line */
    char evidence[LOGC_MAX_EVIDENCE][LOGC_EVIDENCE_LEN];
    int n_evidence;
    char detail[512];     /* the symbol, header, module, library or version the rule found */
    char demangled[1024]; /* for an undefined symbol, when it demangles */
    int ext_abi;          /* undefined symbol: ABI the extension was built with (0/1), -1 unknown */
    /* context seen anywhere in the log */
    char wheel_url[512]; /* "Guessing wheel URL: ..." */
    int saw_wheel_404;   /* setup.py's download got HTTP 404 */
    int saw_url_error;   /* setup.py's download failed for network reasons */
    int saw_build_from_source;
    char nvcc_release[32];                  /* "Cuda compilation tools, release 12.4" */
    char torch_version[64];                 /* "torch.__version__  = 2.4.0+cu121" */
    char cuda_detected[32], cuda_torch[32]; /* torch's CUDA version mismatch message */
    char gcc_max[16];                       /* "gcc versions later than 12 are not supported" */
    char gcc_ver[32];                       /* "gcc (GCC) 7.5.0" banner: "7.5.0" */
    char lang[8];                           /* language of the first translated message, or "" */
    char english[LOGC_EVIDENCE_LEN];        /* the first evidence line in English, if translated */
    uint64_t lines, bytes, truncated_lines;
} logc_result;

/* All class names, in a fixed order, NULL-terminated. */
extern const char *const logc_class_names[];

typedef struct logc logc;

/* A classifier with its rule automaton built; NULL if out of memory. */
logc *logc_new(void);
void logc_free(logc *c);
/* Forgets everything fed so far (the automaton is kept). */
void logc_reset(logc *c);
/* One line (without its terminator; control bytes should already be replaced, as logread does). */
void logc_feed(logc *c, const char *line, size_t len, uint64_t line_no);
/* The verdict for everything fed so far. */
void logc_result_get(const logc *c, logc_result *out);

/* Convenience: streams a file descriptor or a memory image through logread and logc.
 * Returns 0, or -1 on a read error or out of memory. */
int logc_classify_fd(int fd, size_t max_line, logc_result *out);
int logc_classify_mem(const void *data, size_t size, size_t max_line, logc_result *out);

#endif /* FA_TOOLS_LOGCLASS_H */
