/* SPDX-License-Identifier: MIT */
/*
 * tools/explain/ — `flashattn explain`: a build or import log classified and its fix named; the
 * bounded log reader.
 *
 * logmsg.c — the table of translated messages and the rewrite of a line into English (see
 * logmsg.h). The table is data: each row is a language, the translated text as the tool prints
 * it, the English msgid, and where the pair was checked. Rows whose language is "" only
 * normalize punctuation (the full-width colon of zh_CN gcc messages) and name no language.
 * Longer texts come first where one contains another ("致命错误：" before "错误："). Where a
 * catalogue changed its text, both texts are rows, each with its version range.
 *
 * How the rows were checked (each msgstr read from the catalogue, fuzzy entries not counted):
 * - glibc: po/<lang>.po of bminor/glibc at every release tag glibc-2.17 .. glibc-2.42 and at
 *   master 04e750e75b73 (2.42.9000); tags used below: glibc-2.27 23158b08a090, glibc-2.28
 *   3c03baca37fd, glibc-2.38 36f2487f13e3, glibc-2.39 ef321e23c20e.
 * - bash: po/<lang>.po of bminor/bash at every release tag bash-4.0 .. bash-5.3 (b8c60bc9ca36)
 *   and master 637f5c8696a6. The msgid is "%s: command not found" up to 5.2 and
 *   "command not found" in 5.3, where ja and ru are fuzzy (so those print English).
 * - gcc: gcc-mirror/gcc is too large to fetch here, so the catalogues were read from the gcc
 *   release po files as compiled in Debian's gcc-11-locales 11.3.0-12 and gcc-12-locales
 *   12.2.0-14+deb12u1 (msgunfmt of gcc-11.mo / gcc-12.mo; same texts in both). gcc has no
 *   pt_BR catalogue.
 * - binutils ld: ld/po/zh_CN.po (ld 2.24.90) of bminor/binutils-gdb at 081bb924c995; the same
 *   file ships in Debian binutils-common 2.40. binutils has no ld/po/de.po.
 * - git: po/zh_CN.po of git/git at tags v2.10.0 .. v2.53.0 and master 1a3e64c6c4a6.
 * - Windows and MSVC texts have no public catalogue: each row cites a real log that shows it.
 */
#define _POSIX_C_SOURCE 200809L

#include "logmsg.h"

#include <string.h>

typedef struct logm_entry {
    const char *lang, *text, *english, *source;
} logm_entry;

static const logm_entry table[] = {
    /* strerror(ENOENT): glibc po/<lang>.po, msgid "No such file or directory" */
    {"zh_CN", "没有那个文件或目录", "No such file or directory", "glibc po/zh_CN.po, 2.17-2.42"},
    {"zh_TW", "沒有此一檔案或目錄", "No such file or directory", "glibc po/zh_TW.po, 2.17-2.42"},
    {"de", "Datei oder Verzeichnis nicht gefunden", "No such file or directory",
     "glibc po/de.po, 2.17-2.42"},
    {"ja", "そのようなファイルやディレクトリはありません", "No such file or directory",
     "glibc po/ja.po, 2.17-2.42"},
    {"ko", "그런 파일이나 디렉터리가 없습니다", "No such file or directory",
     "glibc po/ko.po, 2.17-2.42"},
    {"ru", "Нет такого файла или каталога", "No such file or directory",
     "glibc po/ru.po, 2.17-2.42"},
    {"es", "No existe el fichero o el directorio", "No such file or directory",
     "glibc po/es.po, 2.17-2.42"},
    {"fr", "Aucun fichier ou dossier de ce nom", "No such file or directory",
     "glibc po/fr.po, 2.39-2.42"},
    {"fr", "Aucun fichier ou dossier de ce type", "No such file or directory",
     "glibc po/fr.po, 2.17-2.38"},
    {"pt_BR", "Arquivo ou diretório inexistente", "No such file or directory",
     "glibc po/pt_BR.po, 2.28-2.42"},
    {"pt_BR", "Arquivo ou diretório não encontrado", "No such file or directory",
     "glibc po/pt_BR.po, 2.17-2.27"},
    /* strerror(EACCES): glibc po/<lang>.po, msgid "Permission denied" */
    {"zh_CN", "权限不够", "Permission denied", "glibc po/zh_CN.po, 2.17-2.42"},
    {"de", "Keine Berechtigung", "Permission denied", "glibc po/de.po, 2.17-2.42"},
    {"ja", "許可がありません", "Permission denied", "glibc po/ja.po, 2.17-2.42"},
    {"ko", "허가 거부", "Permission denied", "glibc po/ko.po, 2.17-2.42"},
    {"ru", "Отказано в доступе", "Permission denied", "glibc po/ru.po, 2.17-2.42"},
    {"es", "Permiso denegado", "Permission denied", "glibc po/es.po, 2.17-2.42"},
    {"fr", "Permission non accordée", "Permission denied", "glibc po/fr.po, 2.17-2.42"},
    {"pt_BR", "Permissão negada", "Permission denied", "glibc po/pt_BR.po, 2.17-2.42"},
    /* strsignal(SIGKILL): glibc po/<lang>.po, msgid "Killed" */
    {"zh_CN", "已杀死", "Killed", "glibc po/zh_CN.po, 2.17-2.42"},
    {"de", "Getötet", "Killed", "glibc po/de.po, 2.17-2.42"},
    {"ja", "強制終了", "Killed", "glibc po/ja.po, 2.17-2.42"},
    {"ru", "Убито", "Killed", "glibc po/ru.po, 2.17-2.42"},
    {"es", "Terminado (killed)", "Killed", "glibc po/es.po, 2.17-2.42"},
    {"pt_BR", "Morto", "Killed", "glibc po/pt_BR.po, 2.17-2.42"},
    /* bash po/<lang>.po, msgid "%s: command not found" (to 5.2), "command not found" (5.3) */
    {"zh_CN", "未找到命令", "command not found", "bash po/zh_CN.po, 4.2-5.3"},
    {"de", "Kommando nicht gefunden", "command not found", "bash po/de.po, 4.0-5.3"},
    {"ja", "コマンドが見つかりません", "command not found", "bash po/ja.po, 4.0-5.2"},
    {"ru", "команда не найдена", "command not found", "bash po/ru.po, 4.0-5.2"},
    {"es", "no se encontró la orden", "command not found", "bash po/es.po, 4.0-4.4"},
    {"es", "orden no encontrada", "command not found", "bash po/es.po, 5.0-5.3"},
    {"fr", "commande introuvable", "command not found", "bash po/fr.po, 4.0-5.3"},
    {"pt_BR", "comando não encontrado", "command not found", "bash po/pt_BR.po, 4.0-5.3"},
    /* gcc po/<lang>.po, diagnostic kinds msgid "fatal error: " and "error: " */
    {"zh_CN", "致命错误：", "fatal error: ", "gcc po/zh_CN.po, gcc 11-12"},
    {"zh_CN", "错误：", "error: ", "gcc po/zh_CN.po, gcc 11-12"},
    {"de", "schwerwiegender Fehler: ", "fatal error: ", "gcc po/de.po, gcc 11-12"},
    {"de", "Fehler: ", "error: ", "gcc po/de.po, gcc 11-12"},
    {"ja", "致命的エラー: ", "fatal error: ", "gcc po/ja.po, gcc 11-12"},
    {"ja", "エラー: ", "error: ", "gcc po/ja.po, gcc 11-12"},
    {"ru", "фатальная ошибка: ", "fatal error: ", "gcc po/ru.po, gcc 11-12"},
    {"ru", "ошибка: ", "error: ", "gcc po/ru.po, gcc 11-12"},
    {"es", "error fatal: ", "fatal error: ", "gcc po/es.po, gcc 11-12"},
    {"fr", "erreur fatale: ", "fatal error: ", "gcc po/fr.po, gcc 11-12"},
    {"fr", "erreur: ", "error: ", "gcc po/fr.po, gcc 11-12"},
    /* gcc msgid "compilation terminated.\n" */
    {"zh_CN", "编译中断。", "compilation terminated.", "gcc po/zh_CN.po, gcc 11-12"},
    /* binutils ld/po/zh_CN.po: msgid "%X%C: undefined reference to `%T'\n" (older ld only;
     * newer ld's "%X%P: %C: undefined reference to `%pT'\n" has no zh_CN text) and
     * "%P: cannot find %s\n", "%P: cannot find %s: %E\n" */
    {"zh_CN", "未定义的引用", "undefined reference",
     "binutils ld/po/zh_CN.po (ld 2.24.90), older ld only"},
    {"zh_CN", "找不到 -l", "cannot find -l", "binutils ld/po/zh_CN.po (ld 2.24.90)"},
    /* git po/zh_CN.po, msgid "not a git repository (or any of the parent directories): %s" */
    {"zh_CN", "不是一个 git 仓库（或者任何父目录）",
     "not a git repository (or any of the parent directories)", "git po/zh_CN.po, v2.10-v2.28"},
    {"zh_CN", "不是 Git 仓库（或者任何父目录）",
     "not a git repository (or any of the parent directories)", "git po/zh_CN.po, v2.53-"},
    {"zh_CN", "不是 git 仓库（或者任何父目录）",
     "not a git repository (or any of the parent directories)", "git po/zh_CN.po, v2.29-v2.52"},
    /* Windows system message ERROR_FILE_NOT_FOUND, as Python prints it after [WinError 2] */
    {"zh_CN", "系统找不到指定的文件。", "The system cannot find the file specified",
     "as printed in a real log: "
     "https://github.com/dBeker/Faster-RCNN-TensorFlow-Python3/issues/7"},
    {"ja", "指定されたファイルが見つかりません。", "The system cannot find the file specified",
     "as printed in a real log: https://github.com/Zuntan03/EasyWan22/issues/18"},
    {"ko", "지정된 파일을 찾을 수 없습니다", "The system cannot find the file specified",
     "as printed in a real log: "
     "https://github.com/braincrew-lab/langgraph-mcp-agents/issues/7"},
    {"ru", "Не удается найти указанный файл", "The system cannot find the file specified",
     "as printed in a real log: https://github.com/bablosoft/BASRemote.NET/issues/13"},
    {"es", "El sistema no puede encontrar el archivo especificado",
     "The system cannot find the file specified",
     "as printed in a real log: https://github.com/kirill-markin/repo-to-text/issues/24"},
    {"fr", "Le fichier spécifié est introuvable", "The system cannot find the file specified",
     "as printed in a real log: https://github.com/zi-yue-1129/DATAGEN/issues/11"},
    {"pt_BR", "O sistema não pode encontrar o arquivo especificado",
     "The system cannot find the file specified",
     "as printed in a real log: "
     "https://github.com/hadtrindade/conversor-e-divisor/issues/65"},
    /* MSVC zh-CN diagnostics (cl.exe's localized resources) */
    {"zh_CN", "的前面有意外标记；跳过明显的函数体",
     "unexpected token(s) preceding; skipping apparent function body",
     "MSVC zh-CN C2334, as printed in a real log: "
     "https://github.com/Tencent/GameAISDK/issues/5"},
    /* punctuation only */
    {"", "：", ": ", ""},
};

#define N_ENTRIES (sizeof table / sizeof table[0])

_Static_assert(N_ENTRIES <= 0xffff, "row numbers must fit in unsigned short");

/* The rows by the first byte of their text, built on first use: a line is scanned once, and
 * at each byte only the rows that start with it are compared. Each byte has room for every
 * row, so no row is ever left out. */
static unsigned short by_first[256][N_ENTRIES], n_first[256];
static unsigned char built;

static void build_index(void) {
    size_t k;
    for (k = 0; k < N_ENTRIES; k++) {
        unsigned char c = (unsigned char)table[k].text[0];
        by_first[c][n_first[c]++] = (unsigned short)k;
    }
    built = 1;
}

const char *logm_to_english(const char *line, size_t len, char *out, size_t cap) {
    const char *lang = NULL;
    size_t i = 0, o = 0, k;
    if (!cap)
        return NULL;
    if (!built)
        build_index();
    while (i < len && o + 1 < cap) {
        unsigned char c = (unsigned char)line[i];
        const logm_entry *hit = NULL;
        for (k = 0; k < n_first[c]; k++) {
            const logm_entry *e = &table[by_first[c][k]];
            size_t n = strlen(e->text);
            if (n <= len - i && !memcmp(line + i, e->text, n)) {
                hit = e;
                break;
            }
        }
        if (!hit) {
            out[o++] = line[i++];
            continue;
        }
        k = strlen(hit->english);
        if (o + k + 1 > cap)
            break;
        memcpy(out + o, hit->english, k);
        o += k;
        i += strlen(hit->text);
        if (!lang && hit->lang[0])
            lang = hit->lang;
    }
    out[o] = '\0';
    return lang;
}
