/* SPDX-License-Identifier: MIT */
/*
 * tools/wheel/ — `flashattn wheel`: the flash-attn wheel that fits this machine, from the release
 * table.
 *
 * refresh.h — `flashattn wheel --refresh`: the release table rebuilt from flash-attn's public
 * release listing (GitHub's releases API), kept in a per-user cache file that later runs read
 * before the bundled table.
 */
#ifndef FA_TOOLS_REFRESH_H
#define FA_TOOLS_REFRESH_H

#include <stddef.h>

/* Where the listing is read from unless FLASHATTN_RELEASES_URL names another (file:// too). */
extern const char rel_listing_url[];

/* The cache file: $XDG_CACHE_HOME/flashattn/releases.tsv, else ~/.cache/flashattn/releases.tsv.
 * 0, or -1 when neither variable is set. */
int rel_cache_path(char *out, size_t cap);

/* Reads the cache file and makes it the table in use (rel_use_table). 1 when it was read, 0 when
 * there is none, -1 with `err` when it is unreadable or malformed (the bundled table stays). */
int rel_cache_load(const char *path, char *err, size_t cap);

/* Fetches the listing at `url`, parses its wheel names into a table (releases it does not name
 * keep their bundled rows) and writes it to `path` atomically. 0 with a summary in `msg`, or -1
 * with a one-line reason in `msg` and nothing written. */
int rel_refresh(const char *url, const char *path, char *msg, size_t cap);

#endif /* FA_TOOLS_REFRESH_H */
