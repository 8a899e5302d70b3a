#!/bin/sh
# test_explain.sh FLASHATTN SRCDIR — `flashattn explain` end to end:
#   - every fixture in tests/tools/explain/logs/ gets the class its name starts with (CLASS--what.log),
#     and every class name has a fixture; --json output is one valid JSON object with exactly
#     the keys class, language, evidence, evidence_english, fix;
#   - malformed input: an empty file, binary garbage (an ELF file, random bytes), a 100 MB log
#     generated on the fly and streamed through a pipe (bounded memory: run under a 256 MB
#     address-space limit unless sanitizers are on), 1 MB lines, a missing file;
#   - --demangle and --list-classes.
set -u
FA=$1
SRC=$2
LOGS=$SRC/tests/tools/explain/logs
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT INT TERM
fail=0
pass=0

ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }

# JSON outputs are collected and validated by one Python run at the end (when there is one).
n_json=0
json_check() { # file: one JSON object, keys class/language/evidence/evidence_english/fix
    n_json=$((n_json + 1))
    cp "$1" "$TMP/json.$n_json"
}
class_of() { sed -n 's/^{"class": "\([a-z0-9_]*\)".*/\1/p' "$1"; }

# 1. fixtures
for f in "$LOGS"/*.log; do
    name=${f##*/}
    want=${name%%--*}
    "$FA" explain --json "$f" > "$TMP/out.json" 2> "$TMP/err" || { bad "$name: exit $?"; continue; }
    got=$(class_of "$TMP/out.json")
    if [ "$got" = "$want" ]; then ok; else bad "$name: class '$got', want '$want'"; fi
    json_check "$TMP/out.json"
    "$FA" explain "$f" > "$TMP/out.txt" || bad "$name: text mode exit $?"
    grep -q "^class:    $want\$" "$TMP/out.txt" || bad "$name: text mode class"
done
for c in $("$FA" explain --list-classes); do
    ls "$LOGS/$c--"*.log > /dev/null 2>&1 && ok || bad "no fixture for class $c"
done
[ "$("$FA" explain --list-classes | wc -l)" -eq 26 ] && ok || bad "--list-classes count"

# the buried ones: the evidence is the real first error, not the noise after it
"$FA" explain "$LOGS/build_oom--cc1plus_killed_buried.log" > "$TMP/o" &&
    grep -q "Killed signal terminated program cc1plus" "$TMP/o" && ! grep -q "HTTP Error 404: Not" "$TMP/o" && ok ||
    bad "buried OOM evidence"
"$FA" explain "$LOGS/missing_cuda_headers--cusparse_buried.log" > "$TMP/o" &&
    grep -q "fatal error: cusparse.h" "$TMP/o" && ! grep -q "does not name a type" "$TMP/o" && ok ||
    bad "buried header evidence"
"$FA" explain "$LOGS/unknown--unrecognized_compile_error_buried.log" > "$TMP/o" &&
    grep -q "SM80_16x8x16_F32BF16BF16F32_TN_V2" "$TMP/o" && grep -q "HTTP 404" "$TMP/o" && ok ||
    bad "buried generic error"
"$FA" explain "$LOGS/cxx11_abi_mismatch--import_oldabi_ext_on_ngc_torch.log" > "$TMP/o" &&
    grep -q "^symbol:   c10::Error::Error(c10::SourceLocation, std::string)" "$TMP/o" &&
    grep -q "cxx11abiTRUE" "$TMP/o" && ok || bad "ABI fix names the side"

# what the release table says about the wheel setup.py guessed
flat() { tr '\n' ' ' < "$1" | tr -s ' '; } # the text output wrapped back into one line
"$FA" explain "$LOGS/wheel_not_found--guess_404_then_building.log" > "$TMP/o" &&
    flat "$TMP/o" | grep -q "flash-attn 2.8.3 published no such wheel: torch 2.9" && ok || bad "guessed wheel: not published"
printf 'Guessing wheel URL:  https://github.com/Dao-AILab/flash-attention/releases/download/v2.8.3/flash_attn-2.8.3+cu12torch2.8cxx11abiTRUE-cp312-cp312-linux_x86_64.whl\nurllib.error.HTTPError: HTTP Error 404: Not Found\n' |
    "$FA" explain > "$TMP/o" && flat "$TMP/o" | grep -q "part of the 2.8.3 release, so the 404 points at the download" && ok ||
    bad "guessed wheel: published"

# localized gcc/glibc/bash messages (tools/explain/logmsg.c) read as English, language named
while IFS='|' read -r lang want line; do
    printf '%s\n' "$line" | "$FA" explain > "$TMP/o" && grep -q "^class:    $want\$" "$TMP/o" &&
        grep -q "^language: $lang\$" "$TMP/o" && grep -q "(in English: " "$TMP/o" && ok ||
        bad "localized $lang: $(head -3 "$TMP/o" | tr '\n' ' ')"
done <<'LOCALIZED'
zh_CN|missing_cuda_headers|x.cu:1:10: 致命错误：cuda_runtime.h：没有那个文件或目录
de|missing_cuda_headers|x.cu:1:10: schwerwiegender Fehler: cuda_runtime.h: Datei oder Verzeichnis nicht gefunden
ja|missing_cuda_headers|x.cu:1:10: 致命的エラー: cuda_runtime.h: そのようなファイルやディレクトリはありません
ko|missing_cuda_headers|x.cu:1:10: fatal error: cuda_runtime.h: 그런 파일이나 디렉터리가 없습니다
ru|missing_cuda_headers|x.cu:1:10: фатальная ошибка: cuda_runtime.h: Нет такого файла или каталога
es|missing_cuda_headers|x.cu:1:10: error fatal: cuda_runtime.h: No existe el fichero o el directorio
fr|missing_cuda_headers|x.cu:1:10: erreur fatale: cuda_runtime.h : Aucun fichier ou dossier de ce nom
pt_BR|missing_cuda_headers|x.cu:1:10: fatal error: cuda_runtime.h: Arquivo ou diretório inexistente
zh_CN|nvcc_missing|/bin/sh: 1: nvcc: 未找到命令
ru|nvcc_missing|bash: nvcc: команда не найдена
es|nvcc_missing|bash: nvcc: orden no encontrada
de|nvcc_missing|bash: nvcc: Kommando nicht gefunden
LOCALIZED

# 2. stdin, empty, missing
"$FA" explain < "$LOGS/gpu_unsupported--turing_t4.log" > "$TMP/o" && grep -q "^class:    gpu_unsupported" "$TMP/o" && ok || bad "stdin"
: > "$TMP/empty.log"
"$FA" explain --json "$TMP/empty.log" > "$TMP/o.json" && [ "$(class_of "$TMP/o.json")" = unknown ] && ok || bad "empty file"
json_check "$TMP/o.json"
"$FA" explain "$TMP/does-not-exist.log" > /dev/null 2>&1; [ $? -eq 1 ] && ok || bad "missing file exit status"
"$FA" explain --bogus > /dev/null 2>&1; [ $? -eq 2 ] && ok || bad "bad option exit status"

# 3. binary garbage
"$FA" explain --json "$FA" > "$TMP/o.json" && ok || bad "ELF binary as a log"
json_check "$TMP/o.json"
head -c 2000000 /dev/urandom > "$TMP/random.bin"
"$FA" explain --json "$TMP/random.bin" > "$TMP/o.json" && ok || bad "random bytes"
json_check "$TMP/o.json"
# garbage with a real error inside it
{ head -c 300000 /dev/urandom; printf '\nImportError: x.so: undefined symbol: _ZN3c104cuda9SetDeviceEi\n'; head -c 300000 /dev/urandom; } > "$TMP/mixed.bin"
"$FA" explain --json "$TMP/mixed.bin" > "$TMP/o.json" && [ "$(class_of "$TMP/o.json")" = torch_version_mismatch ] && ok ||
    bad "an error inside random bytes: $(head -c 200 "$TMP/o.json")"

# 4. 1 MB lines: kept to the cap, the error on the next line still found
line=$(head -c 1048576 /dev/zero | tr '\0' 'x')
{ printf '%s\n' "$line" "$line"; printf 'RuntimeError: FlashAttention only supports Ampere GPUs or newer.\n'; printf '%s' "$line"; } > "$TMP/long.log"
"$FA" explain "$TMP/long.log" > "$TMP/o" && grep -q "^class:    gpu_unsupported" "$TMP/o" && grep -q "long lines cut" "$TMP/o" && ok ||
    bad "1 MB lines"

# 5. 100 MB streamed through a pipe, the real error in the middle, in bounded memory
noise='[17/85] /usr/local/cuda/bin/nvcc -c flash_bwd_hdim128_fp16_sm80.cu -o flash_bwd_hdim128_fp16_sm80.o -O3 -std=c++17 --use_fast_math -gencode arch=compute_80,code=sm_80'
gen() {
    yes "$noise" | head -c 50000000
    echo 'c++: fatal error: Killed signal terminated program cc1plus'
    yes "$noise" | head -c 50000000
}
limit=""
[ -z "${FA_SANITIZE_FLAGS:-}" ] && limit="ulimit -v 262144;"
start=$(date +%s)
gen | sh -c "$limit exec \"$FA\" explain --json" > "$TMP/o.json" 2> "$TMP/err"
rc=$?
end=$(date +%s)
if [ $rc -eq 0 ] && [ "$(class_of "$TMP/o.json")" = build_oom ]; then ok; else bad "100 MB log: rc $rc, $(head -c 300 "$TMP/o.json") $(head -c 300 "$TMP/err")"; fi
echo "100 MB log: $((end - start)) s${limit:+ under a 256 MB address-space limit}"

# 6. --demangle, through the system's __cxa_demangle (libstdc++), and without one
out=$("$FA" explain --demangle _ZN3c106detail14torchCheckFailEPKcS2_jRKSs not_mangled)
exp='c10::detail::torchCheckFail(char const*, char const*, unsigned int, std::string const&)
not_mangled'
[ "$out" = "$exp" ] && ok || bad "--demangle: $out"
out=$(printf '_ZN3c104cuda9SetDeviceEa\n' | "$FA" explain --demangle)
[ "$out" = "c10::cuda::SetDevice(signed char)" ] && ok || bad "--demangle stdin: $out"
out=$(FLASHATTN_DEMANGLER=none "$FA" explain --demangle _ZN3c104cuda9SetDeviceEa 2> "$TMP/err")
[ "$out" = "_ZN3c104cuda9SetDeviceEa" ] && grep -q 'FLASHATTN_DEMANGLER=none.*c++filt' "$TMP/err" &&
    ok || bad "--demangle without a demangler: $out / $(cat "$TMP/err")"
out=$(FLASHATTN_DEMANGLER=/nonexistent/libstdc++.so.6 "$FA" explain --demangle _Z1fv 2> "$TMP/err")
[ "$out" = "_Z1fv" ] && grep -q '/nonexistent/libstdc++.so.6' "$TMP/err" && ok ||
    bad "--demangle with a missing runtime: $out / $(cat "$TMP/err")"

PY=$(command -v python3 || true)
if [ -n "$PY" ]; then
    if "$PY" - "$TMP"/json.* <<'EOF'
import json, sys
for path in sys.argv[1:]:
    d = json.load(open(path, encoding="utf-8"))
    assert set(d) == {"class", "language", "evidence", "evidence_english", "fix"}, (path, d.keys())
    assert isinstance(d["class"], str) and isinstance(d["fix"], str) and d["fix"], path
    assert isinstance(d["evidence"], list) and all(isinstance(x, str) for x in d["evidence"]), path
print("JSON: %d documents valid" % (len(sys.argv) - 1))
EOF
    then ok; else bad "JSON validation"; fi
else
    echo "JSON: not validated (no python3)"
fi

echo "test_explain: $pass passed, $fail failed"
[ $fail -eq 0 ]
