/* SPDX-License-Identifier: MIT */
/*
 * tools/explain/ — `flashattn explain`: a build or import log classified and its fix named; the
 * bounded log reader.
 *
 * logmsg.h — the translated tool and system messages a log may carry (gcc, glibc, binutils,
 * coreutils, bash, git, Windows), so a log from a machine in another locale reads like the
 * English one: each known translation found in a line is replaced by its English msgid before
 * the rules see the line, and the language it came from is noted.
 */
#ifndef FA_TOOLS_LOGMSG_H
#define FA_TOOLS_LOGMSG_H

#include <stddef.h>

/* Copies line[0..len) to out (cap bytes, NUL-terminated) with every known translation
 * replaced by its English text. Returns the language of the first translation found
 * ("zh_CN", "de", ...), or NULL (then out holds the line unchanged). */
const char *logm_to_english(const char *line, size_t len, char *out, size_t cap);

#endif /* FA_TOOLS_LOGMSG_H */
