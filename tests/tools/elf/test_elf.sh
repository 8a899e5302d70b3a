#!/bin/sh
# test_elf.sh FLASHATTN — `flashattn doctor --so` on small shared objects built here with g++:
# a stand-in "libc10.so" and extension modules compiled with -D_GLIBCXX_USE_CXX11_ABI=0 and =1,
# so the reader must see which ABI each uses and which undefined symbols the library does not
# define (demangled by the system's __cxa_demangle; without one, mangled with a hint), in both
# directions, plus a torch-version mismatch (same ABI, another signature). Then malformed files
# (truncated copies, garbage, empty, a directory).
# Exits 77 (skipped) without a C++ compiler.
set -u
FA=$1
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT INT TERM
CXX=$(command -v g++ || command -v c++ || true)
if [ -z "$CXX" ] || ! echo 'int main(){}' | "$CXX" -x c++ - -o "$TMP/probe" 2> /dev/null; then
    echo "SKIP: no working C++ compiler (install g++)"
    exit 77
fi
fail=0
pass=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL [$scenario]: $*"; fail=$((fail + 1)); }
has() { grep -qF -- "$1" "$out" && ok || { bad "missing: $1"; sed 's/^/    /' "$out" | head -30; }; }

cat > "$TMP/c10.cpp" <<'EOF'
#include <string>
namespace c10 {
struct SourceLocation { const char *function, *file; unsigned line; };
struct Error { Error(SourceLocation, std::string); std::string msg; };
Error::Error(SourceLocation, std::string m) : msg(m) {}
namespace detail {
void torchCheckFail(const char *, const char *, unsigned, const std::string &) {}
}
namespace cuda { void SetDevice(int) {} }
}
EOF
cat > "$TMP/ext.cpp" <<'EOF'
#include <string>
namespace c10 {
struct SourceLocation { const char *function, *file; unsigned line; };
struct Error { Error(SourceLocation, std::string); std::string msg; };
namespace detail {
void torchCheckFail(const char *, const char *, unsigned, const std::string &);
}
namespace cuda { void SetDevice(int); }
}
extern "C" void ext_entry() {
    c10::detail::torchCheckFail("f", "file", 1, std::string("x"));
    c10::Error e(c10::SourceLocation{"f", "file", 1}, std::string("y"));
    c10::cuda::SetDevice(0);
}
EOF
# the same extension compiled for a newer torch: SetDevice takes a DeviceIndex (signed char)
sed 's/void SetDevice(int)/void SetDevice(signed char)/' "$TMP/ext.cpp" > "$TMP/ext_new.cpp"

mkdir -p "$TMP/torch0" "$TMP/torch1"
"$CXX" -shared -fPIC -D_GLIBCXX_USE_CXX11_ABI=0 -o "$TMP/torch0/libc10.so" "$TMP/c10.cpp" &&
    "$CXX" -shared -fPIC -D_GLIBCXX_USE_CXX11_ABI=1 -o "$TMP/torch1/libc10.so" "$TMP/c10.cpp" &&
    "$CXX" -shared -fPIC -D_GLIBCXX_USE_CXX11_ABI=0 -o "$TMP/ext_abi0.so" "$TMP/ext.cpp" -L"$TMP/torch0" -lc10 &&
    "$CXX" -shared -fPIC -D_GLIBCXX_USE_CXX11_ABI=1 -o "$TMP/ext_abi1.so" "$TMP/ext.cpp" -L"$TMP/torch1" -lc10 &&
    "$CXX" -shared -fPIC -D_GLIBCXX_USE_CXX11_ABI=1 -o "$TMP/ext_new.so" "$TMP/ext_new.cpp" -L"$TMP/torch1" -lc10 &&
    "$CXX" -shared -fPIC -D_GLIBCXX_USE_CXX11_ABI=1 -o "$TMP/ext_noneed.so" "$TMP/ext.cpp" ||
    { echo "FAIL: cannot build the test objects"; exit 1; }

so() { # NAME MODULE LIBDIR [--json]
    scenario=$1
    out=$TMP/$1.out
    "$FA" doctor --so "$2" --lib-dir "$3" ${4:-} > "$out" 2>&1
    rc=$?
}

so abi1-on-abi1 "$TMP/ext_abi1.so" "$TMP/torch1"
[ $rc -eq 0 ] && ok || bad "exit $rc"
has "C++ ABI:  _GLIBCXX_USE_CXX11_ABI=1"
has "built with _GLIBCXX_USE_CXX11_ABI=1"
has "libc10.so                    $TMP/torch1/libc10.so"
has "[✓] every undefined symbol resolves"

so abi0-on-abi0 "$TMP/ext_abi0.so" "$TMP/torch0"
[ $rc -eq 0 ] && ok || bad "exit $rc"
has "C++ ABI:  _GLIBCXX_USE_CXX11_ABI=0"

so abi1-on-abi0 "$TMP/ext_abi1.so" "$TMP/torch0"
[ $rc -eq 1 ] && ok || bad "exit $rc"
has "torch:    $TMP/torch0/libc10.so built with _GLIBCXX_USE_CXX11_ABI=0"
has "= c10::detail::torchCheckFail(char const*, char const*, unsigned int, std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> > const&)"
has "= c10::Error::Error(c10::SourceLocation, std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> >)"
has "[✗] C++ ABI mismatch: the module was built with _GLIBCXX_USE_CXX11_ABI=1, torch with 0"

so abi0-on-abi1 "$TMP/ext_abi0.so" "$TMP/torch1"
[ $rc -eq 1 ] && ok || bad "exit $rc"
has "_ZN3c105ErrorC1ENS_14SourceLocationESs"
has "= c10::Error::Error(c10::SourceLocation, std::string)"
has "Use the wheel named cxx11abiTRUE"

# without a demangler: names stay mangled, the hint names c++filt, and the new ABI is still seen
# (std::__cxx11 is read from the mangled names)
export FLASHATTN_DEMANGLER=none
so no-demangler "$TMP/ext_abi1.so" "$TMP/torch0"
unset FLASHATTN_DEMANGLER
[ $rc -eq 1 ] && ok || bad "exit $rc"
has "_ZN3c106detail14torchCheckFailEPKcS2_jRKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE"
has "(not demangled: turned off by FLASHATTN_DEMANGLER=none; \`c++filt\` demangles them)"
has "[✗] C++ ABI mismatch: the module was built with _GLIBCXX_USE_CXX11_ABI=1, torch with 0"
grep -q "^    = " "$out" && bad "demangled without a demangler" || ok

so newer-torch "$TMP/ext_new.so" "$TMP/torch1"
[ $rc -eq 1 ] && ok || bad "exit $rc"
has "= c10::cuda::SetDevice(signed char)"
has "built for another PyTorch"

# libtorch's symbols unresolved only because libtorch was not found (or is not even needed: the
# module relies on `import torch`): libraries missing, not an ABI mismatch
so no-lib "$TMP/ext_abi1.so" "$TMP/nowhere"
[ $rc -eq 1 ] && ok || bad "exit $rc"
has "libc10.so                    NOT FOUND"
has "[✗] libraries missing, not an ABI mismatch: 3 undefined symbol(s) are libtorch's"
has "were not found or read: libc10.so."
grep -q "C++ ABI mismatch" "$out" && bad "reports a C++ ABI mismatch" || ok
so no-lib-abi0 "$TMP/ext_abi0.so" "$TMP/nowhere"
has "libraries missing, not an ABI mismatch"
grep -q "C++ ABI mismatch" "$out" && bad "reports a C++ ABI mismatch" || ok
so not-needed "$TMP/ext_noneed.so" "$TMP/torch1"
[ $rc -eq 1 ] && ok || bad "exit $rc"
has "it does not name libc10/libtorch as needed libraries"
has "import torch first"
grep -q "C++ ABI mismatch" "$out" && bad "reports a C++ ABI mismatch" || ok

so json "$TMP/ext_abi1.so" "$TMP/torch0" --json
PY=$(command -v python3 || true)
if [ -n "$PY" ]; then
    "$PY" - "$out" <<'EOF' && ok || bad "JSON"
import json, sys
d = json.load(open(sys.argv[1], encoding="utf-8"))
assert d["cxx11_abi"] == 1 and d["libraries_cxx11_abi"] == 0, d
assert d["missing"] >= 2 and any("torchCheckFail" in m["demangled"] for m in d["missing_symbols"])
assert any(n["name"] == "libc10.so" for n in d["needed"])
EOF
fi

# malformed files never crash the reader
scenario=malformed
size=$(wc -c < "$TMP/ext_abi1.so")
for n in 0 1 16 63 64 65 200 1000 4096 $((size / 3)) $((size / 2)) $((size - 100)) $((size - 1)); do
    head -c "$n" "$TMP/ext_abi1.so" > "$TMP/cut.so"
    "$FA" doctor --so "$TMP/cut.so" > "$TMP/cut.out" 2>&1
    r=$?
    [ $r -le 1 ] && ok || bad "truncated to $n bytes: exit $r"
done
head -c 100000 /dev/urandom > "$TMP/garbage.so"
"$FA" doctor --so "$TMP/garbage.so" > "$TMP/g.out" 2>&1; [ $? -eq 1 ] && grep -q "not an ELF file" "$TMP/g.out" && ok || bad "garbage"
: > "$TMP/empty.so"
"$FA" doctor --so "$TMP/empty.so" > /dev/null 2>&1; [ $? -eq 1 ] && ok || bad "empty"
"$FA" doctor --so "$TMP" > /dev/null 2>&1; [ $? -eq 1 ] && ok || bad "a directory"
# a valid header whose tables point outside the file
cp "$TMP/ext_abi1.so" "$TMP/bent.so"
printf '\377\377\377\377' | dd of="$TMP/bent.so" bs=1 seek=40 conv=notrunc 2> /dev/null
"$FA" doctor --so "$TMP/bent.so" > "$TMP/b.out" 2>&1; [ $? -eq 1 ] && ok || bad "section headers out of range"

# names read from the file reach the terminal cleaned as explain cleans a log: an OSC
# title-setting sequence and a clear-screen CSI in a DT_NEEDED entry and in an undefined
# symbol's name. The objects are built with marker names, then the markers are overwritten in
# place with escape sequences of the same length.
scenario=escapes
cat > "$TMP/patch.cpp" <<'EOF'
#include <cstdio>
#include <cstring>
#include <string>
// patch IN OUT MARKER BYTES: every MARKER in IN replaced by BYTES (same length), into OUT
int main(int argc, char **argv) {
    if (argc != 5 || std::strlen(argv[3]) != std::strlen(argv[4])) return 2;
    std::FILE *f = std::fopen(argv[1], "rb");
    if (!f) return 2;
    std::string d;
    char buf[65536];
    size_t n, hits = 0;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) d.append(buf, n);
    std::fclose(f);
    for (size_t at = d.find(argv[3]); at != std::string::npos; at = d.find(argv[3], at + 1), hits++)
        d.replace(at, std::strlen(argv[4]), argv[4]);
    f = std::fopen(argv[2], "wb");
    if (!f || std::fwrite(d.data(), 1, d.size(), f) != d.size() || std::fclose(f) != 0) return 2;
    return hits ? 0 : 1;
}
EOF
echo 'extern "C" void other() {}' > "$TMP/marklib.cpp"
echo 'extern "C" void SYMBOLMARKER_ABCDEFGH(); extern "C" void entry() { SYMBOLMARKER_ABCDEFGH(); }' > "$TMP/markext.cpp"
mkdir -p "$TMP/mark"
if "$CXX" -O1 -o "$TMP/patch" "$TMP/patch.cpp" &&
    "$CXX" -shared -fPIC -o "$TMP/mark/libNEEDEDMARKER_ABCDEFGH.so" "$TMP/marklib.cpp" \
        -Wl,-soname=libNEEDEDMARKER_ABCDEFGH.so &&
    "$CXX" -shared -fPIC -o "$TMP/markext.so" "$TMP/markext.cpp" -L"$TMP/mark" \
        -Wl,--no-as-needed -lNEEDEDMARKER_ABCDEFGH &&
    "$TMP/patch" "$TMP/markext.so" "$TMP/esc1.so" NEEDEDMARKER_ABCDEFGH "$(printf '\033]0;PWNED\007\033[2J_EVIL__')" &&
    "$TMP/patch" "$TMP/esc1.so" "$TMP/esc.so" SYMBOLMARKER_ABCDEFGH "$(printf 'sym\033[31mRED\033]2;T\007xxxx')"; then
    # the number of control bytes other than newline and TAB in a file
    ctl() { LC_ALL=C tr -d '\n\t\040-\176\200-\377' < "$1" | wc -c | tr -d ' '; }
    out=$TMP/esc.out
    "$FA" doctor --so "$TMP/esc.so" > "$out" 2>&1
    [ "$(ctl "$out")" = 0 ] && ok || { bad "control bytes reach the terminal:"; od -c "$out" | grep '033' | head -5; }
    has "lib0;PWNED?_EVIL__.so"
    has "symRED2;T?xxxx"
    out=$TMP/esc.json
    "$FA" doctor --so "$TMP/esc.so" --json > "$out" 2>&1
    [ "$(ctl "$out")" = 0 ] && ok || bad "control bytes in the JSON"
    has '"name": "lib\u001b]0;PWNED\u0007\u001b[2J_EVIL__.so"'
    has '"symbol": "sym\u001b[31mRED\u001b]2;T\u0007xxxx"'
else
    bad "cannot build or patch the objects with escape sequences"
fi

# a FIFO (opening one waits for a writer), a directory and a device: refused at once, by type
scenario=file-types
mkfifo "$TMP/fifo"
out=$TMP/fifo.out
timeout 20 "$FA" doctor --so "$TMP/fifo" > "$out" 2>&1
rc=$?
[ $rc -eq 1 ] && ok || bad "a FIFO: exit $rc (124: it blocked)"
has "a FIFO (named pipe), not a regular file"
out=$TMP/dir.out
timeout 20 "$FA" doctor --so "$TMP" > "$out" 2>&1
[ $? -eq 1 ] && ok || bad "a directory: exit status"
has "a directory, not a regular file"
if [ -c /dev/null ]; then
    out=$TMP/dev.out
    timeout 20 "$FA" doctor --so /dev/null > "$out" 2>&1
    [ $? -eq 1 ] && ok || bad "a device: exit status"
    has "a character device, not a regular file"
fi

echo "test_elf: $pass passed, $fail failed"
[ $fail -eq 0 ]
