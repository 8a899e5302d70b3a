/* SPDX-License-Identifier: MIT */
/*
 * tools/doctor/ — the install doctor: `flashattn doctor`, its findings and the extension-module
 * check.
 *
 * findings.c — collecting and printing the doctor's findings (see findings.h). The text layout
 * follows `flutter doctor`: one line per check with its mark, details indented below it; a
 * section heading whenever the section changes; a closing summary line.
 */
#define _POSIX_C_SOURCE 200809L

#include "findings.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "../cli/json.h"
#include "../cli/textwrap.h"
#include "../explain/logread.h"

finding *find_add(findings *f, const char *section, const char *id, int status, const char *fmt,
                  ...) {
    finding *x;
    va_list ap;
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 32;
        finding *items = realloc(f->items, cap * sizeof *items);
        if (!items)
            return NULL;
        f->items = items;
        f->cap = cap;
    }
    x = &f->items[f->n++];
    memset(x, 0, sizeof *x);
    x->section = section;
    snprintf(x->id, sizeof x->id, "%s", id);
    x->status = status;
    va_start(ap, fmt);
    vsnprintf(x->title, sizeof x->title, fmt, ap);
    va_end(ap);
    return x;
}

void find_evidence(finding *x, const char *fmt, ...) {
    va_list ap;
    if (!x || x->n_evidence >= FIND_MAX_EVIDENCE)
        return;
    va_start(ap, fmt);
    vsnprintf(x->evidence[x->n_evidence++], sizeof x->evidence[0], fmt, ap);
    va_end(ap);
}

void find_fix(finding *x, const char *fmt, ...) {
    va_list ap;
    if (!x)
        return;
    va_start(ap, fmt);
    vsnprintf(x->fix, sizeof x->fix, fmt, ap);
    va_end(ap);
}

void find_free(findings *f) {
    free(f->items);
    f->items = NULL;
    f->n = f->cap = 0;
}

void find_count(const findings *f, int *ok, int *warn, int *problem) {
    size_t i;
    *ok = *warn = *problem = 0;
    for (i = 0; i < f->n; i++) {
        if (f->items[i].status == FIND_OK)
            (*ok)++;
        else if (f->items[i].status == FIND_WARN)
            (*warn)++;
        else
            (*problem)++;
    }
}

static const char *mark(int status) {
    return status == FIND_OK ? "[✓]" : status == FIND_WARN ? "[!]" : "[✗]";
}

static const char *colour(int status) {
    return status == FIND_OK ? "\033[32m" : status == FIND_WARN ? "\033[33m" : "\033[31m";
}

/* The text of a finding holds what the probes read (Python's error messages, an extension's
 * symbol names): it is shown as explain shows a log (logread.h), escape sequences removed. */
void find_print_text(const findings *f, FILE *out, int color, int verbose) {
    const char *section = NULL;
    size_t i;
    int ok, warn, problem, k;
    char text[sizeof f->items[0].fix];
    for (i = 0; i < f->n; i++) {
        const finding *x = &f->items[i];
        if (!section || strcmp(section, x->section) != 0) {
            section = x->section;
            fprintf(out, "\n%s%s%s\n", color ? "\033[1m" : "", section, color ? "\033[0m" : "");
        }
        fprintf(out, "%s%s%s %s\n", color ? colour(x->status) : "", mark(x->status),
                color ? "\033[0m" : "", logr_clean(text, sizeof text, x->title));
        for (k = 0; k < x->n_evidence && (verbose || x->status != FIND_OK || k < 4); k++)
            wrap_print(out, "    • ", "      ", logr_clean(text, sizeof text, x->evidence[k]), 100);
        if (x->fix[0])
            wrap_print(out, "    fix: ", "         ", logr_clean(text, sizeof text, x->fix), 100);
    }
    find_count(f, &ok, &warn, &problem);
    if (!problem && !warn)
        fprintf(out, "\n• No issues found! (%d checks)\n", ok);
    else
        fprintf(out, "\n%s Doctor found %d problem%s and %d warning%s (%d checks ok).\n",
                problem ? "✗" : "!", problem, problem == 1 ? "" : "s", warn, warn == 1 ? "" : "s",
                ok);
}

void find_print_json_array(const findings *f, FILE *out) {
    size_t i;
    int k;
    fputc('[', out);
    for (i = 0; i < f->n; i++) {
        const finding *x = &f->items[i];
        fprintf(out, "%s\n    {\"section\": ", i ? "," : "");
        json_string(out, x->section);
        fputs(", \"id\": ", out);
        json_string(out, x->id);
        fprintf(out, ", \"status\": \"%s\", \"mark\": ",
                x->status == FIND_OK     ? "ok"
                : x->status == FIND_WARN ? "warning"
                                         : "problem");
        json_string(out, mark(x->status));
        fputs(", \"title\": ", out);
        json_string(out, x->title);
        fputs(", \"evidence\": [", out);
        for (k = 0; k < x->n_evidence; k++) {
            if (k)
                fputs(", ", out);
            json_string(out, x->evidence[k]);
        }
        fputs("], \"fix\": ", out);
        if (x->fix[0])
            json_string(out, x->fix);
        else
            fputs("null", out);
        fputc('}', out);
    }
    fputs(f->n ? "\n  ]" : "]", out);
}
