/* Kineto JSON → Arrow columns, in one pass over the file's bytes.
 *
 * The pure-Python reader (kineto_columns.py) spends ~1.5 µs per event building Python objects and
 * lists; this scanner reads the same fields straight into column buffers that polars imports
 * without a copy (Arrow C data interface, PyCapsules: no pyarrow, no numpy).
 *
 * It is a *fast path*, not a second reader: it accepts only the files the Python reader would
 * read on its own fast path with no warning (well-formed JSON, each field we use of the type
 * Kineto writes). Anything else — a string where a number belongs, a bool, a list split size,
 * invalid UTF-8 in a field we keep, a number beyond int64, malformed JSON — makes `scan` return a
 * short reason string instead of columns, and the caller reads the file with the Python reader,
 * which owns every warning and error message. The two paths are checked to give equal frames.
 *
 * What is read, and the JSON keys, come from the caller (kineto_scan.py), in the slot order below.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <pthread.h>
#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* ------------------------------------------------------------------ growable buffers, columns */

typedef struct {
    char *p;
    size_t len, cap;
} Buf;

static int buf_grow_slow(Buf *b, size_t need);

static inline int buf_grow(Buf *b, size_t need) {
    return b->len + need <= b->cap ? 0 : buf_grow_slow(b, need);
}

static int buf_grow_slow(Buf *b, size_t need) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + need) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

static int buf_put(Buf *b, const void *src, size_t n) {
    if (buf_grow(b, n)) return -1;
    memcpy(b->p + b->len, src, n);
    b->len += n;
    return 0;
}

enum { T_I64 = 'l', T_F64 = 'g', T_U32 = 'I', T_U8 = 'C', T_STR = 'U' };

typedef struct {
    char type;
    Buf data;  /* values, or string bytes */
    Buf offs;  /* strings: int64 offsets, length + 1 */
    Buf valid; /* validity bitmap, one bit per row */
    int64_t len, nulls;
} Col;

static inline int col_valid_bit(Col *c, int ok) {
    if ((c->len & 7) == 0) {
        if (buf_grow(&c->valid, 1)) return -1;
        c->valid.p[c->valid.len++] = 0;
    }
    if (ok)
        c->valid.p[c->len >> 3] |= (char)(1u << (c->len & 7));
    else
        c->nulls++;
    return 0;
}

static inline int col_put8(Col *c, int ok, const void *v) {
    if (col_valid_bit(c, ok) || buf_grow(&c->data, 8)) return -1;
    if (ok) memcpy(c->data.p + c->data.len, v, 8);
    else memset(c->data.p + c->data.len, 0, 8);
    c->data.len += 8;
    c->len++;
    return 0;
}

static inline int col_i64(Col *c, int ok, int64_t v) { return col_put8(c, ok, &v); }
static inline int col_f64(Col *c, int ok, double v) { return col_put8(c, ok, &v); }

static inline int col_u8(Col *c, uint8_t v) {
    if (col_valid_bit(c, 1) || buf_grow(&c->data, 1)) return -1;
    c->data.p[c->data.len++] = (char)v;
    c->len++;
    return 0;
}

static inline int col_u32(Col *c, uint32_t v) {
    if (col_valid_bit(c, 1) || buf_grow(&c->data, 4)) return -1;
    memcpy(c->data.p + c->data.len, &v, 4);
    c->data.len += 4;
    c->len++;
    return 0;
}

static int col_str(Col *c, int ok, const char *s, size_t n) {
    if (c->offs.len == 0) {
        int64_t zero = 0;
        if (buf_put(&c->offs, &zero, 8)) return -1;
    }
    if (!ok) n = 0;
    if (col_valid_bit(c, ok) || (n && buf_put(&c->data, s, n))) return -1;
    int64_t end = (int64_t)c->data.len;
    if (buf_put(&c->offs, &end, 8)) return -1;
    c->len++;
    return 0;
}

static void col_free(Col *c) {
    free(c->data.p);
    free(c->offs.p);
    free(c->valid.p);
    memset(c, 0, sizeof *c);
}

/* ------------------------------------------------------------------ Arrow C data interface */

#define ARROW_FLAG_NULLABLE 2

struct ArrowSchema {
    const char *format;
    const char *name;
    const char *metadata;
    int64_t flags;
    int64_t n_children;
    struct ArrowSchema **children;
    struct ArrowSchema *dictionary;
    void (*release)(struct ArrowSchema *);
    void *private_data;
};

struct ArrowArray {
    int64_t length;
    int64_t null_count;
    int64_t offset;
    int64_t n_buffers;
    int64_t n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

static const char *FORMAT_L = "l", *FORMAT_G = "g", *FORMAT_I = "I", *FORMAT_C = "C",
                  *FORMAT_U = "U";

static void schema_release(struct ArrowSchema *s) { s->release = NULL; }

typedef struct {
    const void *buffers[3];
    void *owned[3];
} ArrayPrivate;

static void array_release(struct ArrowArray *a) {
    ArrayPrivate *pd = a->private_data;
    if (pd) {
        for (int i = 0; i < 3; i++) free(pd->owned[i]);
        free(pd);
    }
    a->private_data = NULL;
    a->release = NULL;
}

static void schema_capsule_free(PyObject *cap) {
    struct ArrowSchema *s = PyCapsule_GetPointer(cap, "arrow_schema");
    if (!s) return;
    if (s->release) s->release(s);
    free(s);
}

static void array_capsule_free(PyObject *cap) {
    struct ArrowArray *a = PyCapsule_GetPointer(cap, "arrow_array");
    if (!a) return;
    if (a->release) a->release(a);
    free(a);
}

/* (schema capsule, array capsule) for one column; the buffers move into the array. */
static PyObject *col_export(Col *c) {
    struct ArrowSchema *s = calloc(1, sizeof *s);
    struct ArrowArray *a = calloc(1, sizeof *a);
    ArrayPrivate *pd = calloc(1, sizeof *pd);
    PyObject *sc = NULL, *ac = NULL;
    if (!s || !a || !pd) {
        free(s);
        free(a);
        free(pd);
        return PyErr_NoMemory();
    }
    s->format = c->type == T_I64   ? FORMAT_L
                : c->type == T_F64 ? FORMAT_G
                : c->type == T_U32 ? FORMAT_I
                : c->type == T_U8  ? FORMAT_C
                                   : FORMAT_U;
    s->name = "";
    s->flags = ARROW_FLAG_NULLABLE;
    s->release = schema_release;

    if (c->type == T_STR && c->offs.len == 0) {
        int64_t zero = 0;
        if (buf_put(&c->offs, &zero, 8)) {
            free(s);
            free(a);
            free(pd);
            return PyErr_NoMemory();
        }
    }
    /* Arrow allows a null data pointer only for empty buffers; give every buffer an address. */
    if (!c->data.p && buf_grow(&c->data, 8)) {
        free(s);
        free(a);
        free(pd);
        return PyErr_NoMemory();
    }
    pd->owned[0] = c->valid.p;
    pd->buffers[0] = c->nulls ? c->valid.p : NULL;
    if (c->type == T_STR) {
        pd->owned[1] = c->offs.p;
        pd->owned[2] = c->data.p;
        pd->buffers[1] = c->offs.p;
        pd->buffers[2] = c->data.p;
        a->n_buffers = 3;
    } else {
        pd->owned[1] = c->data.p;
        pd->buffers[1] = c->data.p;
        free(c->offs.p);
        a->n_buffers = 2;
    }
    a->length = c->len;
    a->null_count = c->nulls;
    a->buffers = pd->buffers;
    a->release = array_release;
    a->private_data = pd;
    memset(c, 0, sizeof *c); /* ownership moved */

    sc = PyCapsule_New(s, "arrow_schema", schema_capsule_free);
    if (!sc) {
        free(s);
        array_release(a);
        free(a);
        return NULL;
    }
    ac = PyCapsule_New(a, "arrow_array", array_capsule_free);
    if (!ac) {
        Py_DECREF(sc);
        array_release(a);
        free(a);
        return NULL;
    }
    return Py_BuildValue("(NN)", sc, ac);
}

/* ------------------------------------------------------------- fields (slot order = kineto_scan.py) */

/* Event-level keys, in the order the caller passes them. */
enum { E_PH, E_CAT, E_NAME, E_PID, E_TID, E_TS, E_DUR, E_ID, E_ARGS, N_EV };
/* Arg keys: External id, correlation, 7 GPU fields, collective metadata, 5 allocator fields. */
enum {
    A_EXT, A_CORR,
    A_DEV, A_STREAM, A_BYTES, A_GID, A_GNID, A_WOS, A_WOC,
    A_COLL, A_INN, A_OUTN, A_GSIZE, A_SEQ, A_DTYPE, A_PGN, A_PGD, A_INS, A_OUTS, A_PGR,
    A_MDT, A_MD, A_MB, A_TA, A_TR,
    N_ARG
};
#define N_GPU 7
#define FIRST_GPU A_DEV
#define N_META_INT 4 /* A_INN .. A_SEQ */
#define N_META_STR 6 /* A_DTYPE .. A_PGR */
#define N_MEM 5
#define FIRST_MEM A_MDT

enum { K_INT, K_FLOAT, K_STR, K_ID }; /* K_ID: int, or a string whose trailing integer is taken */
static const char EV_KIND[N_EV] = {K_STR, K_STR, K_STR, K_ID, K_ID, K_FLOAT, K_FLOAT, K_INT, 0};
static const char ARG_KIND[N_ARG] = {
    K_INT, K_INT,
    K_INT, K_INT, K_INT, K_INT, K_INT, K_INT, K_INT,
    K_STR, K_INT, K_INT, K_INT, K_INT, K_STR, K_STR, K_STR, K_STR, K_STR, K_STR,
    K_INT, K_INT, K_INT, K_INT, K_INT,
};

enum { S_NULL = 0, S_VALUE = 1, S_DIRTY = 2 };

typedef struct {
    char state; /* S_NULL also means absent */
    int64_t i;
    double f;
    const char *s;
    size_t n;
    Buf scratch; /* decoded string when the JSON one had escapes */
} Field;

typedef struct {
    const char *key;
    size_t len;
} Key;

/* memcmp(a, b, n) == 0 for the short keys and names compared per event (no libc call). */
static inline int same(const char *a, const char *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i]) return 0;
    return 1;
}

/* Keys bucketed by length and first byte: most keys in a trace are ones we skip ("Input Dims",
 * "Record function id", …), and they should cost one or two byte compares, not a table scan. */
#define MAX_KEY 64
#define PER_BUCKET 4
typedef struct {
    signed char slot[MAX_KEY][PER_BUCKET];
} KeyIndex;

static int index_keys(KeyIndex *ix, const Key *keys, int n) {
    memset(ix->slot, -1, sizeof ix->slot);
    for (int i = 0; i < n; i++) {
        if (keys[i].len == 0 || keys[i].len >= MAX_KEY) return -1;
        int j = 0;
        while (j < PER_BUCKET && ix->slot[keys[i].len][j] >= 0) j++;
        if (j == PER_BUCKET) return -1;
        ix->slot[keys[i].len][j] = (signed char)i;
    }
    return 0;
}

/* Index of a key (the slice between quotes, no escapes) in a key table, or -1. */
static inline int find_key(const KeyIndex *ix, const Key *keys, const char *k, size_t len) {
    if (len >= MAX_KEY) return -1;
    const signed char *b = ix->slot[len];
    for (int j = 0; j < PER_BUCKET && b[j] >= 0; j++) {
        const Key *c = &keys[b[j]];
        if (c->key[0] == k[0] && same(c->key, k, len)) return b[j];
    }
    return -1;
}

/* A small string → code map (phases, categories); strings not in it get `dflt`. */
#define MAX_CODES 64
typedef struct {
    Key keys[MAX_CODES];
    unsigned char code[MAX_CODES];
    int n;
    unsigned char dflt;
} CodeTable;

typedef struct {
    const char *p, *end, *start;
    const char *fail; /* reason the fast path declined (static string) */
    const char *fail_at;
    Key ev_keys[N_EV], arg_keys[N_ARG];
    KeyIndex ev_index, arg_index;
    Field ev[N_EV], arg[N_ARG];
    /* category / phase / name tests of a row, as the Python reader makes them */
    CodeTable ph_codes, cat_kinds; /* ph → phase code, cat → index of its kind (KIND enum) */
    uint64_t gpu_kinds;            /* bit k: kind k lives on a GPU stream */
    int kernel_kind, flow_code;
    uint64_t timed_codes; /* bit c: rows of phase code c go to the main table */
    Key comm_name, mem_name;
    Col main[10], flow[7], gpu[1 + N_GPU], meta[1 + 1 + N_META_INT + N_META_STR], mem[1 + N_MEM];
    uint32_t row;
    uint64_t touched; /* slots set by this event (bit i: event slot i, N_EV + j: arg slot j) */
    int dirty;        /* 1: an event field, 2: an args field of a type we do not take */
    /* page release: drop consumed pages of a file map as the scan passes them */
    int release;
    const char *released;
} Scan;

#define DECLINE(S, why)        \
    do {                       \
        (S)->fail = (why);     \
        (S)->fail_at = (S)->p; \
        return -1;             \
    } while (0)

static inline void skip_ws(Scan *S) {
    const char *p = S->p, *e = S->end;
    while (p < e && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
    S->p = p;
}

/* ------------------------------------------------------------------ strings */

static int hex4(const char *p, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

/* Length of a valid UTF-8 sequence at p (lead byte >= 0x80), or 0 if invalid. */
static size_t utf8_seq(const unsigned char *p, const unsigned char *e) {
    unsigned c = p[0];
    if (c >= 0xC2 && c <= 0xDF) return (e - p >= 2 && (p[1] & 0xC0) == 0x80) ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
        if (e - p < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) return 0;
        if (c == 0xE0 && p[1] < 0xA0) return 0; /* overlong */
        if (c == 0xED && p[1] >= 0xA0) return 0; /* surrogate */
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (e - p < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80)
            return 0;
        if (c == 0xF0 && p[1] < 0x90) return 0;
        if (c == 0xF4 && p[1] >= 0x90) return 0;
        return 4;
    }
    return 0;
}

static int put_utf8(Buf *b, unsigned cp) {
    char u[4];
    size_t n;
    if (cp < 0x80) { u[0] = (char)cp; n = 1; }
    else if (cp < 0x800) { u[0] = (char)(0xC0 | (cp >> 6)); u[1] = (char)(0x80 | (cp & 0x3F)); n = 2; }
    else if (cp < 0x10000) {
        u[0] = (char)(0xE0 | (cp >> 12)); u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (char)(0x80 | (cp & 0x3F)); n = 3;
    } else {
        u[0] = (char)(0xF0 | (cp >> 18)); u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); u[3] = (char)(0x80 | (cp & 0x3F)); n = 4;
    }
    return buf_put(b, u, n);
}

/* The first byte at or after p that is '"', '\\', a control character or non-ASCII (e if none):
 * the end of a run of plain string bytes, 16 at a time where SSE2 is there. */
static inline const unsigned char *plain_run(const unsigned char *p, const unsigned char *e) {
#if defined(__SSE2__)
    const __m128i quote = _mm_set1_epi8('"'), bslash = _mm_set1_epi8('\\');
    const __m128i space = _mm_set1_epi8(0x20);
    while (e - p >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)p);
        /* signed compare: bytes >= 0x80 are negative, so "< 0x20" catches them too */
        __m128i hit = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, bslash)),
                                   _mm_cmplt_epi8(v, space));
        int mask = _mm_movemask_epi8(hit);
        if (mask) return p + __builtin_ctz((unsigned)mask);
        p += 16;
    }
#endif
    while (p < e && *p >= 0x20 && *p != '"' && *p != '\\' && *p < 0x80) p++;
    return p;
}

/* A JSON string at S->p (on the opening quote). With `out`, its value: a slice of the input when
 * it has no escapes, else decoded into out->scratch; UTF-8 validated (msgspec rejects invalid
 * UTF-8 in the strings it decodes). Without `out`, only validated as msgspec validates skipped
 * strings: control characters and lone surrogates are errors, bytes >= 0x80 are not checked. */
static int parse_string(Scan *S, Field *out) {
    const unsigned char *p = (const unsigned char *)S->p + 1, *e = (const unsigned char *)S->end;
    const unsigned char *run = p;
    int escaped = 0;
    if (out) out->scratch.len = 0;
    for (;;) {
        p = plain_run(p, e);
        if (p >= e) DECLINE(S, "unterminated string");
        unsigned c = *p;
        if (c == '"') break;
        if (c < 0x20) {
            S->p = (const char *)p;
            DECLINE(S, "control character in a string");
        }
        if (c >= 0x80) {
            if (out) {
                size_t n = utf8_seq(p, e);
                if (!n) {
                    S->p = (const char *)p;
                    DECLINE(S, "invalid UTF-8 in a string");
                }
                p += n;
            } else {
                p++;
            }
            continue;
        }
        /* backslash */
        if (out && !escaped) {
            escaped = 1;
            out->scratch.len = 0;
        }
        if (out && buf_put(&out->scratch, run, (size_t)(p - run))) DECLINE(S, "out of memory");
        if (e - p < 2) DECLINE(S, "unterminated string");
        c = p[1];
        char simple = 0;
        switch (c) {
            case '"': simple = '"'; break;
            case '\\': simple = '\\'; break;
            case '/': simple = '/'; break;
            case 'b': simple = '\b'; break;
            case 'f': simple = '\f'; break;
            case 'n': simple = '\n'; break;
            case 'r': simple = '\r'; break;
            case 't': simple = '\t'; break;
            case 'u': break;
            default:
                S->p = (const char *)p;
                DECLINE(S, "invalid escape in a string");
        }
        if (simple) {
            if (out && buf_put(&out->scratch, &simple, 1)) DECLINE(S, "out of memory");
            p += 2;
        } else {
            unsigned cp, lo;
            if (e - p < 6 || hex4((const char *)p + 2, &cp)) DECLINE(S, "invalid \\u escape");
            p += 6;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (e - p < 6 || p[0] != '\\' || p[1] != 'u' || hex4((const char *)p + 2, &lo) ||
                    lo < 0xDC00 || lo > 0xDFFF)
                    DECLINE(S, "lone surrogate in a string");
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                p += 6;
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                DECLINE(S, "lone surrogate in a string");
            }
            if (out && put_utf8(&out->scratch, cp)) DECLINE(S, "out of memory");
        }
        run = p;
    }
    if (out) {
        if (escaped) {
            if (buf_put(&out->scratch, run, (size_t)(p - run))) DECLINE(S, "out of memory");
            out->s = out->scratch.p;
            out->n = out->scratch.len;
        } else {
            out->s = S->p + 1;
            out->n = (size_t)((const char *)p - (S->p + 1));
        }
        out->state = S_VALUE;
    }
    S->p = (const char *)p + 1;
    return 0;
}

/* ------------------------------------------------------------------ numbers */

static const double POW10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                 1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* A JSON number at S->p. kind: K_INT with *iv (fits int64), K_FLOAT with *fv, or -1 for an
 * integer beyond int64 (msgspec makes it a Python int; the columns cannot hold it). */
static int parse_number(Scan *S, int *kind, int64_t *iv, double *fv) {
    const char *p = S->p, *e = S->end, *tok = p;
    int neg = 0;
    uint64_t mant = 0;
    int digits = 0, exp10 = 0, is_float = 0, overflow = 0, inexact = 0;
    if (p < e && *p == '-') { neg = 1; p++; }
    if (p >= e || *p < '0' || *p > '9') DECLINE(S, "invalid number");
    if (*p == '0') {
        p++;
        if (p < e && *p >= '0' && *p <= '9') DECLINE(S, "invalid number (leading zero)");
    } else {
        while (p < e && *p >= '0' && *p <= '9') {
            if (digits < 19) { mant = mant * 10 + (uint64_t)(*p - '0'); digits++; }
            else { exp10++; overflow = 1; inexact |= *p != '0'; }
            p++;
        }
    }
    if (p < e && *p == '.') {
        is_float = 1;
        p++;
        if (p >= e || *p < '0' || *p > '9') DECLINE(S, "invalid number");
        while (p < e && *p >= '0' && *p <= '9') {
            if (digits < 19) {
                mant = mant * 10 + (uint64_t)(*p - '0');
                digits += mant != 0; /* leading zeros of 0.000123 are not significant */
                exp10--;
            } else {
                inexact |= *p != '0';
            }
            p++;
        }
    }
    if (p < e && (*p == 'e' || *p == 'E')) {
        is_float = 1;
        p++;
        int eneg = 0, ev = 0;
        if (p < e && (*p == '+' || *p == '-')) { eneg = *p == '-'; p++; }
        if (p >= e || *p < '0' || *p > '9') DECLINE(S, "invalid number");
        while (p < e && *p >= '0' && *p <= '9') {
            if (ev < 100000) ev = ev * 10 + (*p - '0');
            p++;
        }
        exp10 += eneg ? -ev : ev;
    }
    S->p = p;
    if (!is_float) {
        /* 19 digits always fit uint64; more never fit int64 */
        if (overflow || mant > (uint64_t)INT64_MAX + (uint64_t)neg) { *kind = -1; return 0; }
        *kind = K_INT;
        *iv = neg ? (int64_t)(0 - mant) : (int64_t)mant;
        return 0;
    }
    *kind = K_FLOAT;
    if (!inexact && mant <= (1ULL << 53) && exp10 >= -22 && exp10 <= 22) {
        /* Clinger's fast path: both operands exact, one correctly rounded operation */
        double d = (double)mant;
        d = exp10 < 0 ? d / POW10[-exp10] : d * POW10[exp10];
        *fv = neg ? -d : d;
        return 0;
    }
    char tmp[128];
    size_t n = (size_t)(p - tok);
    if (n >= sizeof tmp) DECLINE(S, "number too long");
    memcpy(tmp, tok, n);
    tmp[n] = 0;
    *fv = strtod(tmp, NULL); /* glibc: correctly rounded; the C locale's '.' in an extension */
    return 0;
}

/* ------------------------------------------------------------------ skipping (validating) */
/* A number we do not keep: its grammar checked, its value not computed. */
static int skip_number(Scan *S) {
    const char *p = S->p, *e = S->end;
    if (p < e && *p == '-') p++;
    if (p >= e || *p < '0' || *p > '9') DECLINE(S, "invalid number");
    if (*p == '0') {
        p++;
        if (p < e && *p >= '0' && *p <= '9') DECLINE(S, "invalid number (leading zero)");
    } else {
        while (p < e && *p >= '0' && *p <= '9') p++;
    }
    if (p < e && *p == '.') {
        p++;
        if (p >= e || *p < '0' || *p > '9') DECLINE(S, "invalid number");
        while (p < e && *p >= '0' && *p <= '9') p++;
    }
    if (p < e && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < e && (*p == '+' || *p == '-')) p++;
        if (p >= e || *p < '0' || *p > '9') DECLINE(S, "invalid number");
        while (p < e && *p >= '0' && *p <= '9') p++;
    }
    S->p = p;
    return 0;
}


static int skip_value(Scan *S, int depth);

static int skip_literal(Scan *S, const char *lit, size_t n) {
    if ((size_t)(S->end - S->p) < n || memcmp(S->p, lit, n)) DECLINE(S, "invalid literal");
    S->p += n;
    return 0;
}

static int skip_container(Scan *S, int depth, char close, int is_object) {
    if (depth > 256) DECLINE(S, "nesting too deep");
    S->p++;
    skip_ws(S);
    if (S->p < S->end && *S->p == close) { S->p++; return 0; }
    for (;;) {
        if (is_object) {
            if (S->p >= S->end || *S->p != '"') DECLINE(S, "expected a key");
            if (parse_string(S, NULL)) return -1;
            skip_ws(S);
            if (S->p >= S->end || *S->p != ':') DECLINE(S, "expected ':'");
            S->p++;
            skip_ws(S);
        }
        if (skip_value(S, depth + 1)) return -1;
        skip_ws(S);
        if (S->p >= S->end) DECLINE(S, "truncated");
        if (*S->p == ',') { S->p++; skip_ws(S); continue; }
        if (*S->p == close) { S->p++; return 0; }
        DECLINE(S, "expected ',' or a closing bracket");
    }
}

static int skip_value(Scan *S, int depth) {
    if (S->p >= S->end) DECLINE(S, "truncated");
    switch (*S->p) {
        case '"': return parse_string(S, NULL);
        case '{': return skip_container(S, depth, '}', 1);
        case '[': return skip_container(S, depth, ']', 0);
        case 't': return skip_literal(S, "true", 4);
        case 'f': return skip_literal(S, "false", 5);
        case 'n': return skip_literal(S, "null", 4);
        default: return skip_number(S);
    }
}

/* ------------------------------------------------------------------ typed values */

/* The trailing integer of a pid/tid string, as `str.extract(r"(-?\d+)\s*$")` then a cast: null
 * without one. Non-ASCII strings decline (the regex's \d and \s are Unicode-aware). */
static int id_from_string(Scan *S, Field *f) {
    const char *s = f->s;
    size_t n = f->n;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) DECLINE(S, "non-ASCII pid/tid string");
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n' || s[n - 1] == '\r' ||
                 s[n - 1] == '\v' || s[n - 1] == '\f'))
        n--;
    size_t end = n;
    while (n && s[n - 1] >= '0' && s[n - 1] <= '9') n--;
    if (n == end) { f->state = S_NULL; return 0; }
    if (end - n > 18) DECLINE(S, "pid/tid string number too long");
    int64_t v = 0;
    for (size_t i = n; i < end; i++) v = v * 10 + (s[i] - '0');
    f->i = (n && s[n - 1] == '-') ? -v : v;
    f->state = S_VALUE;
    return 0;
}

/* Read one value into a field of the given kind; a value of another type marks it S_DIRTY. */
static int read_field(Scan *S, Field *f, int kind) {
    char c = *S->p;
    if (c == 'n') {
        if (skip_literal(S, "null", 4)) return -1;
        f->state = S_NULL;
        return 0;
    }
    if (c == '"' && (kind == K_STR || kind == K_ID)) {
        if (parse_string(S, f)) return -1;
        return kind == K_ID ? id_from_string(S, f) : 0;
    }
    if ((c == '-' || (c >= '0' && c <= '9')) && kind != K_STR) {
        int nk;
        if (parse_number(S, &nk, &f->i, &f->f)) return -1;
        if (nk == K_INT) {
            f->state = S_VALUE;
            if (kind == K_FLOAT) f->f = (double)f->i;
        } else if (nk == K_FLOAT && kind == K_FLOAT) {
            if (!isfinite(f->f)) DECLINE(S, "number out of range");
            f->state = S_VALUE;
        } else {
            f->state = S_DIRTY;
        }
        return 0;
    }
    f->state = S_DIRTY;
    return skip_value(S, 0);
}

/* A key at S->p: its raw slice, or -1 (declined) for keys with escapes (msgspec unescapes keys
 * before matching; rare enough to leave to the Python reader). */
static int read_key(Scan *S, const char **k, size_t *len) {
    const char *p = S->p + 1, *e = S->end;
    for (;;) { /* non-ASCII bytes are fine in a key we only compare */
        p = (const char *)plain_run((const unsigned char *)p, (const unsigned char *)e);
        if (p < e && (unsigned char)*p >= 0x80) { p++; continue; }
        break;
    }
    if (p >= e || *p != '"') {
        if (p < e && *p == '\\') DECLINE(S, "escaped key");
        DECLINE(S, "invalid key");
    }
    *k = S->p + 1;
    *len = (size_t)(p - *k);
    S->p = p + 1;
    skip_ws(S);
    if (S->p >= S->end || *S->p != ':') DECLINE(S, "expected ':'");
    S->p++;
    skip_ws(S);
    if (S->p >= S->end) DECLINE(S, "truncated");
    return 0;
}

/* Back to "absent" for the slots in `mask` that the last event set (a few of 34). */
static inline void reset_fields(Scan *S, uint64_t mask) {
    uint64_t m = S->touched & mask;
    S->touched &= ~mask;
    while (m) {
        int i = __builtin_ctzll(m);
        m &= m - 1;
        if (i < N_EV) S->ev[i].state = S_NULL;
        else S->arg[i - N_EV].state = S_NULL;
    }
}

/* The members of the object at S->p: `member` is called on each with the key's raw slice and S->p
 * on its value, and must consume the value. `what` names the object in a decline. Keys are read by
 * read_key (escaped keys decline). Static inline with constant callbacks: compiled per caller. */
typedef int (*MemberFn)(Scan *S, const char *key, size_t len, void *ctx);

static inline int each_member(Scan *S, const char *what, MemberFn member, void *ctx) {
    if (S->p >= S->end || *S->p != '{') DECLINE(S, what);
    S->p++;
    skip_ws(S);
    if (S->p < S->end && *S->p == '}') { S->p++; return 0; }
    for (;;) {
        const char *k;
        size_t len;
        if (S->p >= S->end || *S->p != '"') DECLINE(S, "expected a key");
        if (read_key(S, &k, &len) || member(S, k, len, ctx)) return -1;
        skip_ws(S);
        if (S->p >= S->end) DECLINE(S, "truncated");
        if (*S->p == ',') { S->p++; skip_ws(S); continue; }
        if (*S->p == '}') { S->p++; return 0; }
        DECLINE(S, "expected ',' or '}'");
    }
}

static int arg_member(Scan *S, const char *k, size_t len, void *unused) {
    (void)unused;
    int slot = find_key(&S->arg_index, S->arg_keys, k, len);
    if (slot < 0) return skip_value(S, 1);
    if (read_field(S, &S->arg[slot], ARG_KIND[slot])) return -1;
    S->touched |= 1ULL << (N_EV + slot);
    if (S->arg[slot].state == S_DIRTY) S->dirty |= 2;
    return 0;
}

static int event_member(Scan *S, const char *k, size_t len, void *unused) {
    (void)unused;
    int slot = find_key(&S->ev_index, S->ev_keys, k, len);
    if (slot == E_ARGS) {
        /* a repeated args object replaces the first, as in msgspec */
        reset_fields(S, ~0ULL << N_EV);
        return each_member(S, "args is not an object", arg_member, NULL);
    }
    if (slot < 0) return skip_value(S, 1);
    if (read_field(S, &S->ev[slot], EV_KIND[slot])) return -1;
    S->touched |= 1ULL << slot;
    if (S->ev[slot].state == S_DIRTY) S->dirty |= 1;
    return 0;
}

static int code_of(const CodeTable *t, const Field *f) {
    if (f->state == S_VALUE)
        for (int i = 0; i < t->n; i++)
            if (t->keys[i].len == f->n && same(t->keys[i].key, f->s, f->n)) return t->code[i];
    return t->dflt;
}

static int str_is(const Key *k, const Field *f) {
    return f->state == S_VALUE && f->n == k->len && same(f->s, k->key, f->n);
}

#define OK(x) \
    if (x) DECLINE(S, "out of memory")

/* One event object: its fields into the row's slots, then the row into the tables. */
static int parse_event(Scan *S) {
    reset_fields(S, ~0ULL);
    S->dirty = 0;
    if (each_member(S, "an event is not an object", event_member, NULL)) return -1;
    /* A field of an unexpected type anywhere: the Python reader decides (lenient decode). */
    if (S->dirty & 1) DECLINE(S, "an event field of unexpected type");
    if (S->dirty) DECLINE(S, "an args field of unexpected type");

    Field *ev = S->ev, *ar = S->arg;
    uint32_t row = S->row;
    if (S->row == UINT32_MAX) DECLINE(S, "too many events");
    S->row++;
    int ph = code_of(&S->ph_codes, &ev[E_PH]), kind = code_of(&S->cat_kinds, &ev[E_CAT]);
    if (ph == S->flow_code) { /* flow endpoints: a table of their own, all they need */
        OK(col_u32(&S->flow[0], row));
        OK(col_i64(&S->flow[1], ev[E_ID].state, ev[E_ID].i));
        OK(col_str(&S->flow[2], 1, ev[E_PH].s, ev[E_PH].n));
        OK(col_str(&S->flow[3], ev[E_CAT].state, ev[E_CAT].s, ev[E_CAT].n));
        OK(col_f64(&S->flow[4], ev[E_TS].state, ev[E_TS].f));
        OK(col_i64(&S->flow[5], ev[E_PID].state, ev[E_PID].i));
        OK(col_i64(&S->flow[6], ev[E_TID].state, ev[E_TID].i));
        return 0;
    }
    if (ph >= 64 || !(S->timed_codes >> ph & 1)) return 0; /* metadata ('M') rows: no frame */
    OK(col_u32(&S->main[0], row));
    OK(col_u8(&S->main[1], (uint8_t)ph));
    OK(col_u8(&S->main[2], (uint8_t)kind));
    OK(col_str(&S->main[3], ev[E_NAME].state, ev[E_NAME].s, ev[E_NAME].n));
    OK(col_i64(&S->main[4], ev[E_PID].state, ev[E_PID].i));
    OK(col_i64(&S->main[5], ev[E_TID].state, ev[E_TID].i));
    OK(col_f64(&S->main[6], ev[E_TS].state, ev[E_TS].f));
    OK(col_f64(&S->main[7], ev[E_DUR].state, ev[E_DUR].f));
    OK(col_i64(&S->main[8], ar[A_EXT].state, ar[A_EXT].i));
    OK(col_i64(&S->main[9], ar[A_CORR].state, ar[A_CORR].i));
    if (kind < 64 && (S->gpu_kinds >> kind & 1)) {
        OK(col_u32(&S->gpu[0], row));
        for (int j = 0; j < N_GPU; j++)
            OK(col_i64(&S->gpu[1 + j], ar[FIRST_GPU + j].state, ar[FIRST_GPU + j].i));
    }
    int comm = kind == S->kernel_kind || str_is(&S->comm_name, &ev[E_NAME]);
    if (comm && ar[A_COLL].state == S_VALUE) {
        Col *m = S->meta;
        OK(col_u32(&m[0], row));
        OK(col_str(&m[1], 1, ar[A_COLL].s, ar[A_COLL].n));
        for (int j = 0; j < N_META_INT; j++)
            OK(col_i64(&m[2 + j], ar[A_INN + j].state, ar[A_INN + j].i));
        for (int j = 0; j < N_META_STR; j++) {
            Field *f = &ar[A_DTYPE + j];
            OK(col_str(&m[2 + N_META_INT + j], f->state, f->s, f->n));
        }
    }
    if (str_is(&S->mem_name, &ev[E_NAME])) {
        OK(col_u32(&S->mem[0], row));
        for (int j = 0; j < N_MEM; j++)
            OK(col_i64(&S->mem[1 + j], ar[FIRST_MEM + j].state, ar[FIRST_MEM + j].i));
    }
    return 0;
}

/* Drop this part's pages of the file map behind the cursor, every 8 MB: the bytes are in columns
 * now, and the map is private and file-backed, so a page touched again (the Python reader after
 * a decline) is read back from the file as it was. Keeps the whole file out of the peak. */
static void release_pages(Scan *S, int final) {
    if (!S->release) return;
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t upto = (uintptr_t)S->p;
    upto -= upto % (uintptr_t)page;
    if (!final && upto < (uintptr_t)S->released + (8u << 20)) return;
    if (upto > (uintptr_t)S->released) {
        madvise((void *)S->released, upto - (uintptr_t)S->released, MADV_DONTNEED);
        S->released = (const char *)upto;
    }
}

/* ------------------------------------------------------------------ events, in parallel parts */

enum { R_END = 1, R_STOP = 2 };

/* Events from S->p (on an event's '{') to the array's ']' (R_END, S->p after it), or to the first
 * event that starts at or after `stop` (R_STOP, S->p on it; never when stop is NULL). */
static int parse_event_run(Scan *S, const char *stop) {
    for (;;) {
        if (S->p >= S->end) DECLINE(S, "truncated");
        if (parse_event(S)) return -1;
        if ((S->row & 4095) == 0) release_pages(S, 0);
        skip_ws(S);
        if (S->p >= S->end) DECLINE(S, "truncated");
        if (*S->p == ',') {
            S->p++;
            skip_ws(S);
            if (stop && S->p >= stop) return R_STOP;
            continue;
        }
        if (*S->p == ']') { S->p++; return R_END; }
        DECLINE(S, "expected ',' or ']'");
    }
}

static inline int is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

/* A '{' after `from` preceded by "}" and "," (blanks between): where an event may start. It may
 * also be an object nested in an event, or text in a string; the caller proves it (below). */
static const char *next_candidate(const char *from, const char *end) {
    const char *lim = end - from > (4 << 20) ? from + (4 << 20) : end;
    for (const char *p = from; p < lim; p++) {
        p = memchr(p, '}', (size_t)(lim - p));
        if (!p) return NULL;
        const char *q = p + 1;
        while (q < lim && is_ws(*q)) q++;
        if (q >= lim || *q != ',') continue;
        q++;
        while (q < lim && is_ws(*q)) q++;
        if (q < lim && *q == '{') return q;
    }
    return NULL;
}

#define MAX_PARTS 32

typedef struct {
    Scan *S;
    const char *stop;
    int rc, ran;
    pthread_t thread;
} Part;

static void *part_main(void *arg) {
    Part *pt = arg;
    pt->rc = parse_event_run(pt->S, pt->stop);
    return NULL;
}

static void init_tables(Scan *S);

/* A scanner for another part of the same buffer: same keys and tests, empty tables. */
static Scan *clone_scan(const Scan *S, const char *at) {
    Scan *T = malloc(sizeof *T);
    if (!T) return NULL;
    memcpy(T, S, sizeof *T);
    memset(T->ev, 0, sizeof T->ev);
    memset(T->arg, 0, sizeof T->arg);
    init_tables(T);
    T->p = at;
    T->row = 0;
    T->touched = 0;
    T->dirty = 0;
    T->fail = NULL;
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t up = ((uintptr_t)at + (uintptr_t)page - 1) / (uintptr_t)page * (uintptr_t)page;
    T->released = (const char *)up;
    return T;
}

/* traceEvents' array, cut into up to `want` parts parsed by as many threads. A part's start is
 * only a guess (next_candidate), so a part is used only when the part before it, itself proven,
 * stopped exactly there, right after one of the array's own commas; at the first part that is
 * not proven the part before it reads on to the end alone. The result is the sequential parse's,
 * cut into parts[0..*used). */
static int parse_events(Scan *S, Scan **parts, int *used, int want, size_t min_part) {
    *used = 1;
    if (*S->p != '[') DECLINE(S, "traceEvents is not a list");
    S->p++;
    skip_ws(S);
    if (S->p < S->end && *S->p == ']') { S->p++; return 0; }
    const char *cand[MAX_PARTS];
    Part pt[MAX_PARTS];
    int n = 1;
    size_t span = (size_t)(S->end - S->p);
    if (want > MAX_PARTS) want = MAX_PARTS;
    if (want > 1 && min_part && span / (size_t)want < min_part) want = (int)(span / min_part);
    for (int i = 1; i < want; i++) {
        const char *c = next_candidate(S->p + span / (size_t)want * (size_t)i, S->end);
        if (c && c > (n > 1 ? cand[n - 1] : S->p)) cand[n++] = c;
    }
    memset(pt, 0, sizeof pt);
    pt[0].S = S;
    for (int i = 1; i < n; i++) {
        parts[i] = clone_scan(S, cand[i]);
        if (!parts[i]) { n = i; break; }
        pt[i].S = parts[i];
        pt[i].stop = i + 1 < n ? cand[i + 1] : NULL;
        pt[i].ran = pthread_create(&pt[i].thread, NULL, part_main, &pt[i]) == 0;
    }
    int rc = parse_event_run(S, n > 1 ? cand[1] : NULL);
    for (int i = 1; i < n; i++)
        if (pt[i].ran) pthread_join(pt[i].thread, NULL);

    Scan *cur = S;
    for (int i = 1; i < n && rc == R_STOP; i++) {
        if (cur->p == cand[i] && pt[i].ran) { /* proven: part i starts where i - 1 ended */
            cur = parts[i];
            rc = pt[i].rc;
            *used = i + 1;
        } else {
            rc = parse_event_run(cur, NULL);
        }
    }
    if (rc == R_STOP) rc = parse_event_run(cur, NULL); /* last part, unproven successor */
    if (rc < 0) {
        S->fail = cur->fail;
        S->fail_at = cur->fail_at;
        return -1;
    }
    S->p = cur->p; /* after ']' */
    return 0;
}

/* ------------------------------------------------------------------ module function */

static int load_keys(PyObject *seq, Key *keys, int n, const char *what) {
    if (!PyTuple_Check(seq) || PyTuple_GET_SIZE(seq) != n) {
        PyErr_Format(PyExc_ValueError, "%s: expected a tuple of %d bytes", what, n);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        PyObject *b = PyTuple_GET_ITEM(seq, i);
        if (!PyBytes_Check(b)) {
            PyErr_Format(PyExc_TypeError, "%s: keys must be bytes", what);
            return -1;
        }
        keys[i].key = PyBytes_AS_STRING(b);
        keys[i].len = (size_t)PyBytes_GET_SIZE(b);
    }
    return 0;
}

/* (names: tuple of bytes, codes: bytes of the same length, default: int) → a CodeTable. */
static int load_codes(PyObject *spec, CodeTable *t, const char *what) {
    PyObject *names, *codes;
    int dflt;
    if (!PyArg_ParseTuple(spec, "OSi", &names, &codes, &dflt)) return -1;
    Py_ssize_t n = PyTuple_Check(names) ? PyTuple_GET_SIZE(names) : -1;
    if (n < 0 || n > MAX_CODES || PyBytes_GET_SIZE(codes) != n || dflt < 0 || dflt > 255) {
        PyErr_Format(PyExc_ValueError, "%s: (names, codes, default) of at most %d", what,
                     MAX_CODES);
        return -1;
    }
    if (load_keys(names, t->keys, (int)n, what)) return -1;
    memcpy(t->code, PyBytes_AS_STRING(codes), (size_t)n);
    t->n = (int)n;
    t->dflt = (unsigned char)dflt;
    return 0;
}

static int bytes_tuple(PyObject *t, const char *what) {
    if (!PyTuple_Check(t)) goto bad;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(t); i++)
        if (!PyBytes_Check(PyTuple_GET_ITEM(t, i))) goto bad;
    return 0;
bad:
    PyErr_Format(PyExc_TypeError, "%s: expected a tuple of bytes", what);
    return -1;
}

static void init_cols(Col *c, int n, const char *types) {
    for (int i = 0; i < n; i++) {
        memset(&c[i], 0, sizeof c[i]);
        c[i].type = types[i];
    }
}

static PyObject *export_table(Col *c, int n) {
    PyObject *list = PyList_New(n);
    if (!list) return NULL;
    for (int i = 0; i < n; i++) {
        PyObject *pair = col_export(&c[i]);
        if (!pair) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, pair);
    }
    return list;
}

#define NCOLS(a) ((int)(sizeof(a) / sizeof((a)[0])))

static void free_scan(Scan *S) {
    Col *tables[] = {S->main, S->flow, S->gpu, S->meta, S->mem};
    int sizes[] = {NCOLS(S->main), NCOLS(S->flow), NCOLS(S->gpu), NCOLS(S->meta), NCOLS(S->mem)};
    for (int t = 0; t < 5; t++)
        for (int i = 0; i < sizes[t]; i++) col_free(&tables[t][i]);
    for (int i = 0; i < N_EV; i++) free(S->ev[i].scratch.p);
    for (int i = 0; i < N_ARG; i++) free(S->arg[i].scratch.p);
}

typedef struct { /* what parse_top's members need */
    const Key *capture, *events_key;
    Py_ssize_t n_capture, *spans;
    Scan **parts;
    int *used, want, seen_events;
    size_t min_part;
} Top;

static int top_member(Scan *S, const char *k, size_t len, void *ctx) {
    Top *t = ctx;
    if (len == t->events_key->len && memcmp(k, t->events_key->key, len) == 0) {
        if (t->seen_events++) DECLINE(S, "traceEvents given twice");
        return parse_events(S, t->parts, t->used, t->want, t->min_part);
    }
    const char *start = S->p;
    if (skip_value(S, 1)) return -1;
    for (Py_ssize_t i = 0; i < t->n_capture; i++) {
        if (t->capture[i].len == len && memcmp(t->capture[i].key, k, len) == 0) {
            t->spans[2 * i] = start - S->start;
            t->spans[2 * i + 1] = S->p - S->start;
            break;
        }
    }
    return 0;
}

/* The top-level object: traceEvents parsed into the tables, the `capture` keys' values returned
 * as (start, end) byte spans for the caller to decode, every other value skipped. */
static int parse_top(Scan *S, Top *t) {
    skip_ws(S);
    if (each_member(S, "not a JSON object", top_member, t)) return -1;
    skip_ws(S);
    if (S->p != S->end) DECLINE(S, "content after the top-level object");
    if (!t->seen_events) DECLINE(S, "no traceEvents");
    return 0;
}

PyDoc_STRVAR(scan_doc,
"scan(data, event_keys, arg_keys, top_keys, ph_codes, cat_kinds, gpu_kinds, kernel_kind,\n"
"     timed_codes, flow_code, comm_name, mem_name, release, threads, min_part) -> dict | str\n\n"
"Columns of a Kineto trace's traceEvents as Arrow (schema, array) capsule pairs, one set of\n"
"tables per part of the event array (row numbers restart at 0 in each; `events` counts the\n"
"part's events, kept or not), or a short reason\n"
"string when the file needs the Python reader. See kineto_scan.py for the slot order.");

static void init_tables(Scan *S) {
    init_cols(S->main, NCOLS(S->main), "ICCUllggll");
    init_cols(S->flow, NCOLS(S->flow), "IlUUgll");
    init_cols(S->gpu, NCOLS(S->gpu), "Illlllll");
    init_cols(S->meta, NCOLS(S->meta), "IUllllUUUUUU");
    init_cols(S->mem, NCOLS(S->mem), "Illlll");
}

static PyObject *export_part(Scan *S) {
    PyObject *t[5] = {
        export_table(S->main, NCOLS(S->main)), export_table(S->flow, NCOLS(S->flow)),
        export_table(S->gpu, NCOLS(S->gpu)),   export_table(S->meta, NCOLS(S->meta)),
        export_table(S->mem, NCOLS(S->mem)),
    };
    PyObject *out = NULL;
    if (t[0] && t[1] && t[2] && t[3] && t[4])
        out = Py_BuildValue("{sOsOsOsOsOsI}", "main", t[0], "flow", t[1], "gpu", t[2], "meta",
                            t[3], "mem", t[4], "events", (unsigned int)S->row);
    for (int i = 0; i < 5; i++) Py_XDECREF(t[i]);
    return out;
}

static PyObject *scan(PyObject *self, PyObject *args) {
    PyObject *data, *ev_keys, *arg_keys, *top_keys, *ph_codes, *cat_kinds;
    const char *comm_name, *mem_name;
    Py_ssize_t comm_len, mem_len;
    unsigned long long gpu_kinds, timed_codes;
    int kernel_kind, flow_code, release, threads;
    Py_ssize_t min_part;
    if (!PyArg_ParseTuple(args, "OOOOOOKiKiy#y#pin", &data, &ev_keys, &arg_keys, &top_keys,
                          &ph_codes, &cat_kinds, &gpu_kinds, &kernel_kind, &timed_codes,
                          &flow_code, &comm_name, &comm_len, &mem_name, &mem_len, &release,
                          &threads, &min_part))
        return NULL;
    if (bytes_tuple(top_keys, "top_keys")) return NULL;

    Scan *S = calloc(1, sizeof *S);
    if (!S) return PyErr_NoMemory();
    Py_ssize_t n_top = PyTuple_GET_SIZE(top_keys);
    Key *capture = calloc((size_t)n_top + 1, sizeof *capture);
    Py_ssize_t *spans = calloc((size_t)(2 * n_top + 2), sizeof *spans);
    Py_buffer view = {0};
    PyObject *out = NULL;
    Scan *parts[MAX_PARTS] = {S};
    int used = 1;
    if (!capture || !spans) {
        PyErr_NoMemory();
        goto done;
    }
    if (load_keys(ev_keys, S->ev_keys, N_EV, "event_keys") ||
        load_keys(arg_keys, S->arg_keys, N_ARG, "arg_keys") ||
        load_keys(top_keys, capture, (int)n_top, "top_keys"))
        goto done;
    if (index_keys(&S->ev_index, S->ev_keys, N_EV) || index_keys(&S->arg_index, S->arg_keys, N_ARG)) {
        PyErr_SetString(PyExc_ValueError, "keys: empty, too long, or too many of one length");
        goto done;
    }
    for (Py_ssize_t i = 0; i < 2 * n_top; i++) spans[i] = -1;
    if (load_codes(ph_codes, &S->ph_codes, "ph_codes") ||
        load_codes(cat_kinds, &S->cat_kinds, "cat_kinds"))
        goto done;
    S->gpu_kinds = gpu_kinds;
    S->kernel_kind = kernel_kind;
    S->flow_code = flow_code;
    S->timed_codes = timed_codes;
    S->comm_name = (Key){comm_name, (size_t)comm_len};
    S->mem_name = (Key){mem_name, (size_t)mem_len};
    init_tables(S);

    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)) goto done;
    S->start = S->p = view.buf;
    S->end = S->start + view.len;
    S->release = release;
    S->released = S->start;
    static const Key events_key = {"traceEvents", 11};

    int rc;
    Py_BEGIN_ALLOW_THREADS
    Top top = {capture, &events_key, n_top, spans, parts, &used, threads, 0,
               (size_t)(min_part > 0 ? min_part : 0)};
    rc = parse_top(S, &top);
    for (int i = 0; rc == 0 && i < used; i++) release_pages(parts[i], 1);
    Py_END_ALLOW_THREADS
    if (rc) {
        out = PyUnicode_FromFormat("%s (byte %zd)", S->fail ? S->fail : "declined",
                                   (Py_ssize_t)(S->fail_at - S->start));
        goto done;
    }
    PyObject *part_list = PyList_New(used);
    for (int i = 0; part_list && i < used; i++) {
        PyObject *part = export_part(parts[i]);
        if (!part) {
            Py_CLEAR(part_list);
            break;
        }
        PyList_SET_ITEM(part_list, i, part);
    }
    PyObject *span_list = PyList_New(n_top);
    for (Py_ssize_t i = 0; span_list && i < n_top; i++) {
        PyObject *v = spans[2 * i] < 0 ? Py_NewRef(Py_None)
                                       : Py_BuildValue("(nn)", spans[2 * i], spans[2 * i + 1]);
        if (!v) {
            Py_CLEAR(span_list);
            break;
        }
        PyList_SET_ITEM(span_list, i, v);
    }
    if (part_list && span_list)
        out = Py_BuildValue("{sOsO}", "parts", part_list, "spans", span_list);
    Py_XDECREF(part_list);
    Py_XDECREF(span_list);

done:
    if (view.obj) PyBuffer_Release(&view);
    for (int i = 0; i < MAX_PARTS; i++) {
        if (!parts[i]) continue;
        free_scan(parts[i]);
        free(parts[i]);
    }
    free(capture);
    free(spans);
    return out;
}

PyDoc_STRVAR(trim_doc,
"trim() -> None\n\n"
"Give the C heap's free pages back to the OS (glibc malloc_trim; a no-op elsewhere). A read\n"
"frees tens of MB of scanner buffers and converted strings that glibc would otherwise keep for\n"
"itself while polars (jemalloc) allocates afresh: 17 MB on a 140 MB trace.");

static PyObject *trim(PyObject *self, PyObject *unused) {
#if defined(__GLIBC__)
    Py_BEGIN_ALLOW_THREADS
    malloc_trim(0);
    Py_END_ALLOW_THREADS
#endif
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, scan_doc},
    {"trim", trim, METH_NOARGS, trim_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_kineto_scan",
    "Fast path of the Kineto reader: JSON bytes to Arrow columns (see kineto_scan.py).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__kineto_scan(void) { return PyModule_Create(&module); }
