/* SPDX-License-Identifier: MIT */
/*
 * tools/explain/ — `flashattn explain`: a build or import log classified and its fix named; the
 * bounded log reader.
 *
 * logread.h — reads a build log or traceback line by line in bounded memory, whatever it
 * contains. Lines end at "\n", "\r\n" or a lone "\r" (pip's progress bars); ANSI colour escapes
 * are removed; other control bytes (NUL included) become '?'. A line longer than the cap keeps
 * its first `max_line` bytes and is flagged truncated; the rest is skipped without being stored,
 * so a 100 MB log of 1 MB lines needs only the 64 KiB read buffer plus one capped line.
 *
 * The same cleaning (logr_clean_byte, logr_clean) is how every command shows bytes that came
 * from a file it read (a log, an ELF file's library and symbol names) on a terminal: nothing
 * from the file can move the cursor, clear the screen or set the window title.
 */
#ifndef FA_TOOLS_LOGREAD_H
#define FA_TOOLS_LOGREAD_H

#include <stddef.h>
#include <stdint.h>

#define LOGR_DEFAULT_MAX_LINE 4096

typedef struct logr {
    int fd;                   /* source: a file descriptor, or */
    const unsigned char *mem; /* a memory image */
    size_t mem_size, mem_pos;
    unsigned char buf[65536];
    size_t bpos, blen;
    int eof;
    int error;  /* errno of a failed read, 0 if none */
    char *line; /* max_line + 1 bytes */
    size_t max_line;
    size_t len;       /* bytes stored for the current line */
    int truncated;    /* the current line was longer than max_line */
    int skip_lf;      /* the previous line ended in '\r': a following '\n' belongs to it */
    int esc;          /* ANSI escape state: 0 none, 1 after ESC, 2 inside CSI */
    uint64_t line_no; /* 1-based number of the line last returned */
    uint64_t bytes;   /* bytes consumed so far */
    uint64_t truncated_lines;
} logr;

/* Starts reading from a file descriptor (not closed by logr_free). 0 on success, -1 if out of
 * memory. max_line 0 means LOGR_DEFAULT_MAX_LINE. */
int logr_init_fd(logr *r, int fd, size_t max_line);

/* Starts reading from memory (the fuzzer, tests). */
int logr_init_mem(logr *r, const void *data, size_t size, size_t max_line);

/* The next line: 1 and (*line, *len) — NUL-terminated, valid until the next call — or 0 at the
 * end of the input (or on a read error: r->error). */
int logr_next(logr *r, const char **line, size_t *len);

void logr_free(logr *r);

/* One byte of a line as shown on a terminal: an ANSI CSI sequence (ESC [ ... final byte
 * 0x40-0x7e) and any other ESC pair are dropped, the other control bytes (0x00-0x1f except TAB,
 * and 0x7f) become '?'. *esc carries the escape state from byte to byte (0 at the start of a
 * line). Returns the byte to keep, or -1 to drop it. */
int logr_clean_byte(int *esc, unsigned char c);

/* src (NULL: "") cleaned that way, '\n' and '\r' becoming '?' too, into dst: cap bytes,
 * NUL-terminated, cut at cap - 1 bytes, nothing written when cap is 0. dst may be src (the
 * cleaned text is never longer). Returns dst. */
char *logr_clean(char *dst, size_t cap, const char *src);

#endif /* FA_TOOLS_LOGREAD_H */
