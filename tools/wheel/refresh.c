/* SPDX-License-Identifier: MIT */
/*
 * tools/wheel/ — `flashattn wheel`: the flash-attn wheel that fits this machine, from the release
 * table.
 *
 * refresh.c — `flashattn wheel --refresh` (see refresh.h).
 *
 * The listing is fetched by running curl (wget when curl is missing) through posix_spawnp, its
 * output read from a pipe, with a 30 s limit. Both are on every machine that downloads wheels
 * (pip's users, CI images); running them keeps TLS, proxies ($https_proxy) and certificates
 * the system's business, and links nothing into flashattn. A file:// URL is read directly.
 *
 * Wheel names are parsed with rel_parse_wheel; what they cannot say (the glibc the wheels need,
 * Blackwell code) comes from the bundled row of that release, else from the newest bundled
 * release before it.
 */
#define _POSIX_C_SOURCE 200809L

#include "refresh.h"

#include <errno.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../probe/verutil.h"
#include "releases.h"

extern char **environ;

const char rel_listing_url[] =
    "https://api.github.com/repos/Dao-AILab/flash-attention/releases?per_page=100";

enum { MAX_ROWS = 128, MAX_TORCH = 16, MAX_CUDA = 4, MAX_MACH = 4, FIELD = 96 };
enum { MAX_LISTING = 32 << 20, MAX_NAMES = 8192 };

/* One release as read from the cache or the listing. */
typedef struct row {
    char version[64], torch[FIELD], cuda[32], glibc[16], machines[64];
    int py_min, py_max, blackwell;
} row;

/* The table made by rel_cache_load or rel_refresh: rows, and the rel_info view of them. */
static struct {
    row r[MAX_ROWS];
    rel_info info[MAX_ROWS];
    char checked[16], source[512];
    size_t n;
} tab;

/* Points tab.info at tab.r and makes it the table in use. */
static void use_tab(void) {
    size_t i;
    for (i = 0; i < tab.n; i++) {
        row *r = &tab.r[i];
        tab.info[i] = (rel_info){r->version, r->py_min, r->py_max,    r->torch,
                                 r->cuda,    r->glibc,  r->blackwell, r->machines};
    }
    rel_use_table(tab.info, tab.n, tab.checked, tab.source);
}

int rel_cache_path(char *out, size_t cap) {
    const char *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    if (x && *x)
        snprintf(out, cap, "%s/flashattn/releases.tsv", x);
    else if (h && *h)
        snprintf(out, cap, "%s/.cache/flashattn/releases.tsv", h);
    else
        return -1;
    return 0;
}

/* ---- the cache file ------------------------------------------------------------------------- */

/* s into dst[cap]; -1 (nothing copied) when it does not fit. */
static int put_field(char *dst, size_t cap, const char *s) {
    const size_t n = strlen(s);
    if (n >= cap)
        return -1;
    memcpy(dst, s, n + 1);
    return 0;
}

/* One row: version, py_min, py_max, torch, cuda, glibc, blackwell, machines (tab-separated). */
static int parse_row(char *line, size_t i) {
    char *f[8], *p = line, *end;
    row *r;
    int k;
    for (k = 0; k < 8; k++) {
        f[k] = p;
        p = strchr(p, '\t');
        if (k < 7 && !p)
            return -1;
        if (p)
            *p++ = '\0';
    }
    if (p || !*f[0] || !*f[3] || !*f[4] || !*f[7])
        return -1;
    r = &tab.r[i];
    if (put_field(r->version, sizeof r->version, f[0]) ||
        put_field(r->torch, sizeof r->torch, f[3]) || put_field(r->cuda, sizeof r->cuda, f[4]) ||
        put_field(r->glibc, sizeof r->glibc, f[5]) ||
        put_field(r->machines, sizeof r->machines, f[7]))
        return -1; /* a field longer than any real one: a malformed cache */
    r->py_min = (int)strtol(f[1], &end, 10);
    if (*end || r->py_min <= 0)
        return -1;
    r->py_max = (int)strtol(f[2], &end, 10);
    if (*end || r->py_max < r->py_min)
        return -1;
    r->blackwell = (int)strtol(f[6], &end, 10);
    return *end || (r->blackwell != 0 && r->blackwell != 1) ? -1 : 0;
}

int rel_cache_load(const char *path, char *err, size_t cap) {
    FILE *f = fopen(path, "r");
    char line[1024];
    size_t n = 0;
    int lineno = 0, have_date = 0;
    if (!f) {
        if (errno == ENOENT)
            return 0;
        snprintf(err, cap, "cannot read %s: %s", path, strerror(errno));
        return -1;
    }
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = '\0';
        lineno++;
        if (line[0] == '#' || !line[0])
            continue;
        if (!strncmp(line, "checked\t", 8) && strlen(line + 8) == 10) {
            snprintf(tab.checked, sizeof tab.checked, "%s", line + 8);
            have_date = 1;
        } else if (n >= MAX_ROWS || parse_row(line, n) != 0) {
            snprintf(err, cap, "%s line %d is not a release row", path, lineno);
            fclose(f);
            return -1;
        } else {
            n++;
        }
    }
    fclose(f);
    if (!have_date || !n) {
        snprintf(err, cap, "%s has no %s", path, have_date ? "release" : "'checked' date");
        return -1;
    }
    tab.n = n;
    snprintf(tab.source, sizeof tab.source, "%s", path);
    use_tab();
    return 1;
}

/* Writes the table to path through a temporary file in the same folder, then renames it. */
static int write_cache(const char *path, char *msg, size_t cap) {
    char dir[512], tmp[600], *slash;
    FILE *f;
    size_t i;
    snprintf(dir, sizeof dir, "%s", path);
    for (slash = strchr(dir + 1, '/'); slash; slash = strchr(slash + 1, '/')) {
        *slash = '\0';
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
            snprintf(msg, cap, "cannot create %s: %s", dir, strerror(errno));
            return -1;
        }
        *slash = '/';
    }
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    f = fopen(tmp, "w");
    if (!f) {
        snprintf(msg, cap, "cannot write %s: %s", tmp, strerror(errno));
        return -1;
    }
    fprintf(f, "# flash-attn releases, written by `flashattn wheel --refresh` from %s\n",
            tab.source);
    fprintf(f, "# version\tpy_min\tpy_max\ttorch\tcuda\tglibc\tblackwell\tmachines\n");
    fprintf(f, "checked\t%s\n", tab.checked);
    for (i = 0; i < tab.n; i++) {
        const row *r = &tab.r[i];
        fprintf(f, "%s\t%d\t%d\t%s\t%s\t%s\t%d\t%s\n", r->version, r->py_min, r->py_max, r->torch,
                r->cuda, r->glibc, r->blackwell, r->machines);
    }
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        snprintf(msg, cap, "cannot write %s: %s", path, strerror(errno));
        remove(tmp);
        return -1;
    }
    return 0;
}

/* ---- fetching ------------------------------------------------------------------------------- */

/* Runs argv with its stdout into *buf (malloc'd). 0, 127 when the program is missing, else its
 * exit status or -1. */
static int run_capture(char *const argv[], char **buf, size_t *len) {
    posix_spawn_file_actions_t fa;
    int fd[2], status = 0, rc;
    pid_t pid;
    size_t cap = 1 << 16;
    ssize_t got;
    *len = 0;
    *buf = malloc(cap + 1);
    if (!*buf || pipe(fd) != 0)
        return -1;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fd[1], 1);
    posix_spawn_file_actions_addclose(&fa, fd[0]);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", 1, 0);
    rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fd[1]);
    if (rc != 0) {
        close(fd[0]);
        return rc == ENOENT ? 127 : -1;
    }
    while ((got = read(fd[0], *buf + *len, cap - *len)) > 0 || (got < 0 && errno == EINTR)) {
        char *more;
        if (got < 0)
            continue;
        *len += (size_t)got;
        if (*len == cap && cap < MAX_LISTING) {
            more = realloc(*buf, cap * 2 + 1);
            if (!more)
                break;
            *buf = more;
            cap *= 2;
        } else if (*len == cap) {
            break;
        }
    }
    close(fd[0]);
    (*buf)[*len] = '\0';
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static int fetch(const char *url, char **buf, size_t *len, char *msg, size_t cap) {
    char *curl[] = {"curl",      "-fsSL", "--max-time",
                    "30",        "-H",    "Accept: application/vnd.github+json",
                    (char *)url, NULL};
    char *wget[] = {"wget", "-q", "-T", "30", "-O", "-", (char *)url, NULL};
    int rc;
    if (!strncmp(url, "file://", 7)) {
        FILE *f = fopen(url + 7, "rb");
        long n;
        if (!f || fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || n > MAX_LISTING ||
            fseek(f, 0, SEEK_SET) != 0 || !(*buf = malloc((size_t)n + 1)) ||
            fread(*buf, 1, (size_t)n, f) != (size_t)n) {
            snprintf(msg, cap, "cannot read %s: %s", url + 7, errno ? strerror(errno) : "error");
            if (f)
                fclose(f);
            return -1;
        }
        fclose(f);
        (*buf)[n] = '\0';
        *len = (size_t)n;
        return 0;
    }
    rc = run_capture(curl, buf, len);
    if (rc == 127) {
        free(*buf);
        rc = run_capture(wget, buf, len);
        if (rc == 127) {
            snprintf(msg, cap, "neither curl nor wget is installed to fetch %s", url);
            return -1;
        }
    }
    if (rc != 0) {
        snprintf(msg, cap,
                 "could not fetch %s (no network, a proxy, or GitHub's rate limit; %s "
                 "exit status %d)",
                 url, "the downloader's", rc);
        return -1;
    }
    return 0;
}

/* ---- the listing ---------------------------------------------------------------------------- */

/* A JSON reader that checks the whole document and collects every string value of a "name"
 * member that ends in ".whl". */
typedef struct jreader {
    const char *p, *end;
    char (*names)[256];
    size_t n;
    const char *error;
} jreader;

static void jspace(jreader *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
}

/* A string into out (escapes other than \" \\ \/ become '?'); -1 if malformed. */
static int jstring(jreader *j, char *out, size_t cap) {
    size_t k = 0;
    if (j->p >= j->end || *j->p != '"')
        return -1;
    for (j->p++; j->p < j->end && *j->p != '"'; j->p++) {
        char c = *j->p;
        if ((unsigned char)c < 0x20)
            return -1;
        if (c == '\\') {
            if (++j->p >= j->end)
                return -1;
            c = *j->p;
            if (c == 'u') {
                if (j->end - j->p < 5)
                    return -1;
                j->p += 4;
                c = '?';
            } else if (!strchr("\"\\/bfnrt", c)) {
                return -1;
            } else if (c != '"' && c != '\\' && c != '/') {
                c = '?';
            }
        }
        if (k + 1 < cap)
            out[k++] = c;
    }
    if (j->p >= j->end)
        return -1;
    j->p++;
    if (cap)
        out[k] = '\0';
    return 0;
}

static int jvalue(jreader *j, const char *key, int depth) {
    char s[256];
    jspace(j);
    if (j->p >= j->end || depth > 64)
        return -1;
    if (*j->p == '"') {
        size_t n;
        if (jstring(j, s, sizeof s) != 0)
            return -1;
        n = strlen(s);
        if (key && !strcmp(key, "name") && n > 4 && !strcmp(s + n - 4, ".whl") && j->n < MAX_NAMES)
            memcpy(j->names[j->n++], s, n + 1);
        return 0;
    }
    if (*j->p == '{' || *j->p == '[') {
        char close = *j->p == '{' ? '}' : ']', k[64];
        j->p++;
        jspace(j);
        if (j->p < j->end && *j->p == close) {
            j->p++;
            return 0;
        }
        for (;;) {
            if (close == '}') {
                jspace(j);
                if (jstring(j, k, sizeof k) != 0)
                    return -1;
                jspace(j);
                if (j->p >= j->end || *j->p++ != ':')
                    return -1;
            }
            if (jvalue(j, close == '}' ? k : NULL, depth + 1) != 0)
                return -1;
            jspace(j);
            if (j->p < j->end && *j->p == ',') {
                j->p++;
                continue;
            }
            if (j->p < j->end && *j->p == close) {
                j->p++;
                return 0;
            }
            return -1;
        }
    }
    if (!strncmp(j->p, "true", 4) || !strncmp(j->p, "null", 4)) {
        j->p += 4;
        return 0;
    }
    if (!strncmp(j->p, "false", 5)) {
        j->p += 5;
        return 0;
    }
    {
        char *e;
        strtod(j->p, &e);
        if (e == j->p)
            return -1;
        j->p = e;
    }
    return 0;
}

/* Adds word to the space-separated list in order (by ver_cmp), once. */
static void add_word(char *list, size_t cap, const char *w) {
    char out[FIELD] = "", *save = NULL, copy[FIELD], *p;
    int placed = 0;
    snprintf(copy, sizeof copy, "%s", list);
    for (p = strtok_r(copy, " ", &save); p; p = strtok_r(NULL, " ", &save)) {
        if (!strcmp(p, w))
            return;
        if (!placed && ver_cmp(w, p) < 0) {
            snprintf(out + strlen(out), sizeof out - strlen(out), "%s%s", out[0] ? " " : "", w);
            placed = 1;
        }
        snprintf(out + strlen(out), sizeof out - strlen(out), "%s%s", out[0] ? " " : "", p);
    }
    if (!placed)
        snprintf(out + strlen(out), sizeof out - strlen(out), "%s%s", out[0] ? " " : "", w);
    snprintf(list, cap, "%s", out);
}

/* The row for version, added (empty) when new; NULL when the table is full. */
static row *row_for(const char *version) {
    size_t i;
    for (i = 0; i < tab.n; i++)
        if (!strcmp(tab.r[i].version, version))
            return &tab.r[i];
    if (tab.n >= MAX_ROWS)
        return NULL;
    memset(&tab.r[i], 0, sizeof tab.r[i]);
    snprintf(tab.r[i].version, sizeof tab.r[i].version, "%s", version);
    tab.r[i].py_min = 99;
    tab.n++;
    return &tab.r[i];
}

/* glibc and Blackwell code for a listed release: its bundled row, else the newest before it. */
static void fill_from_bundled(row *r) {
    size_t i;
    const rel_info *b = &rel_bundled[rel_nbundled - 1];
    for (i = 0; i < rel_nbundled; i++) {
        if (ver_cmp(rel_bundled[i].version, r->version) <= 0) {
            b = &rel_bundled[i];
            break;
        }
    }
    snprintf(r->glibc, sizeof r->glibc, "%s", b->glibc);
    r->blackwell = b->blackwell;
}

static int newest_first(const void *a, const void *b) {
    return ver_cmp(((const row *)b)->version, ((const row *)a)->version);
}

static int build_table(char (*names)[256], size_t nnames, char *msg, size_t cap) {
    size_t i, nwheels = 0, nlisted;
    tab.n = 0;
    for (i = 0; i < nnames; i++) {
        rel_wheel w;
        char err[128], cu[12];
        row *r;
        int py;
        if (rel_parse_wheel(names[i], &w, err, sizeof err) != 0 || strcmp(w.dist, "flash_attn") ||
            !w.cu[0] || !w.torch_mm[0] || strncmp(w.pytag, "cp3", 3) ||
            strncmp(w.plat, "linux_", 6))
            continue;
        py = atoi(w.pytag + 3);
        r = row_for(w.version);
        if (!r || py <= 0)
            continue;
        if (py < r->py_min)
            r->py_min = py;
        if (py > r->py_max)
            r->py_max = py;
        add_word(r->torch, sizeof r->torch, w.torch_mm);
        snprintf(cu, sizeof cu, "%d", rel_cu_major(w.cu));
        add_word(r->cuda, sizeof r->cuda, cu);
        add_word(r->machines, sizeof r->machines, w.plat + 6);
        nwheels++;
    }
    if (!nwheels) {
        snprintf(msg, cap, "the listing names no flash_attn CUDA wheel for Linux");
        return -1;
    }
    nlisted = tab.n;
    for (i = 0; i < nlisted; i++)
        fill_from_bundled(&tab.r[i]);
    for (i = 0; i < rel_nbundled; i++) { /* releases the listing does not reach */
        const rel_info *b = &rel_bundled[i];
        size_t before = tab.n;
        row *r = row_for(b->version);
        if (!r || tab.n == before)
            continue;
        snprintf(r->torch, sizeof r->torch, "%s", b->torch);
        snprintf(r->cuda, sizeof r->cuda, "%s", b->cuda);
        snprintf(r->glibc, sizeof r->glibc, "%s", b->glibc);
        snprintf(r->machines, sizeof r->machines, "%s", b->machines);
        r->py_min = b->py_min;
        r->py_max = b->py_max;
        r->blackwell = b->blackwell;
    }
    qsort(tab.r, tab.n, sizeof tab.r[0], newest_first);
    snprintf(msg, cap, "%zu wheels of %zu releases in the listing; newest %s", nwheels, nlisted,
             tab.r[0].version);
    return 0;
}

int rel_refresh(const char *url, const char *path, char *msg, size_t cap) {
    char *buf = NULL, summary[256];
    size_t len = 0;
    jreader j;
    time_t now = time(NULL);
    struct tm tm;
    int rc;
    msg[0] = '\0';
    if (fetch(url, &buf, &len, msg, cap) != 0) {
        free(buf);
        return -1;
    }
    memset(&j, 0, sizeof j);
    j.p = buf;
    j.end = buf + len;
    j.names = malloc(sizeof *j.names * MAX_NAMES);
    if (!j.names) {
        free(buf);
        snprintf(msg, cap, "out of memory");
        return -1;
    }
    rc = jvalue(&j, NULL, 0);
    jspace(&j);
    if (rc != 0 || j.p != j.end) {
        snprintf(msg, cap, "%s is not valid JSON (at byte %ld)", url, (long)(j.p - buf));
        rc = -1;
    } else if (build_table(j.names, j.n, summary, sizeof summary) != 0) {
        snprintf(msg, cap, "%s: %s", url, summary);
        rc = -1;
    } else {
        gmtime_r(&now, &tm);
        strftime(tab.checked, sizeof tab.checked, "%Y-%m-%d", &tm);
        snprintf(tab.source, sizeof tab.source, "%s", url);
        rc = write_cache(path, msg, cap);
        if (rc == 0) {
            snprintf(tab.source, sizeof tab.source, "%s", path);
            use_tab();
            snprintf(msg, cap, "%s; written to %s", summary, path);
        }
    }
    free(j.names);
    free(buf);
    return rc;
}
