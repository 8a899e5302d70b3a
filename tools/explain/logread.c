/* SPDX-License-Identifier: MIT */
/*
 * tools/explain/ — `flashattn explain`: a build or import log classified and its fix named; the
 * bounded log reader.
 *
 * logread.c — bounded line reader for logs (see logread.h). One pass over the bytes: split on
 * "\n" / "\r\n" / "\r", drop ANSI CSI escapes (ESC [ ... final byte) and other ESC pairs, map
 * the remaining control bytes except TAB to '?' (logr_clean_byte, which the commands also use for
 * strings read from other files), keep at most max_line bytes of each line.
 */
#define _POSIX_C_SOURCE 200809L

#include "logread.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int init(logr *r, size_t max_line) {
    memset(r, 0, sizeof *r);
    r->fd = -1;
    r->max_line = max_line ? max_line : LOGR_DEFAULT_MAX_LINE;
    r->line = malloc(r->max_line + 1);
    if (!r->line)
        return -1;
    r->line[0] = '\0';
    return 0;
}

int logr_init_fd(logr *r, int fd, size_t max_line) {
    if (init(r, max_line) != 0)
        return -1;
    r->fd = fd;
    return 0;
}

int logr_init_mem(logr *r, const void *data, size_t size, size_t max_line) {
    if (init(r, max_line) != 0)
        return -1;
    r->mem = data;
    r->mem_size = data ? size : 0;
    return 0;
}

void logr_free(logr *r) {
    if (!r)
        return;
    free(r->line);
    r->line = NULL;
}

/* Refills buf; 0 at the end of input. */
static size_t fill(logr *r) {
    r->bpos = 0;
    r->blen = 0;
    if (r->eof)
        return 0;
    if (r->mem) {
        size_t n = r->mem_size - r->mem_pos;
        if (n > sizeof r->buf)
            n = sizeof r->buf;
        memcpy(r->buf, r->mem + r->mem_pos, n);
        r->mem_pos += n;
        r->blen = n;
    } else if (r->fd >= 0) {
        for (;;) {
            ssize_t n = read(r->fd, r->buf, sizeof r->buf);
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0) {
                r->error = errno;
                n = 0;
            }
            r->blen = (size_t)n;
            break;
        }
    }
    if (r->blen == 0)
        r->eof = 1;
    return r->blen;
}

static void keep(logr *r, unsigned char c) {
    if (r->len < r->max_line)
        r->line[r->len++] = (char)c;
    else
        r->truncated = 1;
}

int logr_clean_byte(int *esc, unsigned char c) {
    if (*esc == 1) { /* after ESC: '[' starts a CSI sequence, anything else ends it */
        *esc = c == '[' ? 2 : 0;
        return -1;
    }
    if (*esc == 2) { /* CSI: parameters until a final byte 0x40-0x7e */
        if (c >= 0x40 && c <= 0x7e)
            *esc = 0;
        return -1;
    }
    if (c == 0x1b) {
        *esc = 1;
        return -1;
    }
    if ((c < 0x20 && c != '\t') || c == 0x7f)
        return '?';
    return c;
}

char *logr_clean(char *dst, size_t cap, const char *src) {
    const unsigned char *s = (const unsigned char *)src;
    size_t n = 0;
    int esc = 0;
    if (!cap)
        return dst;
    if (!src)
        s = (const unsigned char *)"";
    for (; *s && n + 1 < cap; s++) {
        int k = logr_clean_byte(&esc, *s);
        if (k >= 0)
            dst[n++] = (char)k;
    }
    dst[n] = '\0';
    return dst;
}

int logr_next(logr *r, const char **line, size_t *len) {
    int any = 0, k;
    r->len = 0;
    r->truncated = 0;
    r->esc = 0;
    for (;;) {
        unsigned char c;
        if (r->bpos >= r->blen && fill(r) == 0)
            break;
        c = r->buf[r->bpos++];
        r->bytes++;
        if (r->skip_lf) {
            r->skip_lf = 0;
            if (c == '\n')
                continue;
        }
        if (c == '\n' || c == '\r') {
            if (c == '\r')
                r->skip_lf = 1;
            any = 1;
            goto done;
        }
        any = 1;
        k = logr_clean_byte(&r->esc, c);
        if (k >= 0)
            keep(r, (unsigned char)k);
    }
done:
    if (!any)
        return 0;
    r->line[r->len] = '\0';
    r->line_no++;
    if (r->truncated)
        r->truncated_lines++;
    *line = r->line;
    *len = r->len;
    return 1;
}
