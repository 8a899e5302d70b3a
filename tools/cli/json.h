/* SPDX-License-Identifier: MIT */
/*
 * tools/cli/ — the `flashattn` command's entry (main.c's table of subcommands, `info`) and the
 * helpers every subcommand shares.
 *
 * json.h — the little JSON the doctor, wheel and explain commands print: strings escaped per
 * RFC 8259, always valid UTF-8 (bytes of an invalid sequence become U+FFFD), so a log full of
 * binary garbage still yields a document any parser accepts.
 */
#ifndef FA_TOOLS_JSON_H
#define FA_TOOLS_JSON_H

#include <stddef.h>
#include <stdio.h>

/* Writes s (n bytes) as a quoted JSON string. */
void json_string_n(FILE *f, const char *s, size_t n);

/* Writes a NUL-terminated string, or null for NULL. */
void json_string(FILE *f, const char *s);

#endif /* FA_TOOLS_JSON_H */
