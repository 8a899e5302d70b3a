/* SPDX-License-Identifier: MIT */
/*
 * tools/cli/ — the `flashattn` command's entry (main.c's table of subcommands, `info`) and the
 * helpers every subcommand shares.
 *
 * json.c — JSON string output with escaping and UTF-8 validation (see json.h).
 */
#define _POSIX_C_SOURCE 200809L

#include "json.h"

#include <string.h>

/* Length of the valid UTF-8 sequence at s (at most n bytes), or 0 if it is not valid. */
static size_t utf8_len(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    size_t len, i;
    unsigned long cp;
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf) {
        len = 2;
        cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        cp = c & 0x07;
    } else {
        return 0;
    }
    if (len > n)
        return 0;
    for (i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    /* overlong forms, surrogates, beyond U+10FFFF */
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
        (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return len;
}

void json_string_n(FILE *f, const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    fputc('"', f);
    while (i < n) {
        unsigned char c = s[i];
        size_t k;
        if (c == '"' || c == '\\') {
            fputc('\\', f);
            fputc(c, f);
            i++;
        } else if (c == '\n') {
            fputs("\\n", f);
            i++;
        } else if (c == '\t') {
            fputs("\\t", f);
            i++;
        } else if (c == '\r') {
            fputs("\\r", f);
            i++;
        } else if (c < 0x20 || c == 0x7f) {
            fprintf(f, "\\u%04x", c);
            i++;
        } else if ((k = utf8_len(s + i, n - i)) == 0) {
            fputs("\\ufffd", f);
            i++;
        } else {
            fwrite(s + i, 1, k, f);
            i += k;
        }
    }
    fputc('"', f);
}

void json_string(FILE *f, const char *s) {
    if (!s) {
        fputs("null", f);
        return;
    }
    json_string_n(f, s, strlen(s));
}
