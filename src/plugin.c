/* SPDX-License-Identifier: MIT */
/*
 * plugin.c — finds and loads the CUDA plug-in (libflashattn_cuda.so) on first use, checks its
 * ABI handshake, and implements the public device helpers (fa_device_*) on top of it. The core
 * never links CUDA: without the plug-in every CUDA request fails with FA_ERR_DEVICE and a message
 * that says where the plug-in was looked for and why it did not load.
 */
#define _GNU_SOURCE /* dladdr */
#include "plugin.h"
#include "cpu/cpu.h"
#include "size.h"

#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FA_PLUGIN_FILE "libflashattn_cuda.so"

static struct {
    pthread_once_t once;
    const fa__plugin_api *api; /* NULL when not loaded */
    char path[1024];           /* the file that loaded */
    char why[1024];            /* why it did not load */
    int devices;               /* device count, -1 when the driver failed */
    char devices_msg[512];     /* the driver's message when devices < 0 */
} plugin = {.once = PTHREAD_ONCE_INIT, .devices = -1};

/* Appends "; <message>" to plugin.why (bounded). */
static void note_failure(const char *fmt, ...) FA__PRINTF(1, 2);
static void note_failure(const char *fmt, ...) {
    size_t used = strlen(plugin.why);
    if (used + 3 >= sizeof plugin.why) return;
    if (used) {
        memcpy(plugin.why + used, "; ", 3);
        used += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(plugin.why + used, sizeof plugin.why - used, fmt, ap);
    va_end(ap);
}

/* Reads len bytes at off; 0 when all of them were read. */
static int read_at(int fd, uint64_t off, void *buf, size_t len) {
    for (size_t done = 0; done < len;) {
        const ssize_t r = pread(fd, (char *)buf + done, len - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        done += (size_t)r;
    }
    return 0;
}

/* Is [off, off + len) inside a file of `size` bytes? */
static int range_fits(uint64_t off, uint64_t len, uint64_t size) {
    return off <= size && len <= size - off;
}

static const char *segment_name(uint32_t type, char *buf, size_t cap) {
    switch (type) {
    case PT_LOAD: return "PT_LOAD";
    case PT_DYNAMIC: return "PT_DYNAMIC";
    case PT_INTERP: return "PT_INTERP";
    case PT_NOTE: return "PT_NOTE";
    case PT_TLS: return "PT_TLS";
    default: snprintf(buf, cap, "type 0x%x", (unsigned)type); return buf;
    }
}

/* The ELF checks of file_can_be_mapped on an open regular file of `size` bytes: 1 when they
 * pass or do not apply, else 0 with the reason in `what`. Counts are at most 2^32 and entry
 * sizes 56 or 64, so no product below wraps. */
static int elf_can_be_mapped(int fd, uint64_t size, char *what, size_t cap) {
    unsigned char ident[EI_NIDENT];
    const uint16_t one = 1;
    const unsigned char native = *(const unsigned char *)&one ? ELFDATA2LSB : ELFDATA2MSB;
    if (size < EI_NIDENT || read_at(fd, 0, ident, EI_NIDENT) != 0 ||
        memcmp(ident, ELFMAG, SELFMAG) != 0 || ident[EI_CLASS] != ELFCLASS64 ||
        ident[EI_DATA] != native)
        return 1; /* not a file these checks read: dlopen says what it is */
    Elf64_Ehdr eh;
    if (size < sizeof eh || read_at(fd, 0, &eh, sizeof eh) != 0) {
        snprintf(what, cap, "shorter than its ELF header (%zu bytes)", sizeof eh);
        return 0;
    }
    /* extended numbering: the real counts are in section header 0 */
    uint64_t phnum = eh.e_phnum, shnum = eh.e_shnum;
    if ((phnum == PN_XNUM || shnum == 0) && eh.e_shoff != 0) {
        Elf64_Shdr sh0;
        if (eh.e_shentsize != sizeof sh0) {
            snprintf(what, cap, "section header size %u (expected %zu)", (unsigned)eh.e_shentsize,
                     sizeof sh0);
            return 0;
        }
        if (!range_fits(eh.e_shoff, sizeof sh0, size) ||
            read_at(fd, eh.e_shoff, &sh0, sizeof sh0) != 0) {
            snprintf(what, cap, "section header 0 at byte %llu is not inside the file",
                     (unsigned long long)eh.e_shoff);
            return 0;
        }
        if (phnum == PN_XNUM) phnum = sh0.sh_info;
        if (shnum == 0) shnum = sh0.sh_size;
        if (shnum > UINT32_MAX) {
            snprintf(what, cap, "section header 0 gives %llu sections", (unsigned long long)shnum);
            return 0;
        }
    }
    if (eh.e_phentsize != sizeof(Elf64_Phdr)) {
        snprintf(what, cap, "program header size %u (expected %zu)", (unsigned)eh.e_phentsize,
                 sizeof(Elf64_Phdr));
        return 0;
    }
    if (!range_fits(eh.e_phoff, phnum * sizeof(Elf64_Phdr), size)) {
        snprintf(what, cap, "its %llu program headers at byte %llu end past the end of the file",
                 (unsigned long long)phnum, (unsigned long long)eh.e_phoff);
        return 0;
    }
    for (uint64_t i = 0; i < phnum; i++) {
        Elf64_Phdr ph;
        char name[32];
        if (read_at(fd, eh.e_phoff + i * sizeof ph, &ph, sizeof ph) != 0) {
            snprintf(what, cap, "program header %llu cannot be read", (unsigned long long)i);
            return 0;
        }
        if (ph.p_filesz && !range_fits(ph.p_offset, ph.p_filesz, size)) {
            snprintf(what, cap, "segment %llu (%s) has its bytes at %llu + %llu, past the end of "
                     "the file", (unsigned long long)i,
                     segment_name(ph.p_type, name, sizeof name), (unsigned long long)ph.p_offset,
                     (unsigned long long)ph.p_filesz);
            return 0;
        }
    }
    if (eh.e_shoff != 0 && shnum > 0 &&
        (eh.e_shentsize != sizeof(Elf64_Shdr) ||
         !range_fits(eh.e_shoff, shnum * sizeof(Elf64_Shdr), size))) {
        snprintf(what, cap, "its %llu section headers at byte %llu (%u bytes each) end past the "
                 "end of the file", (unsigned long long)shnum, (unsigned long long)eh.e_shoff,
                 (unsigned)eh.e_shentsize);
        return 0;
    }
    return 1;
}

/* What dlopen does not check before it opens and maps a file: that it is a regular file (a
 * FIFO would block it until a writer comes) and, for a 64-bit ELF file of this machine's byte
 * order, that its program header table, each segment's bytes in the file (p_offset + p_filesz)
 * and its section header table lie inside the file. dlopen maps PT_LOAD segments as they are
 * described, and the first touch of a page past the end of a truncated file is a SIGBUS that
 * kills the process. Other files (another ELF class or byte order, text) are left to dlopen,
 * which rejects them before it maps anything; so is a path that cannot be opened. Returns 1
 * when dlopen may go ahead, else 0 with the reason noted. */
static int file_can_be_mapped(const char *path) {
    const int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) return 1;
    struct stat st;
    char what[256];
    int ok = 0;
    if (fstat(fd, &st) != 0)
        note_failure("%s: %s", path, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        note_failure("%s: %s, not a regular file", path,
                     S_ISDIR(st.st_mode)    ? "a directory"
                     : S_ISFIFO(st.st_mode) ? "a FIFO"
                     : S_ISCHR(st.st_mode)  ? "a character device"
                     : S_ISBLK(st.st_mode)  ? "a block device"
                                            : "a special file");
    else if (!elf_can_be_mapped(fd, (uint64_t)st.st_size, what, sizeof what))
        note_failure("%s: not loaded, a truncated or damaged ELF file (%llu bytes): %s", path,
                     (unsigned long long)st.st_size, what);
    else
        ok = 1;
    close(fd);
    return ok;
}

/* dlopen(path) and the handshake; on success sets plugin.api and plugin.path. A path with a
 * '/' is checked first (file_can_be_mapped); a bare name is the loader's to search for. */
static int try_load(const char *path) {
    if (strchr(path, '/') && !file_can_be_mapped(path)) return 0;
    void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        const char *err = dlerror();
        note_failure("%s", err ? err : path);
        return 0;
    }
    fa__plugin_entry_fn entry;
    *(void **)&entry = dlsym(handle, FA__PLUGIN_ENTRY);
    const fa__plugin_api *api = entry ? entry(FA__PLUGIN_ABI_VERSION) : NULL;
    if (!entry) {
        note_failure("%s: no symbol %s (not a flashattn plug-in)", path, FA__PLUGIN_ENTRY);
    } else if (!api || api->abi_version != FA__PLUGIN_ABI_VERSION ||
               api->problem_size != sizeof(fa__problem)) {
        note_failure("%s: built for another version of libflashattn (the ABI handshake failed); "
                     "rebuild both from one source tree", path);
    } else {
        plugin.api = api;
        snprintf(plugin.path, sizeof plugin.path, "%s", path);
        return 1;
    }
    dlclose(handle);
    return 0;
}

/* The plug-in in the directory of this library (or of the executable it is linked into). */
static int try_load_beside_library(void) {
    Dl_info info;
    /* dladdr of a function of this file: the library (or executable) it is part of */
    if (!dladdr((void *)&fa_device_count, &info) || !info.dli_fname) return 0;
    const char *slash = strrchr(info.dli_fname, '/');
    char path[1024];
    if (!slash || snprintf(path, sizeof path, "%.*s/%s", (int)(slash - info.dli_fname),
                           info.dli_fname, FA_PLUGIN_FILE) >= (int)sizeof path)
        return 0;
    return try_load(path);
}

static void load_once(void) {
    const char *env = getenv("FA_CUDA_PLUGIN");
    if (env && *env) { /* an explicit choice: only that file */
        if (!try_load(env)) note_failure("the path came from FA_CUDA_PLUGIN");
    } else if (!try_load_beside_library()) {
        try_load(FA_PLUGIN_FILE); /* the dynamic loader's search path */
    }
    if (!plugin.api) return;
    plugin.why[0] = '\0';
    int n = 0;
    if (plugin.api->device_count(&n, plugin.devices_msg, sizeof plugin.devices_msg) == FA_OK)
        plugin.devices = n;
}

/* "q: is on CUDA device 0, but " when a tensor asked, "" for the device helpers. */
static const char *asker(char *buf, size_t cap, const char *who, int32_t index) {
    if (!who) return "";
    snprintf(buf, cap, "%s: is on CUDA device %d, but ", who, index);
    return buf;
}

fa_status fa__plugin_device(const char *who, int32_t index, const fa__plugin_api **api) {
    pthread_once(&plugin.once, load_once);
    char pre[128];
    if (!plugin.api)
        return fa__error(FA_ERR_DEVICE, "%sthe CUDA plug-in " FA_PLUGIN_FILE " could not be loaded "
                         "(%s). Build it with nvcc present (cmake -DFA_CUDA=ON) and keep it next "
                         "to libflashattn.so, or set FA_CUDA_PLUGIN to its path",
                         asker(pre, sizeof pre, who, index), plugin.why);
    if (plugin.devices < 0)
        return fa__error(FA_ERR_DEVICE, "%sthe CUDA driver cannot be used: %s",
                         asker(pre, sizeof pre, who, index), plugin.devices_msg);
    if (index < 0 || index >= plugin.devices)
        return fa__error(FA_ERR_DEVICE, "%sCUDA device_index %d does not exist (%d device%s "
                         "visible)", asker(pre, sizeof pre, who, index), index, plugin.devices,
                         plugin.devices == 1 ? "" : "s");
    *api = plugin.api;
    return FA_OK;
}

const char *fa__plugin_summary(char *buf, size_t cap) {
    pthread_once(&plugin.once, load_once);
    if (!plugin.api) snprintf(buf, cap, "cuda: plug-in not loaded (%s)", plugin.why);
    else if (plugin.devices < 0)
        snprintf(buf, cap, "cuda: plug-in %s (%s), driver unusable: %s", plugin.path,
                 plugin.api->build, plugin.devices_msg);
    else
        snprintf(buf, cap, "cuda: plug-in %s (%s), %d device%s", plugin.path, plugin.api->build,
                 plugin.devices, plugin.devices == 1 ? "" : "s");
    return buf;
}

/* Runs a plug-in function's status through the last-error message. */
fa_status fa__plugin_status(int status, const char *msg) {
    if (status == FA_OK) return FA_OK;
    return fa__error((fa_status)status, "%s", msg[0] ? msg : "the CUDA plug-in failed");
}

fa_status fa__plugin_download(const fa__plugin_api *api, const fa_tensor *t, const char *name,
                              void *stream, void **host) {
    int64_t count = 1; /* elements from the first to the last one the view reaches */
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] == 0) count = 0;
        if (count) count = fa__size_add(count, fa__size_mul(t->shape[i] - 1, t->stride[i]));
    }
    const size_t esize = fa__dtype_size(t->dtype);
    *host = fa__alloc(count ? count : 1, esize);
    if (!*host) return fa__error(FA_ERR_NO_MEMORY, "%s: out of memory for a host copy", name);
    char msg[512] = "";
    const fa_status st = count ? fa__plugin_status(api->copy(*host, t->data, (size_t)count * esize,
                                                             FA__COPY_D2H, t->device_index,
                                                             stream, msg, sizeof msg),
                                                   msg)
                               : FA_OK;
    if (st != FA_OK) {
        free(*host);
        *host = NULL;
    }
    return st;
}

/* ---- public device helpers ---- */

fa_status fa_device_count(fa_device device, int32_t *count) {
    fa__clear_error();
    if (!count) return fa__error(FA_ERR_NULL_POINTER, "count: NULL");
    if (device == FA_DEVICE_CPU) {
        *count = 1;
        return FA_OK;
    }
    if (device != FA_DEVICE_CUDA)
        return fa__error(FA_ERR_DEVICE, "device %d is not a fa_device", (int)device);
    const fa__plugin_api *api;
    const fa_status st = fa__plugin_device(NULL, 0, &api);
    if (st != FA_OK && plugin.devices != 0) return st; /* no plug-in, or no usable driver */
    fa__clear_error(); /* zero devices is an answer, not an error */
    *count = plugin.devices;
    return FA_OK;
}

/* The plug-in for a device that is not the CPU: it must be CUDA device `index`, usable. */
static fa_status cuda_device(fa_device device, int32_t index, const fa__plugin_api **api) {
    if (device != FA_DEVICE_CUDA)
        return fa__error(FA_ERR_DEVICE, "device %d is not a fa_device", (int)device);
    return fa__plugin_device(NULL, index, api);
}

fa_status fa_device_describe(fa_device device, int32_t device_index, char *buf, size_t cap) {
    fa__clear_error();
    if (!buf && cap > 0)
        return fa__error(FA_ERR_NULL_POINTER, "buf: NULL with cap %zu", cap);
    char line[1024]; /* the whole line, copied to buf only when the call succeeds */
    if (device == FA_DEVICE_CPU) {
        if (device_index != 0)
            return fa__error(FA_ERR_DEVICE, "CPU device_index %d does not exist (1 device)",
                             (int)device_index);
        snprintf(line, sizeof line, "CPU, kernels %s%s; compiled in: %s",
                 fa__cpu_kernels_get()->name, fa__cpu_kernels_note(), fa__cpu_kernels_compiled());
    } else {
        const fa__plugin_api *api;
        fa_status st = cuda_device(device, device_index, &api);
        if (st != FA_OK)
            return st;
        char msg[512] = "";
        line[0] = '\0';
        st = fa__plugin_status(
            api->device_describe(device_index, line, sizeof line, msg, sizeof msg), msg);
        if (st != FA_OK)
            return st;
        line[sizeof line - 1] = '\0';
    }
    if (cap > 0)
        snprintf(buf, cap, "%s", line);
    return FA_OK;
}

fa_status fa_device_alloc(fa_device device, int32_t device_index, size_t bytes, void **ptr) {
    fa__clear_error();
    if (!ptr) return fa__error(FA_ERR_NULL_POINTER, "ptr: NULL");
    if (bytes == 0) return fa__error(FA_ERR_VALUE, "bytes is 0; expected > 0");
    if (device == FA_DEVICE_CPU) {
        void *p = malloc(bytes);
        if (!p) return fa__error(FA_ERR_NO_MEMORY, "malloc(%zu) failed", bytes);
        *ptr = p;
        return FA_OK;
    }
    const fa__plugin_api *api;
    fa_status st = cuda_device(device, device_index, &api);
    if (st != FA_OK) return st;
    char msg[512] = "";
    void *p = NULL;
    st = fa__plugin_status(api->alloc(device_index, bytes, &p, msg, sizeof msg), msg);
    if (st == FA_OK) *ptr = p;
    return st;
}

fa_status fa_device_free(fa_device device, int32_t device_index, void *ptr) {
    fa__clear_error();
    if (!ptr) return FA_OK;
    if (device == FA_DEVICE_CPU) {
        free(ptr);
        return FA_OK;
    }
    const fa__plugin_api *api;
    const fa_status st = cuda_device(device, device_index, &api);
    if (st != FA_OK) return st;
    char msg[512] = "";
    return fa__plugin_status(api->release(device_index, ptr, msg, sizeof msg), msg);
}

fa_status fa_device_copy(void *dst, fa_device dst_device, const void *src, fa_device src_device,
                         int32_t device_index, size_t bytes) {
    fa__clear_error();
    if ((!dst || !src) && bytes > 0)
        return fa__error(FA_ERR_NULL_POINTER, "%s: NULL", !dst ? "dst" : "src");
    for (int side = 0; side < 2; side++) {
        const fa_device d = side ? src_device : dst_device;
        if (d != FA_DEVICE_CPU && d != FA_DEVICE_CUDA)
            return fa__error(FA_ERR_DEVICE, "%s_device %d is not a fa_device",
                             side ? "src" : "dst", (int)d);
    }
    if (bytes == 0) return FA_OK;
    if (dst_device == FA_DEVICE_CPU && src_device == FA_DEVICE_CPU) {
        memmove(dst, src, bytes);
        return FA_OK;
    }
    const fa__plugin_api *api;
    fa_status st = fa__plugin_device(NULL, device_index, &api);
    if (st != FA_OK) return st;
    const int kind = dst_device == FA_DEVICE_CPU   ? FA__COPY_D2H
                     : src_device == FA_DEVICE_CPU ? FA__COPY_H2D
                                                   : FA__COPY_D2D;
    char msg[512] = "";
    return fa__plugin_status(api->copy(dst, src, bytes, kind, device_index, NULL, msg, sizeof msg),
                             msg);
}
