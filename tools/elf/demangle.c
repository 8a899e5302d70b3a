/* SPDX-License-Identifier: MIT */
/*
 * demangle.c — a small Itanium C++ ABI demangler (see demangle.h for what it covers).
 *
 * Two passes, like every Itanium demangler: a recursive-descent parser builds a tree of nodes
 * in an arena (recording substitution candidates and template arguments as the ABI says), then
 * a printer walks the tree. Types print in two halves (left and right of the declarator), so
 * "pointer to function returning void taking int" comes out as "void (*)(int)" and "reference
 * to array of 14 const char" as "char const (&) [14]", in GNU c++filt's style.
 *
 * Everything is bounded: recursion depth, node memory, substitution count and output length.
 * On anything unsupported or malformed the parser fails and dmg_demangle returns NULL.
 */
#define _POSIX_C_SOURCE 200809L

#include "demangle.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DMG_MAX_DEPTH 160         /* parser recursion */
#define DMG_MAX_PRINT_DEPTH 256   /* printer recursion (trees are DAGs through substitutions) */
#define DMG_MAX_ARENA (4u << 20)  /* bytes of nodes and lists per name */
#define DMG_MAX_SUBS 4096         /* substitution candidates */
#define DMG_MAX_OUT (64u << 10)   /* characters of output */
#define DMG_MAX_INPUT (64u << 10) /* characters of input */

/* ---- nodes ----------------------------------------------------------------------------------- */

enum dmg_kind {
    K_NAME,       /* text */
    K_BUILTIN,    /* text; code = the mangled letter(s) for literal printing */
    K_NESTED,     /* a::b */
    K_TEMPLATE,   /* a<list> */
    K_ABITAG,     /* a[abi:text] */
    K_SPECIALSUB, /* Ss, Si, ...: text = short form, text2 = the form printed */
    K_CTOR,       /* text = class base name */
    K_DTOR,       /* ~text */
    K_OPERATOR,   /* "operator" + text */
    K_CONVOP,     /* operator a */
    K_QUAL,       /* a + cv */
    K_PTR,        /* a* */
    K_LREF,       /* a& */
    K_RREF,       /* a&& */
    K_FUNC,       /* a = return type (or NULL), list = params, cv, ref */
    K_ARRAY,      /* a = element, text = dimension (may be empty) */
    K_PTRMEM,     /* a = class, b = member type */
    K_VECTOR,     /* a = element, text = count */
    K_ENCODING,   /* a = name, b = return type (or NULL), list = params, cv, ref */
    K_SPECIAL,    /* text + a ("vtable for " X) */
    K_LITERAL,    /* a = type, text = digits, neg */
    K_LOCAL,      /* a::b where a is an encoding */
    K_PACK,       /* list: a template argument pack */
    K_EXPANSION,  /* a: pack expansion pattern */
    K_TPARAM,     /* num = index; a = the argument it meant where it was parsed */
    K_LAMBDA,     /* list = params, num */
    K_UNNAMED,    /* num */
    K_CLONE       /* a + " [clone text]" */
};

typedef struct dmg_node dmg_node;

typedef struct dmg_list {
    dmg_node **items;
    size_t count, cap;
} dmg_list;

struct dmg_node {
    int kind;
    const char *text;
    size_t len;
    const char *text2; /* K_SPECIALSUB: the expanded form */
    size_t len2;
    dmg_node *a, *b;
    dmg_list *list;
    dmg_list *tlist; /* K_ENCODING: the template arguments T_ means inside it */
    unsigned cv;     /* 1 const, 2 volatile, 4 restrict */
    int ref;         /* 0, 1 (&), 2 (&&) */
    int neg;         /* K_LITERAL */
    char code;       /* K_BUILTIN: mangled letter */
    long num;
};

/* ---- arena ----------------------------------------------------------------------------------- */

typedef struct dmg_block {
    struct dmg_block *next;
    size_t used, size;
    max_align_t data[];
} dmg_block;

typedef struct dmg_state {
    const char *p, *end;
    dmg_block *blocks;
    size_t arena_total;
    dmg_node **subs;
    size_t nsubs, capsubs;
    dmg_list *tparams; /* the template arguments T_ refers to */
    int depth;
    int type_depth; /* > 0 while parsing a type or template argument */
    int failed;
    unsigned flags;
} dmg_state;

static void *dmg_alloc(dmg_state *st, size_t bytes) {
    dmg_block *b = st->blocks;
    void *r;
    bytes = (bytes + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    if (!b || b->size - b->used < bytes) {
        size_t size = bytes > 16384 ? bytes : 16384;
        if (st->arena_total + size > DMG_MAX_ARENA) {
            st->failed = 1;
            return NULL;
        }
        b = malloc(sizeof(dmg_block) + size);
        if (!b) {
            st->failed = 1;
            return NULL;
        }
        b->next = st->blocks;
        b->used = 0;
        b->size = size;
        st->blocks = b;
        st->arena_total += size;
    }
    r = (char *)b->data + b->used;
    b->used += bytes;
    memset(r, 0, bytes);
    return r;
}

static dmg_node *mk(dmg_state *st, int kind) {
    dmg_node *n = dmg_alloc(st, sizeof *n);
    if (n)
        n->kind = kind;
    return n;
}

static dmg_node *mk_text(dmg_state *st, int kind, const char *text, size_t len) {
    dmg_node *n = mk(st, kind);
    if (n) {
        n->text = text;
        n->len = len;
    }
    return n;
}

static dmg_node *mk_cstr(dmg_state *st, int kind, const char *text) {
    return mk_text(st, kind, text, strlen(text));
}

static dmg_node *mk2(dmg_state *st, int kind, dmg_node *a, dmg_node *b) {
    dmg_node *n;
    if (!a)
        return NULL;
    n = mk(st, kind);
    if (n) {
        n->a = a;
        n->b = b;
    }
    return n;
}

static dmg_list *list_new(dmg_state *st) { return dmg_alloc(st, sizeof(dmg_list)); }

static int list_add(dmg_state *st, dmg_list *l, dmg_node *n) {
    if (!l || !n)
        return 0;
    if (l->count == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        dmg_node **items = dmg_alloc(st, cap * sizeof *items);
        if (!items)
            return 0;
        if (l->count)
            memcpy(items, l->items, l->count * sizeof *items);
        l->items = items;
        l->cap = cap;
    }
    l->items[l->count++] = n;
    return 1;
}

static void add_sub(dmg_state *st, dmg_node *n) {
    if (!n)
        return;
    if (st->nsubs >= DMG_MAX_SUBS) {
        st->failed = 1;
        return;
    }
    if (st->nsubs == st->capsubs) {
        size_t cap = st->capsubs ? st->capsubs * 2 : 32;
        dmg_node **s = realloc(st->subs, cap * sizeof *s);
        if (!s) {
            st->failed = 1;
            return;
        }
        st->subs = s;
        st->capsubs = cap;
    }
    st->subs[st->nsubs++] = n;
}

/* ---- lexing helpers -------------------------------------------------------------------------- */

/* The character k places ahead, or '\0' past the end (also once p has been advanced beyond
 * it by a two-character code cut short: every read goes through here). */
static char peek(const dmg_state *st, size_t k) {
    if (st->p >= st->end)
        return '\0';
    return (size_t)(st->end - st->p) > k ? st->p[k] : '\0';
}

static int eat(dmg_state *st, char c) {
    if (peek(st, 0) == c) {
        st->p++;
        return 1;
    }
    return 0;
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }
static int is_upper(char c) { return c >= 'A' && c <= 'Z'; }
static int is_lower(char c) { return c >= 'a' && c <= 'z'; }

/* A non-negative decimal number; -1 if none or absurdly large. */
static long parse_number(dmg_state *st) {
    long v = 0;
    if (!is_digit(peek(st, 0)))
        return -1;
    while (is_digit(peek(st, 0))) {
        v = v * 10 + (peek(st, 0) - '0');
        if (v > 1000000)
            return -1;
        st->p++;
    }
    return v;
}

/* <seq-id> _ : base 36 with digits and upper-case letters; "_" alone is -1 (so S_ is 0). */
static long parse_seq_id(dmg_state *st) {
    long v = 0;
    int any = 0;
    for (;;) {
        char c = peek(st, 0);
        if (is_digit(c))
            v = v * 36 + (c - '0');
        else if (is_upper(c))
            v = v * 36 + (c - 'A' + 10);
        else
            break;
        any = 1;
        if (v > 1000000)
            return -2;
        st->p++;
    }
    if (!eat(st, '_'))
        return -2;
    return any ? v : -1;
}

/* ---- the parser ------------------------------------------------------------------------------ */

static dmg_node *parse_type(dmg_state *st);
static dmg_node *parse_encoding(dmg_state *st);
static dmg_node *parse_name(dmg_state *st, unsigned *cv, int *ref, int *is_template, int *no_ret);
static dmg_list *parse_template_args(dmg_state *st);

#define ENTER(st)                                                                                  \
    do {                                                                                           \
        if ((st)->failed || ++(st)->depth > DMG_MAX_DEPTH) {                                       \
            (st)->failed = 1;                                                                      \
            (st)->depth--;                                                                         \
            return NULL;                                                                           \
        }                                                                                          \
    } while (0)
#define LEAVE(st, v)                                                                               \
    do {                                                                                           \
        (st)->depth--;                                                                             \
        if ((st)->failed)                                                                          \
            return NULL;                                                                           \
        return (v);                                                                                \
    } while (0)

static dmg_node *parse_source_name(dmg_state *st) {
    long n = parse_number(st);
    const char *s;
    if (n <= 0 || n > st->end - st->p) {
        st->failed = 1;
        return NULL;
    }
    s = st->p;
    st->p += n;
    if (n >= 10 && strncmp(s, "_GLOBAL_", 8) == 0 && (s[8] == '.' || s[8] == '_' || s[8] == '$') &&
        s[9] == 'N')
        return mk_cstr(st, K_NAME, "(anonymous namespace)");
    if (n == 7 && memcmp(s, "__cxx11", 7) == 0)
        st->flags |= DMG_FLAG_CXX11;
    return mk_text(st, K_NAME, s, (size_t)n);
}

typedef struct dmg_op {
    const char code[3];
    const char *name;
} dmg_op;

static const dmg_op dmg_ops[] = {
    {"nw", " new"}, {"na", " new[]"}, {"dl", " delete"}, {"da", " delete[]"}, {"ps", "+"},
    {"ng", "-"},    {"ad", "&"},      {"de", "*"},       {"co", "~"},         {"pl", "+"},
    {"mi", "-"},    {"ml", "*"},      {"dv", "/"},       {"rm", "%"},         {"an", "&"},
    {"or", "|"},    {"eo", "^"},      {"aS", "="},       {"pL", "+="},        {"mI", "-="},
    {"mL", "*="},   {"dV", "/="},     {"rM", "%="},      {"aN", "&="},        {"oR", "|="},
    {"eO", "^="},   {"ls", "<<"},     {"rs", ">>"},      {"lS", "<<="},       {"rS", ">>="},
    {"eq", "=="},   {"ne", "!="},     {"lt", "<"},       {"gt", ">"},         {"le", "<="},
    {"ge", ">="},   {"ss", "<=>"},    {"nt", "!"},       {"aa", "&&"},        {"oo", "||"},
    {"pp", "++"},   {"mm", "--"},     {"cm", ","},       {"pm", "->*"},       {"pt", "->"},
    {"cl", "()"},   {"ix", "[]"},     {"qu", "?"},       {"aw", " co_await"},
};

/* The unqualified name's base for constructors: the last source name of the prefix. */
static int base_name(dmg_node *n, const char **s, size_t *len) {
    int guard = 0;
    while (n && guard++ < 64) {
        switch (n->kind) {
        case K_NAME:
            *s = n->text;
            *len = n->len;
            return 1;
        case K_NESTED:
            n = n->b;
            break;
        case K_TEMPLATE:
        case K_ABITAG:
            n = n->a;
            break;
        case K_TPARAM:
            n = n->a;
            break;
        case K_SPECIALSUB:
            /* text2 is "std::basic_string<...>": the ctor name is its base ("basic_string") */
            *s = n->text2 + 5;
            *len = strcspn(n->text2 + 5, "<");
            return 1;
        default:
            return 0;
        }
    }
    return 0;
}

/* <unqualified-name>, with `prefix` the enclosing name (for constructor names). */
static dmg_node *parse_unqualified_name(dmg_state *st, dmg_node *prefix, int *no_ret) {
    dmg_node *r = NULL;
    char c = peek(st, 0);
    ENTER(st);
    if (is_digit(c)) {
        r = parse_source_name(st);
    } else if (c == 'L' && is_digit(peek(st, 1))) { /* internal linkage: L <source-name> */
        st->p++;
        r = parse_source_name(st);
    } else if (c == 'C' ||
               (c == 'D' && (peek(st, 1) == '0' || peek(st, 1) == '1' || peek(st, 1) == '2' ||
                             peek(st, 1) == '4' || peek(st, 1) == '5'))) {
        const char *s;
        size_t len;
        int inheriting = c == 'C' && peek(st, 1) == 'I';
        if (!base_name(prefix, &s, &len)) {
            st->failed = 1;
            LEAVE(st, NULL);
        }
        st->p += inheriting ? 2 : 1;
        if (!strchr("0123459", peek(st, 0)) || peek(st, 0) == '\0') {
            st->failed = 1;
            LEAVE(st, NULL);
        }
        st->p++;
        if (inheriting && !parse_type(st)) /* the base class; not printed */
            LEAVE(st, NULL);
        r = mk_text(st, c == 'C' ? K_CTOR : K_DTOR, s, len);
        if (no_ret)
            *no_ret = 1;
    } else if (c == 'U' && peek(st, 1) == 't') { /* Ut [<number>] _ */
        long n = 0;
        st->p += 2;
        if (is_digit(peek(st, 0)))
            n = parse_number(st) + 1;
        if (n < 0 || !eat(st, '_')) {
            st->failed = 1;
            LEAVE(st, NULL);
        }
        r = mk(st, K_UNNAMED);
        if (r)
            r->num = n + 1;
    } else if (c == 'U' && peek(st, 1) == 'l') { /* Ul <lambda-sig> E [<number>] _ */
        dmg_list *params = list_new(st);
        long n = 0;
        st->p += 2;
        st->type_depth++;
        if (peek(st, 0) == 'v' && peek(st, 1) == 'E')
            st->p++;
        while (!st->failed && peek(st, 0) != 'E') {
            if (!list_add(st, params, parse_type(st)))
                st->failed = 1;
        }
        st->type_depth--;
        if (!eat(st, 'E')) {
            st->failed = 1;
            LEAVE(st, NULL);
        }
        if (is_digit(peek(st, 0)))
            n = parse_number(st) + 1;
        if (n < 0 || !eat(st, '_')) {
            st->failed = 1;
            LEAVE(st, NULL);
        }
        r = mk(st, K_LAMBDA);
        if (r) {
            r->list = params;
            r->num = n + 1;
        }
    } else if (c == 'c' && peek(st, 1) == 'v') { /* conversion operator */
        dmg_node *t;
        st->p += 2;
        st->type_depth++;
        t = parse_type(st);
        st->type_depth--;
        r = mk2(st, K_CONVOP, t, NULL);
        if (no_ret)
            *no_ret = 1;
    } else if (c == 'l' && peek(st, 1) == 'i') { /* literal operator: operator"" _x */
        dmg_node *n;
        st->p += 2;
        n = parse_source_name(st);
        if (n) {
            size_t len = n->len + 3;
            char *t = dmg_alloc(st, len + 1);
            if (t) {
                memcpy(t, "\"\" ", 3);
                memcpy(t + 3, n->text, n->len);
                r = mk_text(st, K_OPERATOR, t, len);
            }
        }
    } else if (is_lower(c)) {
        size_t i;
        for (i = 0; i < sizeof dmg_ops / sizeof dmg_ops[0]; i++) {
            if (dmg_ops[i].code[0] == c && dmg_ops[i].code[1] == peek(st, 1)) {
                st->p += 2;
                r = mk_cstr(st, K_OPERATOR, dmg_ops[i].name);
                break;
            }
        }
        if (!r)
            st->failed = 1;
    } else {
        st->failed = 1;
    }
    /* ABI tags: B <source-name> */
    while (r && !st->failed && peek(st, 0) == 'B') {
        dmg_node *tag;
        st->p++;
        tag = parse_source_name(st);
        if (!tag)
            break;
        r = mk2(st, K_ABITAG, r, NULL);
        if (r) {
            r->text = tag->text;
            r->len = tag->len;
        }
    }
    LEAVE(st, r);
}

/* S_, S<seq>_, Sa, Sb, Ss, Si, So, Sd (not St, which the callers handle). The abbreviations
 * print in full, as c++filt does: "Ss" is std::basic_string<char, std::char_traits<char>,
 * std::allocator<char> >, which makes the contrast with std::__cxx11::basic_string visible. */
static dmg_node *parse_substitution(dmg_state *st) {
    static const struct {
        char c;
        const char *simple, *full;
    } special[] = {
        {'a', "std::allocator", "std::allocator"},
        {'b', "std::basic_string", "std::basic_string"},
        {'s', "std::string",
         "std::basic_string<char, std::char_traits<char>, std::allocator<char> >"},
        {'i', "std::istream", "std::basic_istream<char, std::char_traits<char> >"},
        {'o', "std::ostream", "std::basic_ostream<char, std::char_traits<char> >"},
        {'d', "std::iostream", "std::basic_iostream<char, std::char_traits<char> >"},
    };
    char c;
    size_t i;
    long id;
    if (!eat(st, 'S')) {
        st->failed = 1;
        return NULL;
    }
    c = peek(st, 0);
    for (i = 0; i < sizeof special / sizeof special[0]; i++) {
        if (special[i].c == c) {
            dmg_node *n = mk_cstr(st, K_SPECIALSUB, special[i].simple);
            st->p++;
            if (n) {
                n->text2 = special[i].full;
                n->len2 = strlen(special[i].full);
            }
            if (c == 's' || c == 'b')
                st->flags |= DMG_FLAG_OLD_STRING;
            return n;
        }
    }
    id = parse_seq_id(st);
    if (id < -1 || (size_t)(id + 1) >= st->nsubs) {
        st->failed = 1;
        return NULL;
    }
    return st->subs[id + 1];
}

/* T_ / T<n>_ : resolved now against the current template arguments. */
static dmg_node *parse_template_param(dmg_state *st) {
    long id;
    dmg_node *n;
    if (!eat(st, 'T')) {
        st->failed = 1;
        return NULL;
    }
    id = parse_seq_id(st);
    if (id < -1) {
        st->failed = 1;
        return NULL;
    }
    /* What T_ means is decided where it is printed (a substitution of T_ used in an outer
     * function means the outer function's parameter); `a` keeps the meaning at this point. */
    n = mk(st, K_TPARAM);
    if (n) {
        n->num = id + 1;
        if (st->tparams && (size_t)(id + 1) < st->tparams->count)
            n->a = st->tparams->items[id + 1];
    }
    return n;
}

static unsigned parse_cv(dmg_state *st) {
    unsigned cv = 0;
    if (eat(st, 'r'))
        cv |= 4;
    if (eat(st, 'V'))
        cv |= 2;
    if (eat(st, 'K'))
        cv |= 1;
    return cv;
}

/* Parameter types up to (not including) 'E', '.' or the end; a lone 'v' means none. */
static dmg_list *parse_params(dmg_state *st, int *ref) {
    dmg_list *l = list_new(st);
    char c1 = peek(st, 1);
    if (peek(st, 0) == 'v' && (c1 == 'E' || c1 == '.' || c1 == '\0' || c1 == 'R' || c1 == 'O')) {
        st->p++;
    }
    while (l && !st->failed) {
        char c = peek(st, 0);
        if (c == '\0' || c == 'E' || c == '.')
            break;
        if ((c == 'R' || c == 'O') && peek(st, 1) == 'E' && ref) {
            *ref = c == 'R' ? 1 : 2;
            st->p++;
            break;
        }
        if (!list_add(st, l, parse_type(st)))
            st->failed = 1;
    }
    return st->failed ? NULL : l;
}

static dmg_node *parse_function_type(dmg_state *st) {
    dmg_node *f, *ret;
    int ref = 0;
    ENTER(st);
    if (!eat(st, 'F')) {
        st->failed = 1;
        LEAVE(st, NULL);
    }
    eat(st, 'Y');
    ret = parse_type(st);
    f = mk2(st, K_FUNC, ret, NULL);
    if (f)
        f->list = parse_params(st, &ref);
    if (!eat(st, 'E'))
        st->failed = 1;
    if (f)
        f->ref = ref;
    LEAVE(st, f);
}

static dmg_node *parse_array_type(dmg_state *st) {
    const char *dim = st->p;
    size_t len = 0;
    dmg_node *elem, *r;
    ENTER(st);
    st->p++; /* 'A' */
    if (is_digit(peek(st, 0))) {
        dim = st->p;
        while (is_digit(peek(st, 0)))
            st->p++;
        len = (size_t)(st->p - dim);
    } else if (peek(st, 0) != '_') {
        st->failed = 1; /* an expression dimension */
        LEAVE(st, NULL);
    }
    if (!eat(st, '_')) {
        st->failed = 1;
        LEAVE(st, NULL);
    }
    elem = parse_type(st);
    r = mk2(st, K_ARRAY, elem, NULL);
    if (r) {
        r->text = dim;
        r->len = len;
    }
    LEAVE(st, r);
}

static dmg_node *builtin(dmg_state *st, const char *name, char code) {
    dmg_node *n = mk_cstr(st, K_BUILTIN, name);
    if (n)
        n->code = code;
    return n;
}

static dmg_node *parse_type(dmg_state *st) {
    static const char *const single[26] = {
        /* a */ "signed char",
        /* b */ "bool",
        /* c */ "char",
        /* d */ "double",
        /* e */ "long double",
        /* f */ "float",
        /* g */ "__float128",
        /* h */ "unsigned char",
        /* i */ "int",
        /* j */ "unsigned int",
        /* k */ NULL,
        /* l */ "long",
        /* m */ "unsigned long",
        /* n */ "__int128",
        /* o */ "unsigned __int128",
        /* p */ NULL,
        /* q */ NULL,
        /* r */ NULL,
        /* s */ "short",
        /* t */ "unsigned short",
        /* u */ NULL,
        /* v */ "void",
        /* w */ "wchar_t",
        /* x */ "long long",
        /* y */ "unsigned long long",
        /* z */ "...",
    };
    dmg_node *r = NULL, *t;
    char c = peek(st, 0);
    ENTER(st);
    st->type_depth++;
    if (is_lower(c) && single[c - 'a']) {
        st->p++;
        r = builtin(st, single[c - 'a'], c);
    } else {
        switch (c) {
        case 'u': /* vendor extended type */
            st->p++;
            r = parse_source_name(st);
            add_sub(st, r);
            break;
        case 'r':
        case 'V':
        case 'K': {
            unsigned cv = parse_cv(st);
            /* cv before a function type qualify `this`; the bare function type is not a
             * substitution candidate then (as in c++filt) */
            t = peek(st, 0) == 'F' ? parse_function_type(st) : parse_type(st);
            r = mk2(st, K_QUAL, t, NULL);
            if (r)
                r->cv = cv;
            add_sub(st, r);
            break;
        }
        case 'P':
        case 'R':
        case 'O':
            st->p++;
            t = parse_type(st);
            r = mk2(st, c == 'P' ? K_PTR : c == 'R' ? K_LREF : K_RREF, t, NULL);
            add_sub(st, r);
            break;
        case 'F':
            r = parse_function_type(st);
            add_sub(st, r);
            break;
        case 'A':
            r = parse_array_type(st);
            add_sub(st, r);
            break;
        case 'M': {
            dmg_node *cls;
            st->p++;
            cls = parse_type(st);
            t = cls ? parse_type(st) : NULL;
            r = t ? mk2(st, K_PTRMEM, cls, t) : NULL;
            add_sub(st, r);
            break;
        }
        case 'T':
            r = parse_template_param(st);
            add_sub(st, r);
            if (r && peek(st, 0) == 'I') {
                dmg_list *args = parse_template_args(st);
                r = args ? mk2(st, K_TEMPLATE, r, NULL) : NULL;
                if (r)
                    r->list = args;
                add_sub(st, r);
            }
            break;
        case 'S':
            if (peek(st, 1) == 't') {
                r = parse_name(st, NULL, NULL, NULL, NULL);
                add_sub(st, r);
            } else {
                r = parse_substitution(st);
                if (r && peek(st, 0) == 'I') {
                    dmg_list *args = parse_template_args(st);
                    r = args ? mk2(st, K_TEMPLATE, r, NULL) : NULL;
                    if (r)
                        r->list = args;
                    add_sub(st, r);
                }
            }
            break;
        case 'D': {
            char d = peek(st, 1);
            st->p += 2;
            switch (d) {
            case 'p':
                t = parse_type(st);
                r = mk2(st, K_EXPANSION, t, NULL);
                add_sub(st, r);
                break;
            case 'a':
                r = builtin(st, "auto", 0);
                break;
            case 'c':
                r = builtin(st, "decltype(auto)", 0);
                break;
            case 'n':
                r = builtin(st, "decltype(nullptr)", 0);
                break;
            case 'd':
                r = builtin(st, "decimal64", 0);
                break;
            case 'e':
                r = builtin(st, "decimal128", 0);
                break;
            case 'f':
                r = builtin(st, "decimal32", 0);
                break;
            case 'h':
                r = builtin(st, "half", 0);
                break;
            case 'i':
                r = builtin(st, "char32_t", 0);
                break;
            case 's':
                r = builtin(st, "char16_t", 0);
                break;
            case 'u':
                r = builtin(st, "char8_t", 0);
                break;
            case 'F': { /* DF <number> _ : _FloatN */
                long bits = parse_number(st);
                char *txt;
                if (bits <= 0 || !eat(st, '_')) {
                    st->failed = 1;
                    break;
                }
                txt = dmg_alloc(st, 32);
                if (txt) {
                    snprintf(txt, 32, "_Float%ld", bits);
                    r = builtin(st, txt, 0);
                }
                break;
            }
            case 'v': { /* Dv <number> _ <type> */
                const char *num = st->p;
                long count = parse_number(st);
                size_t nlen = (size_t)(st->p - num);
                if (count < 0 || !eat(st, '_')) {
                    st->failed = 1;
                    break;
                }
                t = parse_type(st);
                r = mk2(st, K_VECTOR, t, NULL);
                if (r) {
                    r->text = num;
                    r->len = nlen;
                }
                add_sub(st, r);
                break;
            }
            default:
                st->failed = 1; /* decltype, exception specs, ... */
                break;
            }
            break;
        }
        case 'N':
        case 'Z':
        case '0':
        case '1':
        case '2':
        case '3':
        case '4':
        case '5':
        case '6':
        case '7':
        case '8':
        case '9':
            r = parse_name(st, NULL, NULL, NULL, NULL);
            add_sub(st, r);
            break;
        default:
            st->failed = 1;
            break;
        }
    }
    st->type_depth--;
    LEAVE(st, r);
}

/* L <type> <value> E | L _Z <encoding> E */
static dmg_node *parse_expr_primary(dmg_state *st) {
    dmg_node *r = NULL, *t;
    ENTER(st);
    st->p++; /* 'L' */
    if (peek(st, 0) == '_' && peek(st, 1) == 'Z') {
        st->p += 2;
        r = parse_encoding(st);
    } else if (peek(st, 0) == 'Z') {
        st->p++;
        r = parse_encoding(st);
    } else {
        const char *v;
        int neg = 0;
        t = parse_type(st);
        if (!t)
            LEAVE(st, NULL);
        if (eat(st, 'n'))
            neg = 1;
        v = st->p;
        while (is_digit(peek(st, 0)))
            st->p++;
        if (st->p == v || peek(st, 0) != 'E') {
            st->failed = 1; /* floats, strings, nullptr literals: not supported */
            LEAVE(st, NULL);
        }
        r = mk2(st, K_LITERAL, t, NULL);
        if (r) {
            r->text = v;
            r->len = (size_t)(st->p - v);
            r->neg = neg;
        }
    }
    if (!eat(st, 'E'))
        st->failed = 1;
    LEAVE(st, r);
}

static dmg_node *parse_template_arg(dmg_state *st) {
    char c = peek(st, 0);
    if (c == 'L')
        return parse_expr_primary(st);
    if (c == 'J') {
        dmg_node *pack = mk(st, K_PACK);
        st->p++;
        if (pack)
            pack->list = list_new(st);
        while (pack && !st->failed && peek(st, 0) != 'E') {
            if (peek(st, 0) == '\0' || !list_add(st, pack->list, parse_template_arg(st)))
                st->failed = 1;
        }
        if (!eat(st, 'E'))
            st->failed = 1;
        return st->failed ? NULL : pack;
    }
    if (c == 'X') {
        st->failed = 1; /* expressions */
        return NULL;
    }
    return parse_type(st);
}

/* I <template-arg>+ E. At name level (not inside a type) the arguments become what T_ means. */
static dmg_list *parse_template_args(dmg_state *st) {
    dmg_list *l;
    int name_level = st->type_depth == 0;
    if (st->failed || ++st->depth > DMG_MAX_DEPTH) {
        st->failed = 1;
        st->depth--;
        return NULL;
    }
    st->p++; /* 'I' */
    l = list_new(st);
    st->type_depth++;
    while (l && !st->failed && peek(st, 0) != 'E') {
        if (peek(st, 0) == '\0' || !list_add(st, l, parse_template_arg(st)))
            st->failed = 1;
    }
    st->type_depth--;
    if (!eat(st, 'E'))
        st->failed = 1;
    st->depth--;
    if (st->failed)
        return NULL;
    if (name_level)
        st->tparams = l;
    return l;
}

static dmg_node *parse_nested_name(dmg_state *st, unsigned *cv, int *ref, int *is_template,
                                   int *no_ret) {
    dmg_node *sofar = NULL;
    int last_template = 0, pushed = 0;
    ENTER(st);
    st->p++; /* 'N' */
    {
        unsigned q = parse_cv(st);
        int rq = 0;
        if (eat(st, 'R'))
            rq = 1;
        else if (eat(st, 'O'))
            rq = 2;
        if (cv)
            *cv = q;
        if (ref)
            *ref = rq;
    }
    while (!st->failed && !eat(st, 'E')) {
        char c = peek(st, 0);
        int nr = 0;
        last_template = 0;
        if (c == '\0') {
            st->failed = 1;
            break;
        }
        if (c == 'S' && peek(st, 1) == 't') {
            dmg_node *n;
            if (sofar) {
                st->failed = 1;
                break;
            }
            st->p += 2;
            n = parse_unqualified_name(st, NULL, &nr);
            sofar = mk2(st, K_NESTED, mk_cstr(st, K_NAME, "std"), n);
        } else if (c == 'S') {
            if (sofar) {
                st->failed = 1;
                break;
            }
            sofar = parse_substitution(st);
            continue; /* a substitution is not a new candidate */
        } else if (c == 'T') {
            if (sofar) {
                st->failed = 1;
                break;
            }
            sofar = parse_template_param(st);
        } else if (c == 'I') {
            dmg_list *args;
            if (!sofar) {
                st->failed = 1;
                break;
            }
            args = parse_template_args(st);
            sofar = args ? mk2(st, K_TEMPLATE, sofar, NULL) : NULL;
            if (sofar)
                sofar->list = args;
            last_template = 1;
        } else if (c == 'D' && (peek(st, 1) == 't' || peek(st, 1) == 'T')) {
            st->failed = 1;
            break;
        } else {
            dmg_node *n = parse_unqualified_name(st, sofar, &nr);
            sofar = sofar ? mk2(st, K_NESTED, sofar, n) : n;
        }
        if (no_ret && c != 'I')
            *no_ret = nr;
        if (!sofar) {
            st->failed = 1;
            break;
        }
        add_sub(st, sofar);
        pushed++;
    }
    if (!st->failed && (!sofar || !pushed))
        st->failed = 1;
    if (!st->failed)
        st->nsubs--; /* the complete name is not a candidate of its own */
    if (is_template)
        *is_template = last_template;
    LEAVE(st, sofar);
}

/* Z <encoding> E <entity> [<discriminator>] | Z <encoding> E s [<discriminator>] */
static dmg_node *parse_local_name(dmg_state *st, int *is_template, int *no_ret) {
    dmg_node *enc, *ent = NULL, *r;
    dmg_list *saved = st->tparams;
    int saved_type_depth = st->type_depth;
    ENTER(st);
    st->p++; /* 'Z' */
    st->type_depth = 0;
    enc = parse_encoding(st);
    st->type_depth = saved_type_depth;
    if (!eat(st, 'E'))
        st->failed = 1;
    if (!st->failed) {
        if (eat(st, 's')) {
            ent = mk_cstr(st, K_NAME, "string literal");
        } else if (peek(st, 0) == 'd') {
            st->failed = 1; /* default argument scope */
        } else {
            st->tparams = saved;
            ent = parse_name(st, NULL, NULL, is_template, no_ret);
        }
    }
    /* discriminator: _ <digit> or __ <number> _ */
    if (!st->failed && peek(st, 0) == '_') {
        if (is_digit(peek(st, 1))) {
            st->p += 2;
        } else if (peek(st, 1) == '_' && is_digit(peek(st, 2))) {
            st->p += 2;
            parse_number(st);
            if (!eat(st, '_'))
                st->failed = 1;
        }
    }
    r = mk2(st, K_LOCAL, enc, ent);
    LEAVE(st, r);
}

static dmg_node *parse_name(dmg_state *st, unsigned *cv, int *ref, int *is_template, int *no_ret) {
    dmg_node *r = NULL;
    char c = peek(st, 0);
    ENTER(st);
    if (is_template)
        *is_template = 0;
    if (c == 'N') {
        r = parse_nested_name(st, cv, ref, is_template, no_ret);
    } else if (c == 'Z') {
        r = parse_local_name(st, is_template, no_ret);
    } else {
        int from_sub = 0;
        if (c == 'S' && peek(st, 1) == 't') {
            st->p += 2;
            r = mk2(st, K_NESTED, mk_cstr(st, K_NAME, "std"),
                    parse_unqualified_name(st, NULL, no_ret));
        } else if (c == 'S') {
            r = parse_substitution(st);
            from_sub = 1;
            if (peek(st, 0) != 'I')
                st->failed = 1; /* only a template name may be a bare substitution here */
        } else {
            r = parse_unqualified_name(st, NULL, no_ret);
        }
        if (r && peek(st, 0) == 'I') {
            dmg_list *args;
            if (!from_sub)
                add_sub(st, r); /* <unscoped-template-name> */
            args = parse_template_args(st);
            r = args ? mk2(st, K_TEMPLATE, r, NULL) : NULL;
            if (r)
                r->list = args;
            if (is_template)
                *is_template = 1;
        }
    }
    LEAVE(st, r);
}

/* h <number> _ | v <number> _ <number> _ */
static int parse_call_offset(dmg_state *st) {
    char c = peek(st, 0);
    int parts = c == 'h' ? 1 : c == 'v' ? 2 : 0, i;
    if (!parts)
        return 0;
    st->p++;
    for (i = 0; i < parts; i++) {
        eat(st, 'n');
        if (parse_number(st) < 0 || !eat(st, '_'))
            return 0;
    }
    return 1;
}

static dmg_node *special(dmg_state *st, const char *text, dmg_node *a) {
    dmg_node *n = mk2(st, K_SPECIAL, a, NULL);
    if (n) {
        n->text = text;
        n->len = strlen(text);
    }
    return n;
}

static dmg_node *parse_special_name(dmg_state *st) {
    char c0 = peek(st, 0), c1 = peek(st, 1);
    dmg_node *r = NULL;
    if (c1 == '\0') { /* "_ZT", "_ZZT": found by fuzzing */
        st->failed = 1;
        return NULL;
    }
    st->p += 2;
    if (c0 == 'T') {
        switch (c1) {
        case 'V':
            r = special(st, "vtable for ", parse_type(st));
            break;
        case 'T':
            r = special(st, "VTT for ", parse_type(st));
            break;
        case 'I':
            r = special(st, "typeinfo for ", parse_type(st));
            break;
        case 'S':
            r = special(st, "typeinfo name for ", parse_type(st));
            break;
        case 'H':
            r = special(st, "TLS init function for ", parse_name(st, 0, 0, 0, 0));
            break;
        case 'W':
            r = special(st, "TLS wrapper function for ", parse_name(st, 0, 0, 0, 0));
            break;
        case 'h':
        case 'v':
            st->p--;
            if (!parse_call_offset(st)) {
                st->failed = 1;
                break;
            }
            r = special(st, c1 == 'h' ? "non-virtual thunk to " : "virtual thunk to ",
                        parse_encoding(st));
            break;
        case 'c':
            if (!parse_call_offset(st) || !parse_call_offset(st)) {
                st->failed = 1;
                break;
            }
            r = special(st, "covariant return thunk to ", parse_encoding(st));
            break;
        default:
            st->failed = 1;
            break;
        }
    } else if (c0 == 'G' && c1 == 'V') {
        r = special(st, "guard variable for ", parse_name(st, 0, 0, 0, 0));
    } else if (c0 == 'G' && c1 == 'T' && (peek(st, 0) == 't' || peek(st, 0) == 'n')) {
        int tx = peek(st, 0) == 't';
        st->p++;
        r = special(st, tx ? "transaction clone for " : "non-transaction clone for ",
                    parse_encoding(st));
    } else if (c0 == 'G' && c1 == 'R') {
        dmg_node *n = parse_name(st, 0, 0, 0, 0);
        if (peek(st, 0) != '\0' && parse_seq_id(st) < -1)
            st->failed = 1;
        r = special(st, "reference temporary #0 for ", n);
    } else {
        st->failed = 1;
    }
    return st->failed ? NULL : r;
}

static dmg_node *parse_encoding(dmg_state *st) {
    dmg_node *name, *ret = NULL, *enc;
    dmg_list *outer = st->tparams, *tlist;
    unsigned cv = 0;
    int ref = 0, is_template = 0, no_ret = 0;
    char c = peek(st, 0);
    ENTER(st);
    if (c == 'T' || (c == 'G' && (peek(st, 1) == 'V' || peek(st, 1) == 'R' || peek(st, 1) == 'T')))
        LEAVE(st, parse_special_name(st));
    st->tparams = NULL;
    name = parse_name(st, &cv, &ref, &is_template, &no_ret);
    tlist = st->tparams;
    if (!tlist)
        st->tparams = outer;
    c = peek(st, 0);
    if (!name || c == '\0' || c == 'E' || c == '.') {
        st->tparams = outer;
        LEAVE(st, name);
    }
    if (is_template && !no_ret) {
        st->type_depth++;
        ret = parse_type(st);
        st->type_depth--;
    }
    enc = mk2(st, K_ENCODING, name, ret);
    if (enc) {
        st->type_depth++;
        enc->list = parse_params(st, NULL);
        st->type_depth--;
        enc->cv = cv;
        enc->ref = ref;
        enc->tlist = tlist;
    }
    st->tparams = outer;
    LEAVE(st, enc);
}

/* ---- the printer ----------------------------------------------------------------------------- */

typedef struct dmg_out {
    char *buf;
    size_t len, cap;
    int failed;
    int depth;
    long pack_index;         /* element of the pack being expanded, or -1 */
    const dmg_list *tparams; /* what T_ means here: the innermost template being printed */
    int skip_ret;            /* the next encoding prints without its return type (local names) */
    char last;               /* what c++filt thinks the last character is (see pr_list) */
} dmg_out;

static void put(dmg_out *o, const char *s, size_t n) {
    if (o->failed)
        return;
    if (o->len + n + 1 > DMG_MAX_OUT) {
        o->failed = 1;
        return;
    }
    if (o->len + n + 1 > o->cap) {
        size_t cap = o->cap ? o->cap : 256;
        char *b;
        while (cap < o->len + n + 1)
            cap *= 2;
        b = realloc(o->buf, cap);
        if (!b) {
            o->failed = 1;
            return;
        }
        o->buf = b;
        o->cap = cap;
    }
    memcpy(o->buf + o->len, s, n);
    o->len += n;
    o->buf[o->len] = '\0';
    if (n)
        o->last = s[n - 1];
}

static void puts_(dmg_out *o, const char *s) { put(o, s, strlen(s)); }

static char last_char(const dmg_out *o) { return o->last; }

/* Drops what was printed after `mark` (an empty pack's separator). Like c++filt, the "last
 * character" stays the separator's space, so "A<B<C>, (empty pack)>" prints "A<B<C>>". */
static void rollback(dmg_out *o, size_t mark) {
    o->len = mark;
    if (o->buf)
        o->buf[o->len] = '\0';
    o->last = ' ';
}

static void pr(dmg_out *o, const dmg_node *n);
static void pr_left(dmg_out *o, const dmg_node *n);
static void pr_right(dmg_out *o, const dmg_node *n);

/* A template parameter stands for its argument (one element of it inside a pack expansion). */
static const dmg_node *resolve(const dmg_out *o, const dmg_node *n) {
    int guard = 0;
    while (n && n->kind == K_TPARAM && guard++ < 64) {
        if (o->tparams && n->num >= 0 && (size_t)n->num < o->tparams->count)
            n = o->tparams->items[n->num];
        else
            n = n->a;
        if (n && n->kind == K_PACK && o->pack_index >= 0 && n->list &&
            (size_t)o->pack_index < n->list->count)
            n = n->list->items[o->pack_index];
    }
    return n;
}

static void pr_list(dmg_out *o, const dmg_list *l) {
    size_t i;
    int first = 1;
    if (!l)
        return;
    for (i = 0; i < l->count && !o->failed; i++) {
        size_t mark = o->len;
        if (!first)
            puts_(o, ", ");
        {
            size_t before = o->len;
            pr(o, l->items[i]);
            if (o->len == before) { /* an empty pack: drop its separator */
                if (mark != before)
                    rollback(o, mark);
                continue;
            }
        }
        first = 0;
    }
}

static void pr_cv(dmg_out *o, unsigned cv) {
    if (cv & 1)
        puts_(o, " const");
    if (cv & 2)
        puts_(o, " volatile");
    if (cv & 4)
        puts_(o, " restrict");
}

/* The pack a pattern expands over: the first template parameter bound to a pack. */
static const dmg_node *find_pack(const dmg_out *o, const dmg_node *n, int depth) {
    const dmg_node *r;
    size_t i;
    if (!n || depth > 64)
        return NULL;
    if (n->kind == K_TPARAM) {
        dmg_out plain = *o;
        plain.pack_index = -1;
        r = resolve(&plain, n);
        return r && r->kind == K_PACK ? r : NULL;
    }
    if ((r = find_pack(o, n->a, depth + 1)) != NULL)
        return r;
    if ((r = find_pack(o, n->b, depth + 1)) != NULL)
        return r;
    if (n->list)
        for (i = 0; i < n->list->count; i++)
            if ((r = find_pack(o, n->list->items[i], depth + 1)) != NULL)
                return r;
    return NULL;
}

static void pr_literal(dmg_out *o, const dmg_node *n) {
    const dmg_node *t = n->a;
    const char *suffix = NULL;
    char code = t && t->kind == K_BUILTIN ? t->code : 0;
    if (code == 'b' && n->len == 1 && !n->neg && (n->text[0] == '0' || n->text[0] == '1')) {
        puts_(o, n->text[0] == '1' ? "true" : "false");
        return;
    }
    switch (code) {
    case 'i':
        suffix = "";
        break;
    case 'j':
        suffix = "u";
        break;
    case 'l':
        suffix = "l";
        break;
    case 'm':
        suffix = "ul";
        break;
    case 'x':
        suffix = "ll";
        break;
    case 'y':
        suffix = "ull";
        break;
    default:
        break;
    }
    if (!suffix) {
        puts_(o, "(");
        pr(o, t);
        puts_(o, ")");
    }
    if (n->neg)
        puts_(o, "-");
    put(o, n->text, n->len);
    if (suffix)
        puts_(o, suffix);
}

static int is_func(const dmg_out *o, const dmg_node *n) {
    n = resolve(o, n);
    return n && n->kind == K_FUNC;
}

/* An array, seen through cv-qualifiers and template parameters ("char const (&) [14]"). */
static int is_array(const dmg_out *o, const dmg_node *n) {
    int guard = 0;
    n = resolve(o, n);
    while (n && n->kind == K_QUAL && guard++ < 64)
        n = resolve(o, n->a);
    return n && n->kind == K_ARRAY;
}

static void pr_left(dmg_out *o, const dmg_node *n) {
    if (!n) {
        o->failed = 1;
        return;
    }
    if (o->failed)
        return;
    if (++o->depth > DMG_MAX_PRINT_DEPTH) {
        o->failed = 1;
        o->depth--;
        return;
    }
    switch (n->kind) {
    case K_NAME:
    case K_BUILTIN:
        put(o, n->text, n->len);
        break;
    case K_NESTED:
        pr(o, n->a);
        puts_(o, "::");
        pr(o, n->b);
        break;
    case K_TEMPLATE:
        pr(o, n->a);
        if (last_char(o) == '<')
            puts_(o, " ");
        puts_(o, "<");
        pr_list(o, n->list);
        if (last_char(o) == '>')
            puts_(o, " ");
        puts_(o, ">");
        break;
    case K_ABITAG:
        pr(o, n->a);
        puts_(o, "[abi:");
        put(o, n->text, n->len);
        puts_(o, "]");
        break;
    case K_SPECIALSUB: /* c++filt's (verbose) form: std::basic_string<char, ...> */
        put(o, n->text2, n->len2);
        break;
    case K_CTOR:
        put(o, n->text, n->len);
        break;
    case K_DTOR:
        puts_(o, "~");
        put(o, n->text, n->len);
        break;
    case K_OPERATOR:
        puts_(o, "operator");
        put(o, n->text, n->len);
        break;
    case K_CONVOP:
        puts_(o, "operator ");
        pr(o, n->a);
        break;
    case K_QUAL: {
        const dmg_node *in = resolve(o, n->a);
        pr_left(o, n->a);
        if (!is_func(o, n->a)) /* "T const" with T = "X const" prints once */
            pr_cv(o, n->cv & ~(in && in->kind == K_QUAL ? in->cv : 0u));
        break;
    }
    case K_PTR:
    case K_LREF:
    case K_RREF: {
        const char *sym = n->kind == K_PTR ? "*" : n->kind == K_LREF ? "&" : "&&";
        const dmg_node *in = resolve(o, n->a);
        if (n->kind != K_PTR && in && (in->kind == K_LREF || in->kind == K_RREF)) {
            /* reference collapsing: T& && -> T&, T&& & -> T& */
            dmg_node tmp = *in;
            if (n->kind == K_LREF)
                tmp.kind = K_LREF;
            pr_left(o, &tmp);
            break;
        }
        if (in && in->kind == K_FUNC) {
            if (in->a)
                pr(o, in->a);
            puts_(o, " (");
        } else if (is_array(o, n->a)) {
            pr_left(o, n->a);
            puts_(o, " (");
        } else if (in && in->kind == K_PTRMEM && is_func(o, in->b)) {
            pr_left(o, in);
        } else {
            pr_left(o, n->a);
        }
        puts_(o, sym);
        break;
    }
    case K_FUNC:
        if (n->a)
            pr(o, n->a);
        puts_(o, " ");
        break;
    case K_ARRAY:
        pr_left(o, n->a);
        break;
    case K_VECTOR:
        pr(o, n->a);
        puts_(o, " __vector(");
        put(o, n->text, n->len);
        puts_(o, ")");
        break;
    case K_PTRMEM: {
        const dmg_node *m = resolve(o, n->b);
        if (m && m->kind == K_QUAL && is_func(o, m->a))
            m = resolve(o, m->a);
        if (m && m->kind == K_FUNC) {
            if (m->a)
                pr(o, m->a);
            puts_(o, " (");
            pr(o, n->a);
            puts_(o, "::*");
        } else {
            pr_left(o, n->b);
            puts_(o, " ");
            pr(o, n->a);
            puts_(o, "::*");
        }
        break;
    }
    case K_ENCODING: {
        const dmg_list *saved = o->tparams;
        int skip_ret = o->skip_ret;
        o->skip_ret = 0;
        if (n->tlist)
            o->tparams = n->tlist;
        if (n->b && !skip_ret) {
            pr(o, n->b);
            puts_(o, " ");
        }
        pr(o, n->a);
        puts_(o, "(");
        pr_list(o, n->list);
        puts_(o, ")");
        pr_cv(o, n->cv);
        if (n->ref)
            puts_(o, n->ref == 1 ? " &" : " &&");
        o->tparams = saved;
        break;
    }
    case K_SPECIAL:
        put(o, n->text, n->len);
        pr(o, n->a);
        break;
    case K_LITERAL:
        pr_literal(o, n);
        break;
    case K_LOCAL: /* the function prints without its return type, as c++filt does */
        o->skip_ret = 1;
        pr(o, n->a);
        o->skip_ret = 0;
        puts_(o, "::");
        pr(o, n->b);
        break;
    case K_PACK:
        pr_list(o, n->list);
        break;
    case K_EXPANSION: {
        const dmg_node *pack = find_pack(o, n->a, 0);
        if (!pack || !pack->list) {
            pr(o, n->a);
        } else {
            long saved = o->pack_index;
            size_t i;
            int first = 1;
            for (i = 0; i < pack->list->count && !o->failed; i++) {
                size_t mark = o->len, before;
                if (!first)
                    puts_(o, ", ");
                before = o->len;
                o->pack_index = (long)i;
                pr(o, n->a);
                if (o->len == before) {
                    if (mark != before)
                        rollback(o, mark);
                    continue;
                }
                first = 0;
            }
            o->pack_index = saved;
        }
        break;
    }
    case K_TPARAM: {
        const dmg_node *r = resolve(o, n);
        long saved = o->pack_index;
        o->pack_index = -1; /* the argument's own packs print whole */
        if (r && r->kind == K_TPARAM)
            o->failed = 1;
        else
            pr_left(o, r);
        o->pack_index = saved;
        break;
    }
    case K_LAMBDA: {
        char num[32];
        puts_(o, "{lambda(");
        pr_list(o, n->list);
        snprintf(num, sizeof num, ")#%ld}", n->num);
        puts_(o, num);
        break;
    }
    case K_UNNAMED: {
        char num[40];
        snprintf(num, sizeof num, "{unnamed type#%ld}", n->num);
        puts_(o, num);
        break;
    }
    case K_CLONE:
        pr(o, n->a);
        puts_(o, " [clone ");
        put(o, n->text, n->len);
        puts_(o, "]");
        break;
    default:
        o->failed = 1;
        break;
    }
    o->depth--;
}

static void pr_right(dmg_out *o, const dmg_node *n) {
    if (!n || o->failed)
        return;
    if (++o->depth > DMG_MAX_PRINT_DEPTH) {
        o->failed = 1;
        o->depth--;
        return;
    }
    switch (n->kind) {
    case K_QUAL:
        pr_right(o, n->a);
        if (is_func(o, n->a))
            pr_cv(o, n->cv);
        break;
    case K_PTR:
    case K_LREF:
    case K_RREF: {
        const dmg_node *in = resolve(o, n->a);
        if (n->kind != K_PTR && in && (in->kind == K_LREF || in->kind == K_RREF)) {
            pr_right(o, in);
        } else if (in && in->kind == K_FUNC) {
            puts_(o, ")");
            pr_right(o, in);
        } else {
            if (is_array(o, n->a))
                puts_(o, ")");
            pr_right(o, n->a);
        }
        break;
    }
    case K_FUNC: {
        puts_(o, "(");
        pr_list(o, n->list);
        puts_(o, ")");
        if (n->ref)
            puts_(o, n->ref == 1 ? " &" : " &&");
        break;
    }
    case K_ARRAY:
        puts_(o, " [");
        put(o, n->text, n->len);
        puts_(o, "]");
        pr_right(o, n->a);
        break;
    case K_PTRMEM: {
        const dmg_node *m = resolve(o, n->b);
        if (m && (m->kind == K_FUNC || (m->kind == K_QUAL && is_func(o, m->a)))) {
            puts_(o, ")");
            pr_right(o, m);
        } else {
            pr_right(o, n->b);
        }
        break;
    }
    case K_TPARAM: {
        const dmg_node *r = resolve(o, n);
        long saved = o->pack_index;
        o->pack_index = -1;
        if (r && r->kind != K_TPARAM)
            pr_right(o, r);
        o->pack_index = saved;
        break;
    }
    default:
        break;
    }
    o->depth--;
}

static void pr(dmg_out *o, const dmg_node *n) {
    pr_left(o, n);
    pr_right(o, n);
}

/* ---- entry points ---------------------------------------------------------------------------- */

static void state_free(dmg_state *st) {
    while (st->blocks) {
        dmg_block *b = st->blocks;
        st->blocks = b->next;
        free(b);
    }
    free(st->subs);
}

char *dmg_demangle_n(const char *mangled, size_t len, unsigned *flags) {
    dmg_state st;
    dmg_out o;
    dmg_node *root;
    const char *at;
    if (flags)
        *flags = 0;
    if (!mangled)
        return NULL;
    at = memchr(mangled, '@', len);
    if (at)
        len = (size_t)(at - mangled);
    if (len < 3 || len > DMG_MAX_INPUT || mangled[0] != '_' || mangled[1] != 'Z')
        return NULL;
    if (memchr(mangled, '\0', len))
        return NULL;
    memset(&st, 0, sizeof st);
    st.p = mangled + 2;
    st.end = mangled + len;
    root = parse_encoding(&st);
    /* clone suffixes: .cold, .isra.0, .constprop.1, .123 */
    while (root && !st.failed && peek(&st, 0) == '.') {
        const char *s = st.p;
        const char *q = st.p;
        char c1 = peek(&st, 1);
        dmg_node *cl;
        if (is_lower(c1) || is_digit(c1) || c1 == '_') {
            q += 2;
            while (q < st.end && (is_lower(*q) || is_digit(*q) || *q == '_'))
                q++;
        }
        while (q + 1 < st.end && q[0] == '.' && is_digit(q[1])) {
            q += 2;
            while (q < st.end && is_digit(*q))
                q++;
        }
        if (q == s) {
            st.failed = 1;
            break;
        }
        st.p = q;
        cl = mk2(&st, K_CLONE, root, NULL);
        if (cl) {
            cl->text = s;
            cl->len = (size_t)(q - s);
        }
        root = cl;
    }
    if (flags)
        *flags = st.flags;
    if (!root || st.failed || st.p != st.end) {
        state_free(&st);
        return NULL;
    }
    memset(&o, 0, sizeof o);
    o.pack_index = -1;
    pr(&o, root);
    state_free(&st);
    if (o.failed || !o.buf) {
        free(o.buf);
        return NULL;
    }
    return o.buf;
}

char *dmg_demangle(const char *mangled, unsigned *flags) {
    if (!mangled) {
        if (flags)
            *flags = 0;
        return NULL;
    }
    return dmg_demangle_n(mangled, strnlen(mangled, DMG_MAX_INPUT + 1), flags);
}
