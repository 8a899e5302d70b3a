/* SPDX-License-Identifier: MIT */
/*
 * tools/elf/ — reading shared objects for the doctor: the ELF reader, and C++ names through the
 * system's demangler.
 *
 * demangle.h — C++ names made readable by the system's own demangler: __cxa_demangle, looked up at
 * run time in the C++ runtime that every PyTorch extension already needs (libstdc++.so.6, else
 * libc++abi), so the command links no C++. Where none can be loaded, names stay mangled and
 * dmg_unavailable() says why; `c++filt` demangles them. FLASHATTN_DEMANGLER=<library path> names
 * the runtime to load instead, and FLASHATTN_DEMANGLER=none turns demangling off.
 */
#ifndef FA_TOOLS_DEMANGLE_H
#define FA_TOOLS_DEMANGLE_H

#include <stddef.h>

/* Facts about a mangled name, for the C++-ABI verdict. */
/* std::__cxx11:: or [abi:cxx11] appears: built with _GLIBCXX_USE_CXX11_ABI=1 */
#define DMG_FLAG_CXX11 0x1u
#define DMG_FLAG_OLD_STRING 0x2u /* old-ABI std::string ("Ss"/"Sb"): built with ABI=0 */

/* Demangles `mangled` (which must start with "_Z"; a trailing "@VERSION" is ignored). Returns a
 * malloc'd string the caller frees, or NULL when the name is not a valid mangled C++ name, is
 * longer than 4096 bytes, or no demangler could be loaded. *flags (if not NULL) receives the
 * DMG_FLAG_* bits: DMG_FLAG_CXX11 is read from the name itself ("__cxx11" or "B5cxx11" in it),
 * so it is set for any name and without a demangler; DMG_FLAG_OLD_STRING needs the demangled
 * name. Not thread-safe on the
 * first call (it loads the runtime). */
char *dmg_demangle(const char *mangled, unsigned *flags);

/* The same for a name of known length (need not be NUL-terminated). */
char *dmg_demangle_n(const char *mangled, size_t len, unsigned *flags);

/* NULL when a demangler is loaded; otherwise why not ("libstdc++.so.6: cannot open shared
 * object file ..." or "turned off by FLASHATTN_DEMANGLER=none"), a static string. */
const char *dmg_unavailable(void);

#endif /* FA_TOOLS_DEMANGLE_H */
