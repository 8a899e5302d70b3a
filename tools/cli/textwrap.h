/* SPDX-License-Identifier: MIT */
/*
 * tools/cli/ — the `flashattn` command's entry (main.c's table of subcommands, `info`) and the
 * helpers every subcommand shares.
 *
 * textwrap.h — prints a long line of prose wrapped at a width with a hanging indent, breaking
 * at spaces only (URLs and commands stay whole), for the doctor's and explain's text output.
 */
#ifndef FA_TOOLS_TEXTWRAP_H
#define FA_TOOLS_TEXTWRAP_H

#include <stdio.h>
#include <string.h>

/* Writes `first` then text, continuing lines with `indent`; lines end by `width` columns
 * (counting bytes, which is close enough for the mostly ASCII text printed). */
static inline void wrap_print(FILE *out, const char *first, const char *indent, const char *text,
                              size_t width) {
    size_t col = strlen(first), ind = strlen(indent);
    const char *p = text;
    int line_start = 1;
    fputs(first, out);
    while (*p) {
        size_t word = strcspn(p, " ");
        if (!line_start && col + 1 + word > width) {
            fputc('\n', out);
            fputs(indent, out);
            col = ind;
            line_start = 1;
        }
        if (!line_start) {
            fputc(' ', out);
            col++;
        }
        fwrite(p, 1, word, out);
        col += word;
        line_start = 0;
        p += word;
        while (*p == ' ')
            p++;
    }
    fputc('\n', out);
}

#endif /* FA_TOOLS_TEXTWRAP_H */
