/* SPDX-License-Identifier: MIT */
/*
 * tools/elf/ — reading shared objects for the doctor: the ELF reader, and C++ names through the
 * system's demangler.
 *
 * elfread.c — the dynamic tables of a 64-bit little-endian ELF object, read with bounds checks
 * (see elfread.h). The layout constants are written out here (no <elf.h>, which is not POSIX):
 *
 *   ELF header (64 bytes): e_type@16 u16, e_machine@18 u16, e_shoff@40 u64,
 *                          e_shentsize@58 u16, e_shnum@60 u16
 *   section header (64):   sh_type@4 u32, sh_offset@24 u64, sh_size@32 u64, sh_link@40 u32,
 *                          sh_info@44 u32, sh_entsize@56 u64
 *   Elf64_Sym (24):        st_name@0 u32, st_info@4 u8, st_shndx@6 u16
 *   Elf64_Dyn (16):        d_tag@0 i64, d_val@8 u64
 *   Elf64_Verneed (16):    vn_cnt@2 u16, vn_file@4 u32, vn_aux@8 u32, vn_next@12 u32
 *   Elf64_Vernaux (16):    vna_other@6 u16, vna_name@8 u32, vna_next@12 u32
 *   Elf64_Verdef (20):     vd_flags@2 u16, vd_ndx@4 u16, vd_cnt@6 u16, vd_aux@12 u32, vd_next@16
 *   Elf64_Verdaux (8):     vda_name@0 u32, vda_next@4 u32
 */
#define _POSIX_C_SOURCE 200809L

#include "elfread.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SHT_DYNAMIC_ 6u
#define SHT_DYNSYM_ 11u
#define SHT_GNU_VERDEF_ 0x6ffffffdu
#define SHT_GNU_VERNEED_ 0x6ffffffeu
#define SHT_GNU_VERSYM_ 0x6fffffffu

#define ELFR_MAX_SECTIONS 65536u
#define ELFR_MAX_TABLE (512ull << 20) /* bytes of one table read into memory */
#define ELFR_MAX_VERSIONS 65536u      /* version entries walked (also stops cycles) */

typedef struct elfr_src {
    const unsigned char *mem; /* memory image, or NULL for fd */
    int fd;
    uint64_t size;
} elfr_src;

static void set_error(elfr_file *f, const char *fmt, ...) {
    va_list ap;
    if (f->error[0])
        return; /* keep the first */
    va_start(ap, fmt);
    vsnprintf(f->error, sizeof f->error, fmt, ap);
    va_end(ap);
}

/* Reads len bytes at off; 0 on success, -1 if the range is outside the file. */
static int read_at(const elfr_src *s, uint64_t off, void *buf, size_t len) {
    if (off > s->size || len > s->size - off)
        return -1;
    if (len == 0)
        return 0;
    if (s->mem) {
        memcpy(buf, s->mem + off, len);
        return 0;
    }
    {
        size_t done = 0;
        while (done < len) {
            ssize_t r = pread(s->fd, (char *)buf + done, len - done, (off_t)(off + done));
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                return -1;
            done += (size_t)r;
        }
    }
    return 0;
}

/* Reads a whole table into a fresh buffer with one extra NUL byte at the end. */
static unsigned char *read_table(const elfr_src *s, uint64_t off, uint64_t size, elfr_file *f,
                                 const char *what) {
    unsigned char *buf;
    if (size > ELFR_MAX_TABLE) {
        set_error(f, "%s: %llu bytes is too large", what, (unsigned long long)size);
        return NULL;
    }
    buf = malloc((size_t)size + 1);
    if (!buf) {
        set_error(f, "%s: out of memory", what);
        return NULL;
    }
    if (read_at(s, off, buf, (size_t)size) != 0) {
        set_error(f, "%s: offset %llu + size %llu lies outside the file (%llu bytes)", what,
                  (unsigned long long)off, (unsigned long long)size, (unsigned long long)s->size);
        free(buf);
        return NULL;
    }
    buf[size] = 0;
    return buf;
}

static uint16_t u16(const unsigned char *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t u32(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static uint64_t u64(const unsigned char *p) {
    return (uint64_t)u32(p) | ((uint64_t)u32(p + 4) << 32);
}

/* A string at `off` in a table; "" when out of range (the table has a NUL at its end). */
static const char *str_at(const char *tab, size_t size, uint64_t off) {
    if (!tab || off >= size)
        return "";
    return tab + off;
}

typedef struct elfr_shdr {
    uint32_t type, link, info;
    uint64_t offset, size, entsize;
} elfr_shdr;

/* Version index -> name, from verdef/verneed (index 0 and 1 mean local/global: no name). */
typedef struct elfr_vermap {
    const char **names;
    size_t count;
} elfr_vermap;

/* Grows the map to cover idx (indices are at most 0x7fff). */
static void vermap_set(elfr_vermap *m, unsigned idx, const char *name) {
    if (!name || !*name || idx > 0x7fffu)
        return;
    if (idx >= m->count) {
        size_t ncap = idx + 16, i;
        const char **names = realloc(m->names, ncap * sizeof *names);
        if (!names)
            return;
        for (i = m->count; i < ncap; i++)
            names[i] = NULL;
        m->names = names;
        m->count = ncap;
    }
    m->names[idx] = name;
}

static void parse_verneed(const elfr_src *s, const elfr_shdr *sh, const char *tab, size_t tabsz,
                          elfr_file *f, elfr_vermap *vm) {
    unsigned char *sec = read_table(s, sh->offset, sh->size, f, ".gnu.version_r");
    uint64_t off = 0;
    unsigned walked = 0;
    size_t cap = 0;
    if (!sec)
        return;
    for (;;) {
        unsigned cnt, j;
        uint64_t aux;
        uint32_t next;
        const char *file;
        if (off > sh->size || sh->size - off < 16 || ++walked > ELFR_MAX_VERSIONS) {
            set_error(f, ".gnu.version_r: entry at %llu is outside the section",
                      (unsigned long long)off);
            break;
        }
        cnt = u16(sec + off + 2);
        file = str_at(tab, tabsz, u32(sec + off + 4));
        aux = off + u32(sec + off + 8);
        next = u32(sec + off + 12);
        for (j = 0; j < cnt; j++) {
            uint32_t anext;
            const char *name;
            if (aux > sh->size || sh->size - aux < 16 || ++walked > ELFR_MAX_VERSIONS) {
                set_error(f, ".gnu.version_r: aux entry outside the section");
                break;
            }
            name = str_at(tab, tabsz, u32(sec + aux + 8));
            vermap_set(vm, u16(sec + aux + 6) & 0x7fffu, name);
            if (f->n_vneeds == cap) {
                size_t ncap = cap ? cap * 2 : 16;
                elfr_vneed *v = realloc(f->vneeds, ncap * sizeof *v);
                if (!v)
                    break;
                f->vneeds = v;
                cap = ncap;
            }
            f->vneeds[f->n_vneeds].file = file;
            f->vneeds[f->n_vneeds].version = name;
            f->n_vneeds++;
            anext = u32(sec + aux + 12);
            if (!anext)
                break;
            aux += anext;
        }
        if (!next)
            break;
        off += next;
    }
    free(sec);
}

static void parse_verdef(const elfr_src *s, const elfr_shdr *sh, const char *tab, size_t tabsz,
                         elfr_file *f, elfr_vermap *vm) {
    unsigned char *sec = read_table(s, sh->offset, sh->size, f, ".gnu.version_d");
    uint64_t off = 0;
    unsigned walked = 0;
    size_t cap = 0;
    if (!sec)
        return;
    for (;;) {
        uint64_t aux;
        uint32_t next;
        unsigned flags, ndx;
        const char *name;
        if (off > sh->size || sh->size - off < 20 || ++walked > ELFR_MAX_VERSIONS) {
            set_error(f, ".gnu.version_d: entry at %llu is outside the section",
                      (unsigned long long)off);
            break;
        }
        flags = u16(sec + off + 2);
        ndx = u16(sec + off + 4);
        aux = off + u32(sec + off + 12);
        next = u32(sec + off + 16);
        if (aux <= sh->size && sh->size - aux >= 8) {
            name = str_at(tab, tabsz, u32(sec + aux));
            vermap_set(vm, ndx & 0x7fffu, name);
            if (!(flags & 1u)) { /* VER_FLG_BASE names the file itself, not a version */
                if (f->n_vdefs == cap) {
                    size_t ncap = cap ? cap * 2 : 16;
                    const char **v = realloc(f->vdefs, ncap * sizeof *v);
                    if (!v)
                        break;
                    f->vdefs = v;
                    cap = ncap;
                }
                f->vdefs[f->n_vdefs++] = name;
            }
        } else {
            set_error(f, ".gnu.version_d: aux entry outside the section");
        }
        if (!next)
            break;
        off += next;
    }
    free(sec);
}

static void parse_dynamic(const elfr_src *s, const elfr_shdr *sh, const char *tab, size_t tabsz,
                          elfr_file *f) {
    unsigned char *sec = read_table(s, sh->offset, sh->size, f, ".dynamic");
    uint64_t i, n;
    size_t cap = 0;
    if (!sec)
        return;
    n = sh->size / 16;
    for (i = 0; i < n; i++) {
        int64_t tag = (int64_t)u64(sec + i * 16);
        uint64_t val = u64(sec + i * 16 + 8);
        if (tag == 0)
            break;
        if (tag == 1) { /* DT_NEEDED */
            if (f->n_needed == cap) {
                size_t ncap = cap ? cap * 2 : 8;
                const char **v = realloc(f->needed, ncap * sizeof *v);
                if (!v)
                    break;
                f->needed = v;
                cap = ncap;
            }
            f->needed[f->n_needed++] = str_at(tab, tabsz, val);
        } else if (tag == 14) {
            f->soname = str_at(tab, tabsz, val);
        } else if (tag == 15) {
            f->rpath = str_at(tab, tabsz, val);
        } else if (tag == 29) {
            f->runpath = str_at(tab, tabsz, val);
        }
    }
    free(sec);
}

static int parse(const elfr_src *s, elfr_file *f) {
    unsigned char eh[64];
    uint64_t shoff;
    unsigned shentsize, shnum, i;
    elfr_shdr *sh = NULL;
    int dynsym = -1, dynamic = -1, versym = -1, verneed = -1, verdef = -1;
    elfr_vermap vm = {NULL, 0};
    unsigned char *symtab = NULL, *vers = NULL;

    if (read_at(s, 0, eh, sizeof eh) != 0 || memcmp(eh, "\177ELF", 4) != 0) {
        set_error(f, "not an ELF file");
        return -1;
    }
    if (eh[4] != 2 || eh[5] != 1) {
        set_error(f, "not a 64-bit little-endian ELF file (class %u, data %u)", eh[4], eh[5]);
        return -1;
    }
    f->type = u16(eh + 16);
    f->machine = u16(eh + 18);
    shoff = u64(eh + 40);
    shentsize = u16(eh + 58);
    shnum = u16(eh + 60);
    if (shoff == 0) {
        set_error(f, "no section headers (stripped of sections)");
        return -1;
    }
    if (shentsize != 64) {
        set_error(f, "section header size %u (expected 64)", shentsize);
        return -1;
    }
    if (shnum == 0) { /* extended numbering: the count is in section 0's sh_size */
        unsigned char s0[64];
        if (read_at(s, shoff, s0, sizeof s0) != 0) {
            set_error(f, "section headers outside the file");
            return -1;
        }
        if (u64(s0 + 32) > ELFR_MAX_SECTIONS) {
            set_error(f, "too many sections");
            return -1;
        }
        shnum = (unsigned)u64(s0 + 32);
    }
    sh = calloc(shnum ? shnum : 1, sizeof *sh);
    if (!sh) {
        set_error(f, "out of memory");
        return -1;
    }
    for (i = 0; i < shnum; i++) {
        unsigned char b[64];
        if (read_at(s, shoff + (uint64_t)i * 64, b, sizeof b) != 0) {
            set_error(f, "section header %u lies outside the file", i);
            free(sh);
            return -1;
        }
        sh[i].type = u32(b + 4);
        sh[i].offset = u64(b + 24);
        sh[i].size = u64(b + 32);
        sh[i].link = u32(b + 40);
        sh[i].info = u32(b + 44);
        sh[i].entsize = u64(b + 56);
        if (sh[i].type == SHT_DYNSYM_ && dynsym < 0)
            dynsym = (int)i;
        else if (sh[i].type == SHT_DYNAMIC_ && dynamic < 0)
            dynamic = (int)i;
        else if (sh[i].type == SHT_GNU_VERSYM_ && versym < 0)
            versym = (int)i;
        else if (sh[i].type == SHT_GNU_VERNEED_ && verneed < 0)
            verneed = (int)i;
        else if (sh[i].type == SHT_GNU_VERDEF_ && verdef < 0)
            verdef = (int)i;
    }
    if (dynsym < 0 && dynamic < 0) {
        set_error(f, "no dynamic section (a static executable or an object file)");
        free(sh);
        return 0;
    }

    /* the string table of the dynamic symbols (normally .dynstr) */
    {
        int strsec = dynsym >= 0 ? (int)sh[dynsym].link : (int)sh[dynamic].link;
        if (strsec <= 0 || (unsigned)strsec >= shnum) {
            set_error(f, "dynamic string table index %d is invalid", strsec);
        } else {
            f->strtab = (char *)read_table(s, sh[strsec].offset, sh[strsec].size, f, ".dynstr");
            if (f->strtab)
                f->strtab_size = (size_t)sh[strsec].size + 1;
        }
        if (dynamic >= 0 && sh[dynamic].link != (unsigned)strsec && sh[dynamic].link > 0 &&
            sh[dynamic].link < shnum) {
            unsigned l = sh[dynamic].link;
            f->strtab2 = (char *)read_table(s, sh[l].offset, sh[l].size, f, "dynamic strings");
            if (f->strtab2)
                f->strtab2_size = (size_t)sh[l].size + 1;
        }
    }

    /* versions: index -> name */
    if (verneed >= 0)
        parse_verneed(s, &sh[verneed], f->strtab, f->strtab_size, f, &vm);
    if (verdef >= 0)
        parse_verdef(s, &sh[verdef], f->strtab, f->strtab_size, f, &vm);

    if (dynamic >= 0) {
        if (f->strtab2)
            parse_dynamic(s, &sh[dynamic], f->strtab2, f->strtab2_size, f);
        else
            parse_dynamic(s, &sh[dynamic], f->strtab, f->strtab_size, f);
    }

    if (dynsym >= 0) {
        uint64_t n, j;
        if (sh[dynsym].entsize != 24) {
            set_error(f, ".dynsym entry size %llu (expected 24)",
                      (unsigned long long)sh[dynsym].entsize);
            goto done;
        }
        n = sh[dynsym].size / 24;
        symtab = read_table(s, sh[dynsym].offset, n * 24, f, ".dynsym");
        if (!symtab)
            goto done;
        if (versym >= 0 && sh[versym].size / 2 >= n)
            vers = read_table(s, sh[versym].offset, n * 2, f, ".gnu.version");
        f->syms = calloc(n ? (size_t)n : 1, sizeof *f->syms);
        if (!f->syms) {
            set_error(f, "out of memory for %llu symbols", (unsigned long long)n);
            goto done;
        }
        for (j = 1; j < n; j++) { /* entry 0 is the null symbol */
            const unsigned char *e = symtab + j * 24;
            elfr_sym *y = &f->syms[f->n_syms];
            y->name = str_at(f->strtab, f->strtab_size, u32(e));
            y->bind = e[4] >> 4;
            y->type = e[4] & 15;
            y->defined = u16(e + 6) != 0;
            if (vers && vm.names) {
                unsigned v = u16(vers + j * 2);
                if ((v & 0x7fffu) >= 2 && (v & 0x7fffu) < vm.count)
                    y->version = vm.names[v & 0x7fffu];
                y->hidden_version = (v & 0x8000u) != 0;
            }
            f->n_syms++;
        }
    }
done:
    free(symtab);
    free(vers);
    free(vm.names);
    free(sh);
    return 0;
}

int elfr_parse_mem(const void *data, size_t size, elfr_file *out) {
    elfr_src s;
    memset(out, 0, sizeof *out);
    s.mem = data;
    s.fd = -1;
    s.size = size;
    if (!data) {
        set_error(out, "no data");
        return -1;
    }
    return parse(&s, out);
}

/* What a file that is not a regular one is, for the message. */
static const char *file_kind(mode_t mode) {
    if (S_ISDIR(mode))
        return "a directory";
    if (S_ISFIFO(mode))
        return "a FIFO (named pipe)";
    if (S_ISCHR(mode))
        return "a character device";
    if (S_ISBLK(mode))
        return "a block device";
    if (S_ISSOCK(mode))
        return "a socket";
    return "a special file";
}

int elfr_open(const char *path, elfr_file *out) {
    elfr_src s;
    struct stat stt;
    int r;
    memset(out, 0, sizeof *out);
    s.mem = NULL;
    /* O_NONBLOCK: opening a FIFO with no writer would wait forever (and a device could); the
     * type is checked before anything is read, and a regular file reads the same either way. */
    s.fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY);
    if (s.fd < 0) {
        set_error(out, "%s: %s", path, strerror(errno));
        return -1;
    }
    if (fstat(s.fd, &stt) != 0) {
        set_error(out, "%s: %s", path, strerror(errno));
        close(s.fd);
        return -1;
    }
    if (!S_ISREG(stt.st_mode)) {
        set_error(out, "%s: %s, not a regular file (an ELF shared object is one)", path,
                  file_kind(stt.st_mode));
        close(s.fd);
        return -1;
    }
    s.size = (uint64_t)stt.st_size;
    r = parse(&s, out);
    close(s.fd);
    return r;
}

void elfr_free(elfr_file *f) {
    if (!f)
        return;
    free(f->needed);
    free(f->syms);
    free(f->vneeds);
    free(f->vdefs);
    free(f->strtab);
    free(f->strtab2);
    memset(f, 0, sizeof *f);
}

const char *elfr_machine_name(uint16_t machine, char *buf, size_t bufsize) {
    switch (machine) {
    case 62:
        return "x86_64";
    case 183:
        return "aarch64";
    case 3:
        return "i386";
    case 40:
        return "arm";
    case 21:
        return "ppc64";
    case 243:
        return "riscv";
    default:
        break;
    }
    snprintf(buf, bufsize, "machine %u", (unsigned)machine);
    return buf;
}
