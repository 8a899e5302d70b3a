/* SPDX-License-Identifier: MIT */
/*
 * tools/doctor/ — the install doctor: `flashattn doctor`, its findings and the extension-module
 * check.
 *
 * findings.h — the doctor's output model: a list of findings, each with a mark ([✓] ok,
 * [!] warning, [✗] problem), a one-line title, evidence lines and the exact command that fixes
 * it, grouped in sections; printed as text (colour only on a terminal, and never with
 * NO_COLOR) or as JSON.
 */
#ifndef FA_TOOLS_FINDINGS_H
#define FA_TOOLS_FINDINGS_H

#include <stddef.h>
#include <stdio.h>

#define FIND_MAX_EVIDENCE 10

enum { FIND_OK = 0, FIND_WARN = 1, FIND_PROBLEM = 2 };

typedef struct finding {
    const char *section; /* static string */
    char id[48];         /* stable name for scripts: "driver", "nvcc_vs_torch", ... */
    int status;
    char title[512];
    char evidence[FIND_MAX_EVIDENCE][640];
    int n_evidence;
    char fix[1536]; /* "" when nothing needs doing */
} finding;

typedef struct findings {
    finding *items;
    size_t n, cap;
} findings;

/* Appends a finding (title printf-style); NULL only when out of memory. */
finding *find_add(findings *f, const char *section, const char *id, int status, const char *fmt,
                  ...);
void find_evidence(finding *x, const char *fmt, ...);
void find_fix(finding *x, const char *fmt, ...);
void find_free(findings *f);

/* Counts by status. */
void find_count(const findings *f, int *ok, int *warn, int *problem);

void find_print_text(const findings *f, FILE *out, int color, int verbose);
/* The "findings" array (no surrounding object). */
void find_print_json_array(const findings *f, FILE *out);

#endif /* FA_TOOLS_FINDINGS_H */
