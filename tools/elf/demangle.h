/* SPDX-License-Identifier: MIT */
/*
 * demangle.h — a small Itanium C++ ABI demangler for the symbols that matter when a PyTorch
 * extension fails to load: c10::/at::/torch:: functions taking std::string (old ABI "Ss") or
 * std::__cxx11::basic_string (new ABI), nested names, templates, substitutions, builtin types,
 * cv-qualifiers, pointers/references, function and array types, packs, literals, abi tags,
 * special names (vtable for, typeinfo for, ...) and clone suffixes. The output follows GNU
 * c++filt's formatting ("char const*", "> >"). Anything outside the supported grammar makes it
 * return NULL rather than guess; callers then show the mangled name.
 *
 * No allocation is retained between calls; bounded in depth, node count and output length.
 */
#ifndef FA_TOOLS_DEMANGLE_H
#define FA_TOOLS_DEMANGLE_H

#include <stddef.h>

/* Facts noticed while demangling, for the C++-ABI verdict. */
#define DMG_FLAG_CXX11 0x1u      /* std::__cxx11:: appears: built with _GLIBCXX_USE_CXX11_ABI=1 */
#define DMG_FLAG_OLD_STRING 0x2u /* old-ABI std::string ("Ss"/"Sb"): built with ABI=0 */

/* Demangles `mangled` (which must start with "_Z"; a trailing "@VERSION" is ignored).
 * Returns a malloc'd string the caller frees, or NULL when the name is not a mangled C++ name
 * or uses grammar this demangler does not cover. *flags (if not NULL) receives DMG_FLAG_*
 * bits, also when NULL is returned for a partially parsed name. */
char *dmg_demangle(const char *mangled, unsigned *flags);

/* The same for a name of known length (need not be NUL-terminated). */
char *dmg_demangle_n(const char *mangled, size_t len, unsigned *flags);

#endif /* FA_TOOLS_DEMANGLE_H */
