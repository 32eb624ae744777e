/*
 * forestflow.codecs._ffjson: request JSON bodies straight into typed numpy columns.
 *
 * orjson.loads followed by the Python conversions costs a Python object per value and per
 * record (each BASIC record is four dicts and two lists), then list-to-array conversions: most of
 * a 100-row request's CPU. These readers parse the body once and write the values into the
 * columns' memory; a String value is the only object made per value.
 *
 * They are strict (RFC 8259 as orjson reads it: UTF-8 checked, no control characters in strings,
 * no lone surrogates, no leading zeros, no trailing commas) and they decline: anything they do not
 * recognise as the regular shape, every value the Python conversions would refuse or treat in a
 * special way, and anything orjson might read differently (integers of more than 18 digits, numbers
 * that overflow a double, nesting deeper than 500) makes them return None without an exception.
 * The caller then decodes the body with orjson and the Python conversions, which produce the same
 * columns for what these readers accept and the precise 4xx message for what is wrong.
 *
 * For answers, ``datum`` assembles a BASIC datum array from each typed group's rows as orjson wrote
 * them (one orjson call per group, so numbers and strings keep orjson's exact text): no Python
 * object per record.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ndarray.h"

/* Status of every reader step: done, a Python exception is set, or declined (fall back, no exception). */
enum { OK = 0, ERR = -1, NO = 1 };
/* What follows an element of an array or a member of an object: a comma (MORE) or the closing bracket (OK). */
#define MORE 2
#define MAX_DEPTH 500
#define MAX_INT_DIGITS 18

typedef struct {
    const unsigned char *p, *end;
    char *scratch; /* unescaped text of the last string that had escapes */
    Py_ssize_t cap;
} Reader;

#define TRY(expr)                  \
    do {                           \
        int status_ = (expr);      \
        if (status_ != OK)         \
            return status_;        \
    } while (0)

/* 1 for the bytes a string holds as they are (printable ASCII but the quote and the backslash). */
static unsigned char PLAIN[256];

static inline void ws(Reader *r) {
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\n' || *r->p == '\r' || *r->p == '\t'))
        r->p++;
}

/* Consume ``c`` after optional whitespace. */
static inline int expect(Reader *r, char c) {
    ws(r);
    if (r->p >= r->end || *r->p != (unsigned char)c)
        return NO;
    r->p++;
    return OK;
}

/* After an element of an array or a member of an object: MORE after ``,``, OK after ``close``, NO else. */
static inline int next_or_close(Reader *r, char close) {
    ws(r);
    if (r->p < r->end && *r->p == ',') {
        r->p++;
        return MORE;
    }
    if (r->p < r->end && *r->p == (unsigned char)close) {
        r->p++;
        return OK;
    }
    return NO;
}

static int literal(Reader *r, const char *word, Py_ssize_t n) {
    if (r->end - r->p < n || memcmp(r->p, word, (size_t)n) != 0)
        return NO;
    r->p += n;
    return OK;
}

/* Length of the valid UTF-8 sequence at p (lead byte >= 0x80), 0 when invalid (overlong, surrogate, > U+10FFFF). */
static int utf8_length(const unsigned char *p, const unsigned char *end) {
    unsigned char c = p[0];
    Py_ssize_t left = end - p;
#define CONT(i) (left > (i) && (p[i] & 0xC0) == 0x80)
    if (c >= 0xC2 && c <= 0xDF)
        return CONT(1) ? 2 : 0;
    if (c == 0xE0)
        return left > 2 && p[1] >= 0xA0 && p[1] <= 0xBF && CONT(2) ? 3 : 0;
    if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF)
        return CONT(1) && CONT(2) ? 3 : 0;
    if (c == 0xED)
        return left > 2 && p[1] >= 0x80 && p[1] <= 0x9F && CONT(2) ? 3 : 0;
    if (c == 0xF0)
        return left > 3 && p[1] >= 0x90 && p[1] <= 0xBF && CONT(2) && CONT(3) ? 4 : 0;
    if (c >= 0xF1 && c <= 0xF3)
        return CONT(1) && CONT(2) && CONT(3) ? 4 : 0;
    if (c == 0xF4)
        return left > 3 && p[1] >= 0x80 && p[1] <= 0x8F && CONT(2) && CONT(3) ? 4 : 0;
    return 0;
#undef CONT
}

static int hex4(const unsigned char *p, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return NO;
    }
    *out = v;
    return OK;
}

static int reserve(Reader *r, Py_ssize_t need) {
    if (need <= r->cap)
        return OK;
    Py_ssize_t cap = r->cap ? r->cap : 256;
    while (cap < need)
        cap *= 2;
    char *grown = PyMem_Realloc(r->scratch, (size_t)cap);
    if (grown == NULL) {
        PyErr_NoMemory();
        return ERR;
    }
    r->scratch = grown;
    r->cap = cap;
    return OK;
}

/* Unescape the string whose text starts at ``start`` (the reader is at its first backslash) into scratch. */
static int unescape(Reader *r, const unsigned char *start, const char **text, Py_ssize_t *len, int *ascii) {
    Py_ssize_t n = r->p - start;
    TRY(reserve(r, n + 64));
    memcpy(r->scratch, start, (size_t)n);
    while (r->p < r->end) {
        unsigned char c = *r->p;
        TRY(reserve(r, n + 8));
        if (c == '"') {
            r->p++;
            *text = r->scratch;
            *len = n;
            return OK;
        }
        if (c < 0x20)
            return NO;
        if (c >= 0x80) {
            int k = utf8_length(r->p, r->end);
            if (k == 0)
                return NO;
            memcpy(r->scratch + n, r->p, (size_t)k);
            n += k;
            r->p += k;
            *ascii = 0;
            continue;
        }
        if (c != '\\') {
            r->scratch[n++] = (char)c;
            r->p++;
            continue;
        }
        if (r->end - r->p < 2)
            return NO;
        c = r->p[1];
        r->p += 2;
        switch (c) {
        case '"': case '\\': case '/':
            r->scratch[n++] = (char)c;
            continue;
        case 'b': r->scratch[n++] = '\b'; continue;
        case 'f': r->scratch[n++] = '\f'; continue;
        case 'n': r->scratch[n++] = '\n'; continue;
        case 'r': r->scratch[n++] = '\r'; continue;
        case 't': r->scratch[n++] = '\t'; continue;
        case 'u': break;
        default: return NO;
        }
        unsigned cp;
        if (r->end - r->p < 4 || hex4(r->p, &cp) != OK)
            return NO;
        r->p += 4;
        if (cp >= 0xDC00 && cp <= 0xDFFF)
            return NO; /* a low surrogate first */
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            unsigned low;
            if (r->end - r->p < 6 || r->p[0] != '\\' || r->p[1] != 'u' || hex4(r->p + 2, &low) != OK || low < 0xDC00 || low > 0xDFFF)
                return NO;
            r->p += 6;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
        }
        if (cp < 0x80) {
            r->scratch[n++] = (char)cp;
            continue;
        }
        *ascii = 0;
        if (cp < 0x800) {
            r->scratch[n++] = (char)(0xC0 | (cp >> 6));
        } else if (cp < 0x10000) {
            r->scratch[n++] = (char)(0xE0 | (cp >> 12));
            r->scratch[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        } else {
            r->scratch[n++] = (char)(0xF0 | (cp >> 18));
            r->scratch[n++] = (char)(0x80 | ((cp >> 12) & 0x3F));
            r->scratch[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        }
        r->scratch[n++] = (char)(0x80 | (cp & 0x3F));
    }
    return NO;
}

/* A string's UTF-8 text (the reader is at its opening quote): in the body, or in scratch when it had escapes. */
static int string_text(Reader *r, const char **text, Py_ssize_t *len, int *ascii) {
    if (r->p >= r->end || *r->p != '"')
        return NO;
    const unsigned char *start = ++r->p;
    *ascii = 1;
    while (r->p < r->end) {
        while (r->p < r->end && PLAIN[*r->p])
            r->p++;
        if (r->p == r->end)
            break;
        unsigned char c = *r->p;
        if (c == '"') {
            *text = (const char *)start;
            *len = r->p - start;
            r->p++;
            return OK;
        }
        if (c == '\\')
            return unescape(r, start, text, len, ascii);
        if (c < 0x20)
            return NO;
        if (c >= 0x80) {
            int k = utf8_length(r->p, r->end);
            if (k == 0)
                return NO;
            r->p += k;
            *ascii = 0;
        } else {
            r->p++;
        }
    }
    return NO;
}

static int string_object(Reader *r, PyObject **out) {
    const char *text;
    Py_ssize_t len;
    int ascii;
    TRY(string_text(r, &text, &len, &ascii));
    if (ascii) {
        *out = PyUnicode_New(len, 127);
        if (*out != NULL)
            memcpy(PyUnicode_DATA(*out), text, (size_t)len);
    } else {
        *out = PyUnicode_DecodeUTF8(text, len, NULL);
    }
    return *out == NULL ? ERR : OK;
}

/* Recent short ASCII strings of one BYTES ``data`` array (borrowed: the array being built holds them).
 * Categorical columns repeat a few levels: a repeat is the same str object again, not a new one, so
 * it costs no allocation, and its hash, computed once, is cached for the model's level lookups. */
#define TEXT_CACHE 64
#define TEXT_CACHE_MAX_LEN 48

static int string_object_cached(Reader *r, PyObject **out, PyObject **cache) {
    const char *text;
    Py_ssize_t len, k;
    int ascii;
    TRY(string_text(r, &text, &len, &ascii));
    if (!ascii || len > TEXT_CACHE_MAX_LEN) {
        *out = ascii ? PyUnicode_New(len, 127) : PyUnicode_DecodeUTF8(text, len, NULL);
        if (*out != NULL && ascii)
            memcpy(PyUnicode_DATA(*out), text, (size_t)len);
        return *out == NULL ? ERR : OK;
    }
    uint32_t h = (uint32_t)len;
    for (k = 0; k < len; k++)
        h = h * 31u + (unsigned char)text[k];
    PyObject **slot = &cache[(h ^ (h >> 7)) % TEXT_CACHE];
    if (*slot != NULL && PyUnicode_GET_LENGTH(*slot) == len && memcmp(PyUnicode_DATA(*slot), text, (size_t)len) == 0) {
        Py_INCREF(*slot);
        *out = *slot;
        return OK;
    }
    *out = PyUnicode_New(len, 127);
    if (*out == NULL)
        return ERR;
    memcpy(PyUnicode_DATA(*out), text, (size_t)len);
    *slot = *out;
    return OK;
}

/* Whether a key's text is the string literal ``name``. */
#define KEY_IS(text, len, name) ((len) == (Py_ssize_t)sizeof(name) - 1 && memcmp((text), (name), sizeof(name) - 1) == 0)

/* Powers of ten a double holds exactly (the fast path of Clinger's algorithm). */
static const double EXACT_POWERS[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                      1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* A JSON number: ``*is_int`` with its exact value in ``*iv`` (at most 18 digits), else a finite double in ``*dv``. */
static int number(Reader *r, int *is_int, int64_t *iv, double *dv) {
    const unsigned char *start = r->p, *p = r->p, *end = r->end, *run;
    int negative = 0, integral = 1;
    Py_ssize_t digits = 0, exponent = 0;
    /* Every digit, wrapping past 19 of them: it is read only when there are at most 18. */
    uint64_t mantissa = 0;
    if (p < end && *p == '-') {
        negative = 1;
        p++;
    }
    if (p < end && *p == '0') {
        p++;
        digits = 1;
    } else if (p < end && *p >= '1' && *p <= '9') {
        for (run = p; p < end && (unsigned)(*p - '0') < 10; p++)
            mantissa = mantissa * 10 + (uint64_t)(*p - '0');
        digits = p - run;
    } else {
        return NO;
    }
    if (p < end && *p == '.') {
        integral = 0;
        p++;
        for (run = p; p < end && (unsigned)(*p - '0') < 10; p++)
            mantissa = mantissa * 10 + (uint64_t)(*p - '0');
        if (p == run)
            return NO;
        digits += p - run;
        exponent -= p - run;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        int exp_negative = 0, written = 0;
        integral = 0;
        p++;
        if (p < end && (*p == '+' || *p == '-'))
            exp_negative = *p++ == '-';
        if (p >= end || *p < '0' || *p > '9')
            return NO;
        while (p < end && *p >= '0' && *p <= '9') {
            if (written < 10000)
                written = written * 10 + (*p - '0');
            p++;
        }
        exponent += exp_negative ? -written : written;
    }
    r->p = p;
    if (integral) {
        if (digits > MAX_INT_DIGITS)
            return NO; /* orjson reads these as unsigned 64-bit or as floats: leave them to it */
        *is_int = 1;
        *iv = negative ? -(int64_t)mantissa : (int64_t)mantissa;
        *dv = (double)*iv;
        return OK;
    }
    *is_int = 0;
    if (digits <= 15 && exponent >= -22 && exponent <= 22) {
        /* Both operands are exact doubles, so one correctly rounded operation gives the nearest double. */
        double d = (double)mantissa;
        d = exponent < 0 ? d / EXACT_POWERS[-exponent] : d * EXACT_POWERS[exponent];
        *dv = negative ? -d : d;
        return OK;
    }
    char buf[64];
    Py_ssize_t n = p - start;
    if (n >= (Py_ssize_t)sizeof(buf))
        return NO;
    memcpy(buf, start, (size_t)n);
    buf[n] = '\0';
    char *stop;
    double d = PyOS_string_to_double(buf, &stop, NULL);
    if (d == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return NO;
    }
    if (stop != buf + n || isinf(d))
        return NO; /* orjson refuses numbers that overflow a double */
    *dv = d;
    return OK;
}

static int value(Reader *r, int depth, PyObject **out);

static int array_value(Reader *r, int depth, PyObject **out) {
    PyObject *list = PyList_New(0);
    if (list == NULL)
        return ERR;
    r->p++;
    ws(r);
    if (r->p < r->end && *r->p == ']') {
        r->p++;
        *out = list;
        return OK;
    }
    for (;;) {
        PyObject *item;
        int status = value(r, depth + 1, &item);
        if (status == OK) {
            status = PyList_Append(list, item) < 0 ? ERR : OK;
            Py_DECREF(item);
        }
        if (status == OK) {
            status = next_or_close(r, ']');
            if (status == OK) {
                *out = list;
                return OK;
            }
        }
        if (status != MORE) {
            Py_DECREF(list);
            return status;
        }
    }
}

static int object_value(Reader *r, int depth, PyObject **out) {
    PyObject *dict = PyDict_New();
    if (dict == NULL)
        return ERR;
    r->p++;
    ws(r);
    if (r->p < r->end && *r->p == '}') {
        r->p++;
        *out = dict;
        return OK;
    }
    for (;;) {
        PyObject *key = NULL, *item = NULL;
        int status;
        ws(r);
        status = string_object(r, &key);
        if (status == OK)
            status = expect(r, ':');
        if (status == OK)
            status = value(r, depth + 1, &item);
        if (status == OK && PyDict_SetItem(dict, key, item) < 0) /* a repeated key: the last one, as orjson */
            status = ERR;
        Py_XDECREF(key);
        Py_XDECREF(item);
        if (status == OK) {
            status = next_or_close(r, '}');
            if (status == OK) {
                *out = dict;
                return OK;
            }
        }
        if (status != MORE) {
            Py_DECREF(dict);
            return status;
        }
    }
}

/* Any JSON value as the Python object orjson makes of it. */
static int value(Reader *r, int depth, PyObject **out) {
    if (depth > MAX_DEPTH)
        return NO;
    ws(r);
    if (r->p >= r->end)
        return NO;
    switch (*r->p) {
    case '{':
        return object_value(r, depth, out);
    case '[':
        return array_value(r, depth, out);
    case '"':
        return string_object(r, out);
    case 't':
        TRY(literal(r, "true", 4));
        *out = Py_NewRef(Py_True);
        return OK;
    case 'f':
        TRY(literal(r, "false", 5));
        *out = Py_NewRef(Py_False);
        return OK;
    case 'n':
        TRY(literal(r, "null", 4));
        *out = Py_NewRef(Py_None);
        return OK;
    default: {
        int is_int;
        int64_t iv;
        double dv;
        TRY(number(r, &is_int, &iv, &dv));
        *out = is_int ? PyLong_FromLongLong(iv) : PyFloat_FromDouble(dv);
        return *out == NULL ? ERR : OK;
    }
    }
}

/* Skip a value (read and dropped: members nobody reads are rare). */
static int skip(Reader *r) {
    PyObject *ignored;
    TRY(value(r, 1, &ignored));
    Py_DECREF(ignored);
    return OK;
}

/* The end of the body: whitespace only. */
static int at_end(Reader *r) {
    ws(r);
    return r->p == r->end ? OK : NO;
}

/* ---- growing buffers of column values ---------------------------------------------------------- */
/* One value of a column: a double, an int64 (booleans too) or a str (a new reference). */
typedef union {
    double d;
    int64_t i;
    PyObject *o;
} Item;

typedef struct {
    Item *data;
    Py_ssize_t n, cap;
} Vec;

static int vec_grow(Vec *v) {
    {
        Py_ssize_t cap = v->cap ? v->cap * 2 : 64;
        Item *grown = PyMem_Realloc(v->data, (size_t)cap * sizeof(Item));
        if (grown == NULL) {
            PyErr_NoMemory();
            return ERR;
        }
        v->data = grown;
        v->cap = cap;
    }
    return OK;
}

static inline int vec_push(Vec *v, Item item) {
    if (v->n == v->cap && vec_grow(v) != OK)
        return ERR;
    v->data[v->n++] = item;
    return OK;
}

/* ---- BASIC InferenceRequest: schema + datum ------------------------------------------------------ */

/* The ForestFlow types read here: name, its tensor key in a datum, numpy type, and how values are read. */
enum { READ_TEXT, READ_FLOAT, READ_INT, READ_BOOL };
typedef struct {
    const char *name;
    size_t length;
    int typenum, read;
    int64_t low, high;
} FFType;

static const FFType FF_TYPES[] = {
    {"String", 6, ND_OBJECT, READ_TEXT, 0, 0},
    {"Float64", 7, ND_FLOAT64, READ_FLOAT, 0, 0},
    {"Float32", 7, ND_FLOAT32, READ_FLOAT, 0, 0},
    {"Int64", 5, ND_INT64, READ_INT, INT64_MIN, INT64_MAX},
    {"Int32", 5, ND_INT32, READ_INT, INT32_MIN, INT32_MAX},
    {"Int16", 5, ND_INT16, READ_INT, INT16_MIN, INT16_MAX},
    {"Int8", 4, ND_INT8, READ_INT, INT8_MIN, INT8_MAX},
    {"Bool", 4, ND_BOOL, READ_BOOL, 0, 0},
};
#define N_FF_TYPES (sizeof(FF_TYPES) / sizeof(FF_TYPES[0]))

typedef struct {
    const FFType *type;
    Py_ssize_t width;
    Vec values; /* PyObject* (new references), double, or int64 */
} Group;

/* One value of a group into its buffer; what the Python conversion would refuse or treat apart declines. */
static int group_value(Reader *r, Group *g) {
    ws(r);
    if (r->p >= r->end)
        return NO;
    unsigned char c = *r->p;
    switch (g->type->read) {
    case READ_TEXT: {
        PyObject *text;
        if (c == 'n') {
            TRY(literal(r, "null", 4)); /* a missing value (NA) */
            text = Py_NewRef(Py_None);
        } else {
            TRY(string_object(r, &text));
        }
        if (vec_push(&g->values, (Item){.o = text}) != OK) {
            Py_DECREF(text);
            return ERR;
        }
        return OK;
    }
    case READ_BOOL: {
        int64_t flag;
        if (c == 't') {
            TRY(literal(r, "true", 4));
            flag = 1;
        } else {
            TRY(literal(r, "false", 5));
            flag = 0;
        }
        return vec_push(&g->values, (Item){.i = flag});
    }
    default: {
        int is_int;
        int64_t iv;
        double dv;
        if (c == 'n' && g->type->read == READ_FLOAT) {
            TRY(literal(r, "null", 4)); /* a missing value (NA) */
            return vec_push(&g->values, (Item){.d = NAN});
        }
        TRY(number(r, &is_int, &iv, &dv));
        if (g->type->read == READ_INT) {
            if (!is_int || iv < g->type->low || iv > g->type->high)
                return NO;
            return vec_push(&g->values, (Item){.i = iv});
        }
        if (g->type->typenum == ND_FLOAT32) {
            if (is_int && (iv > (1LL << 53) || iv < -(1LL << 53)))
                return NO; /* numpy might round such an integer once, not twice */
            if (fabs(dv) > 3.4028234663852886e38)
                return NO;
        }
        return vec_push(&g->values, (Item){.d = dv});
    }
    }
}

/* ``{"<Key>": {"data": [width values], ...}}``: one tensor of a record. */
static int datum_tensor(Reader *r, Group *g) {
    const char *text;
    Py_ssize_t len;
    int ascii, seen = 0;
    TRY(expect(r, '{'));
    ws(r);
    TRY(string_text(r, &text, &len, &ascii));
    if ((size_t)len != g->type->length || memcmp(text, g->type->name, (size_t)len) != 0)
        return NO;
    TRY(expect(r, ':'));
    TRY(expect(r, '{'));
    for (;;) {
        ws(r);
        TRY(string_text(r, &text, &len, &ascii));
        TRY(expect(r, ':'));
        if (KEY_IS(text, len, "data")) {
            if (seen++)
                return NO;
            TRY(expect(r, '['));
            for (Py_ssize_t i = 0; i < g->width; i++) {
                if (i > 0)
                    TRY(expect(r, ','));
                TRY(group_value(r, g));
            }
            TRY(expect(r, ']'));
        } else {
            TRY(skip(r));
        }
        int more = next_or_close(r, '}');
        if (more == NO)
            return NO;
        if (more == OK)
            break;
    }
    if (!seen)
        return NO;
    return expect(r, '}'); /* one type key only */
}

/* ``{"tensors": [one tensor per group, in schema order], ...}``: one record. */
static int datum_record(Reader *r, Group *groups, Py_ssize_t n_groups) {
    const char *text;
    Py_ssize_t len;
    int ascii, seen = 0;
    TRY(expect(r, '{'));
    for (;;) {
        ws(r);
        TRY(string_text(r, &text, &len, &ascii));
        TRY(expect(r, ':'));
        if (KEY_IS(text, len, "tensors")) {
            if (seen++)
                return NO;
            TRY(expect(r, '['));
            for (Py_ssize_t g = 0; g < n_groups; g++) {
                if (g > 0)
                    TRY(expect(r, ','));
                TRY(datum_tensor(r, &groups[g]));
            }
            TRY(expect(r, ']'));
        } else {
            TRY(skip(r));
        }
        int more = next_or_close(r, '}');
        if (more == NO)
            return NO;
        if (more == OK)
            return seen ? OK : NO;
    }
}

/* The schema (already a Python list) as groups; anything but distinct known types with distinct field names declines. */
static int schema_groups(PyObject *schema, Group **out, Py_ssize_t *n_out, PyObject **fields_out) {
    if (!PyList_Check(schema) || PyList_GET_SIZE(schema) == 0)
        return NO;
    Py_ssize_t n = PyList_GET_SIZE(schema);
    Group *groups = PyMem_Calloc((size_t)n, sizeof(Group));
    PyObject *names = PySet_New(NULL), *fields_list = PyList_New(n);
    int status = OK;
    if (groups == NULL || names == NULL || fields_list == NULL) {
        if (groups == NULL)
            PyErr_NoMemory();
        status = ERR;
    }
    for (Py_ssize_t i = 0; status == OK && i < n; i++) {
        PyObject *entry = PyList_GET_ITEM(schema, i), *type, *fields;
        if (!PyDict_Check(entry) || (type = PyDict_GetItemString(entry, "type")) == NULL || !PyUnicode_Check(type) ||
            (fields = PyDict_GetItemString(entry, "fields")) == NULL || !PyList_Check(fields) || PyList_GET_SIZE(fields) == 0) {
            status = NO;
            break;
        }
        Py_ssize_t name_len;
        const char *name = PyUnicode_AsUTF8AndSize(type, &name_len);
        if (name == NULL) {
            PyErr_Clear();
            status = NO;
            break;
        }
        /* by length and bytes: a name with a NUL inside ("Float64\0junk") is not "Float64" */
        for (size_t t = 0; t < N_FF_TYPES; t++)
            if ((size_t)name_len == FF_TYPES[t].length && memcmp(name, FF_TYPES[t].name, FF_TYPES[t].length) == 0)
                groups[i].type = &FF_TYPES[t];
        for (Py_ssize_t j = 0; j < i && groups[i].type != NULL; j++)
            if (groups[j].type == groups[i].type)
                groups[i].type = NULL; /* a second entry of one type */
        if (groups[i].type == NULL) {
            status = NO;
            break;
        }
        groups[i].width = PyList_GET_SIZE(fields);
        for (Py_ssize_t j = 0; status == OK && j < groups[i].width; j++) {
            PyObject *field = PyList_GET_ITEM(fields, j);
            int dupe = PyUnicode_Check(field) ? PySet_Contains(names, field) : 1;
            if (dupe < 0 || (dupe == 0 && PySet_Add(names, field) < 0))
                status = ERR;
            else if (dupe)
                status = NO;
        }
        Py_INCREF(fields);
        PyList_SET_ITEM(fields_list, i, fields);
    }
    Py_XDECREF(names);
    if (status != OK) {
        PyMem_Free(groups);
        Py_XDECREF(fields_list);
        return status;
    }
    *out = groups;
    *n_out = n;
    *fields_out = fields_list;
    return OK;
}

static void free_groups(Group *groups, Py_ssize_t n) {
    for (Py_ssize_t g = 0; groups != NULL && g < n; g++) {
        if (groups[g].type->read == READ_TEXT)
            for (Py_ssize_t i = 0; i < groups[g].values.n; i++)
                Py_DECREF(groups[g].values.data[i].o);
        PyMem_Free(groups[g].values.data);
    }
    PyMem_Free(groups);
}

#if LONG_MAX == INT64_MAX
#define ND_UINT64 ND_ULONG
#else
#define ND_UINT64 ND_ULONGLONG
#endif

/* Field ``j`` of a group as a 1-D array of ``rows`` values (String columns take new references). */
static PyObject *field_column(const Group *g, Py_ssize_t j, Py_ssize_t rows) {
    PyObject *column = nd_new(g->type->typenum, rows);
    if (column == NULL)
        return NULL;
    char *out = nd_data(column);
    const Item *values = g->values.data + j;
    Py_ssize_t step = g->width;
#define FILL(ctype, expr)                               \
    for (Py_ssize_t i = 0; i < rows; i++) {             \
        const Item *v = values + i * step;              \
        ((ctype *)out)[i] = (ctype)(expr);              \
    }                                                   \
    break
    switch (g->type->typenum) {
    case ND_OBJECT: {
        PyObject **slots = (PyObject **)out;
        for (Py_ssize_t i = 0; i < rows; i++) {
            Py_XDECREF(slots[i]);
            slots[i] = Py_NewRef(values[i * step].o);
        }
        break;
    }
    case ND_FLOAT64: FILL(double, v->d);
    case ND_FLOAT32: FILL(float, v->d);
    case ND_INT64: FILL(int64_t, v->i);
    case ND_INT32: FILL(int32_t, v->i);
    case ND_INT16: FILL(int16_t, v->i);
    case ND_INT8: FILL(int8_t, v->i);
    case ND_UINT64: FILL(uint64_t, v->i);
    case ND_UINT: FILL(uint32_t, v->i);
    case ND_USHORT: FILL(uint16_t, v->i);
    case ND_UBYTE: FILL(uint8_t, v->i);
    default: FILL(unsigned char, v->i != 0);
    }
#undef FILL
    return column;
}

/* An object member's name, read up to and through its ':' (the caller has read past the '{' or ','). */
static int member_name(Reader *r, const char **name, Py_ssize_t *len) {
    int ascii;
    ws(r);
    int status = string_text(r, name, len, &ascii);
    return status == OK ? expect(r, ':') : status;
}

static int score_body(Reader *r, PyObject **result) {
    PyObject *schema = NULL, *fields = NULL, *configs = NULL, *columns = NULL;
    Group *groups = NULL;
    Py_ssize_t n_groups = 0, rows = 0;
    int status, datum_seen = 0;
    const char *text;
    Py_ssize_t len;
    status = expect(r, '{');
    while (status == OK) {
        status = member_name(r, &text, &len);
        if (status != OK)
            break;
        if (KEY_IS(text, len, "schema")) {
            if (schema != NULL) {
                status = NO;
                break;
            }
            status = value(r, 1, &schema);
            if (status == OK)
                status = schema_groups(schema, &groups, &n_groups, &fields);
        } else if (KEY_IS(text, len, "datum")) {
            if (groups == NULL || datum_seen++) { /* the schema must come first */
                status = NO;
                break;
            }
            status = expect(r, '[');
            ws(r);
            if (status == OK && r->p < r->end && *r->p == ']')
                status = NO; /* no record */
            while (status == OK) {
                status = datum_record(r, groups, n_groups);
                rows++;
                if (status == OK) {
                    int step = next_or_close(r, ']');
                    if (step == OK)
                        break;
                    status = step == MORE ? OK : step;
                }
            }
        } else if (KEY_IS(text, len, "configs")) {
            if (configs != NULL) {
                status = NO;
                break;
            }
            status = value(r, 1, &configs);
            if (status == OK && configs != Py_None) {
                PyObject *key, *item;
                Py_ssize_t pos = 0;
                if (!PyDict_Check(configs))
                    status = NO;
                while (status == OK && PyDict_Next(configs, &pos, &key, &item))
                    if (!PyUnicode_Check(item))
                        status = NO;
            }
        } else {
            status = skip(r);
        }
        if (status == OK) {
            int step = next_or_close(r, '}');
            if (step == OK)
                break;
            status = step == MORE ? OK : step;
        }
    }
    if (status == OK) {
        status = at_end(r);
        if (status == OK && !datum_seen)
            status = NO;
    }
    if (status == OK && (columns = PyDict_New()) == NULL)
        status = ERR;
    for (Py_ssize_t g = 0; status == OK && g < n_groups; g++) {
        PyObject *names = PyList_GET_ITEM(fields, g);
        for (Py_ssize_t j = 0; status == OK && j < groups[g].width; j++) {
            PyObject *column = field_column(&groups[g], j, rows);
            if (column == NULL || PyDict_SetItem(columns, PyList_GET_ITEM(names, j), column) < 0)
                status = ERR;
            Py_XDECREF(column);
        }
    }
    if (status == OK) {
        *result = Py_BuildValue("(NO)", columns, configs != NULL ? configs : Py_None);
        columns = NULL;
        if (*result == NULL)
            status = ERR;
    }
    free_groups(groups, n_groups);
    Py_XDECREF(schema);
    Py_XDECREF(fields);
    Py_XDECREF(configs);
    Py_XDECREF(columns);
    return status;
}

PyDoc_STRVAR(score_request_doc,
             "score_request(body, /)\n--\n\n"
             "A BASIC InferenceRequest JSON body as ``(columns, configs)``: one 1-D array per schema field, in\n"
             "schema order, typed as the Python conversion types it; configs as given (None when absent). None when the\n"
             "body is not the regular shape (schema before datum, each record's tensors in schema order, types\n"
             "String, Float64, Float32, Int8-64 or Bool with values they take, field names distinct).");

static PyObject *finish(Reader *r, int status, PyObject *result) {
    PyMem_Free(r->scratch);
    if (status == ERR)
        return NULL;
    if (status != OK)
        Py_RETURN_NONE;
    return result;
}

/* A body read from any bytes-like object by one of the readers above, as finish() answers it. */
static PyObject *parsed(PyObject *arg, int (*read_body)(Reader *, PyObject **)) {
    Py_buffer view;
    PyObject *result = NULL;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    Reader r = {(const unsigned char *)view.buf, (const unsigned char *)view.buf + view.len, NULL, 0};
    int status = read_body(&r, &result);
    PyBuffer_Release(&view);
    return finish(&r, status, result);
}

static PyObject *score_request(PyObject *self, PyObject *arg) {
    (void)self;
    return parsed(arg, score_body);
}

/* ---- V2 inference request -------------------------------------------------------------------------- */

/* What one element of a flat ``data`` array is. */
enum { EL_NUMBER = 1, EL_FLOAT = 2, EL_NULL = 4, EL_BOOL = 8, EL_TEXT = 16 };

/*
 * A flat ``data`` array as the array ``np.array(data)`` makes of it (BYTES: the object array of its
 * strings), for the kinds where they agree: all numbers (int64, or float64 when one is not an
 * integer; nulls as NaN in FP data), all booleans, all strings for BYTES. NO otherwise.
 */
static int typed_data_of(Reader *r, const char *dt, Py_ssize_t dt_len, PyObject **out);

static int typed_data(Reader *r, PyObject *datatype, PyObject **out) {
    Py_ssize_t dt_len;
    const char *dt = PyUnicode_AsUTF8AndSize(datatype, &dt_len);
    if (dt == NULL)
        return ERR;
    return typed_data_of(r, dt, dt_len, out);
}

static int typed_data_of(Reader *r, const char *dt, Py_ssize_t dt_len, PyObject **out) {
    int text = dt_len == 5 && memcmp(dt, "BYTES", 5) == 0, fp = dt_len >= 2 && dt[0] == 'F' && dt[1] == 'P';
    int seen = 0;
    Vec values = {NULL, 0, 0}, ints = {NULL, 0, 0};
    PyObject *cache[TEXT_CACHE] = {NULL};
    int status = OK;
    r->p++;
    ws(r);
    if (r->p < r->end && *r->p == ']') {
        r->p++;
        seen = EL_FLOAT; /* np.array([]) is float64 */
    } else {
        for (;;) {
            ws(r);
            if (r->p >= r->end) {
                status = NO;
                break;
            }
            unsigned char c = *r->p;
            if (text) {
                PyObject *item;
                status = c == '"' ? string_object_cached(r, &item, cache) : NO;
                if (status == OK && vec_push(&values, (Item){.o = item}) != OK) {
                    Py_DECREF(item);
                    status = ERR;
                }
                seen |= EL_TEXT;
            } else if (c == 't' || c == 'f') {
                int64_t flag = c == 't';
                status = literal(r, flag ? "true" : "false", flag ? 4 : 5);
                if (status == OK)
                    status = vec_push(&ints, (Item){.i = flag});
                seen |= EL_BOOL;
            } else if (c == 'n') {
                status = fp ? literal(r, "null", 4) : NO;
                if (status == OK)
                    status = vec_push(&values, (Item){.d = NAN});
                seen |= EL_NULL;
            } else {
                int is_int;
                int64_t iv;
                double dv;
                status = number(r, &is_int, &iv, &dv);
                if (status == OK)
                    status = vec_push(&values, (Item){.d = dv});
                if (status == OK)
                    status = vec_push(&ints, (Item){.i = iv});
                seen |= is_int ? EL_NUMBER : EL_NUMBER | EL_FLOAT;
            }
            if (status == OK && (seen & EL_BOOL) && seen != EL_BOOL)
                status = NO; /* booleans among other values: numpy's rules */
            if (status != OK)
                break;
            status = next_or_close(r, ']');
            if (status == MORE) {
                status = OK;
                continue;
            }
            break;
        }
    }
    if (status == OK) {
        Py_ssize_t n = text ? values.n : seen == EL_BOOL ? ints.n : values.n;
        int typenum = text ? ND_OBJECT : seen == EL_BOOL ? ND_BOOL : (seen & (EL_FLOAT | EL_NULL)) ? ND_FLOAT64 : ND_INT64;
        *out = nd_new(typenum, n);
        if (*out == NULL) {
            status = ERR;
        } else if (typenum == ND_OBJECT) {
            PyObject **slots = (PyObject **)nd_data(*out);
            for (Py_ssize_t i = 0; i < n; i++) {
                Py_XDECREF(slots[i]);
                slots[i] = values.data[i].o;
            }
            values.n = 0;
        } else if (typenum == ND_BOOL) {
            for (Py_ssize_t i = 0; i < n; i++)
                ((unsigned char *)nd_data(*out))[i] = ints.data[i].i != 0;
        } else if (n > 0) {
            char *bytes = nd_data(*out);
            for (Py_ssize_t i = 0; i < n; i++)
                if (typenum == ND_INT64)
                    ((int64_t *)bytes)[i] = ints.data[i].i;
                else
                    ((double *)bytes)[i] = values.data[i].d;
        }
    }
    if (text)
        for (Py_ssize_t i = 0; i < values.n; i++)
            Py_DECREF(values.data[i].o);
    PyMem_Free(values.data);
    PyMem_Free(ints.data);
    return status;
}

/* One element of ``inputs``: an object read as ``value`` would, but a flat ``data`` after the datatype comes typed. */
static int input_object(Reader *r, PyObject **out) {
    ws(r);
    if (r->p >= r->end || *r->p != '{')
        return value(r, 2, out);
    PyObject *dict = PyDict_New(), *datatype = NULL;
    int typed = 0;
    if (dict == NULL)
        return ERR;
    r->p++;
    ws(r);
    int status = OK;
    if (r->p < r->end && *r->p == '}') {
        r->p++;
        *out = dict;
        return OK;
    }
    while (status == OK) {
        PyObject *key = NULL, *item = NULL;
        ws(r);
        status = string_object(r, &key);
        if (status == OK)
            status = expect(r, ':');
        if (status == OK) {
            ws(r);
            int is_data = PyUnicode_CompareWithASCIIString(key, "data") == 0;
            if (is_data && datatype != NULL && r->p < r->end && *r->p == '[') {
                const unsigned char *start = r->p;
                status = typed_data(r, datatype, &item);
                if (status == NO) { /* not a flat array of one kind: the lists orjson would make */
                    r->p = start;
                    status = value(r, 3, &item);
                } else if (status == OK) {
                    typed = 1;
                }
            } else {
                status = value(r, 3, &item);
            }
            if (status == OK && PyUnicode_CompareWithASCIIString(key, "datatype") == 0) {
                if (typed || datatype != NULL || !PyUnicode_Check(item))
                    status = NO; /* a datatype after typed data, or twice: leave it to orjson's last-wins */
                else
                    datatype = Py_NewRef(item);
            }
        }
        if (status == OK && PyDict_SetItem(dict, key, item) < 0)
            status = ERR;
        Py_XDECREF(key);
        Py_XDECREF(item);
        if (status == OK) {
            int step = next_or_close(r, '}');
            if (step == OK)
                break;
            status = step == MORE ? OK : step;
        }
    }
    Py_XDECREF(datatype);
    if (status != OK) {
        Py_DECREF(dict);
        return status;
    }
    *out = dict;
    return OK;
}

static int v2_body(Reader *r, PyObject **result) {
    PyObject *doc = PyDict_New();
    int status = doc == NULL ? ERR : expect(r, '{'), done = 0;
    ws(r);
    if (status == OK && r->p < r->end && *r->p == '}') {
        r->p++;
        done = 1;
    }
    while (status == OK && !done) {
        PyObject *key = NULL, *item = NULL;
        ws(r);
        status = string_object(r, &key);
        if (status == OK)
            status = expect(r, ':');
        if (status == OK) {
            ws(r);
            if (PyUnicode_CompareWithASCIIString(key, "inputs") == 0 && r->p < r->end && *r->p == '[') {
                item = PyList_New(0);
                status = item == NULL ? ERR : OK;
                r->p++;
                ws(r);
                if (status == OK && r->p < r->end && *r->p == ']') {
                    r->p++;
                } else {
                    while (status == OK) {
                        PyObject *element;
                        status = input_object(r, &element);
                        if (status == OK) {
                            status = PyList_Append(item, element) < 0 ? ERR : OK;
                            Py_DECREF(element);
                        }
                        if (status == OK) {
                            int step = next_or_close(r, ']');
                            if (step == OK)
                                break;
                            status = step == MORE ? OK : step;
                        }
                    }
                }
            } else {
                status = value(r, 1, &item);
            }
        }
        if (status == OK && PyDict_SetItem(doc, key, item) < 0)
            status = ERR;
        Py_XDECREF(key);
        Py_XDECREF(item);
        if (status == OK) {
            int step = next_or_close(r, '}');
            if (step == OK)
                break;
            status = step == MORE ? OK : step;
        }
    }
    if (status == OK)
        status = at_end(r);
    if (status != OK) {
        Py_XDECREF(doc);
        return status;
    }
    *result = doc;
    return OK;
}

PyDoc_STRVAR(v2_request_doc,
             "v2_request(body, /)\n--\n\n"
             "A V2 inference request JSON object as orjson.loads reads it, except that a flat ``data`` array of an\n"
             "input (after its ``datatype``) is already the 1-D array numpy makes of it: int64, float64 (null as\n"
             "NaN in FP data), bool, or for BYTES an object array of str. None when the body is anything else or\n"
             "orjson might read it differently (the caller then parses it with orjson).");

static PyObject *v2_request(PyObject *self, PyObject *arg) {
    (void)self;
    return parsed(arg, v2_body);
}

/* ---- V2 inference request, the plain tabular case: straight to columns ------------------------------ */

/*
 * One input of a plain request: an object of exactly ``name`` (a non-empty string), ``datatype``
 * (FP64 or BYTES), ``shape`` (``[n]``) and ``data`` (a flat array after the datatype, of n numbers
 * with one not an integer or null, or of n strings), in any order. Its column goes into ``columns``
 * under its name (NO for a name seen before); ``*rows`` is n (NO when an earlier input had another).
 */
static int plain_input(Reader *r, PyObject *columns, Py_ssize_t *rows) {
    PyObject *name = NULL, *data = NULL;
    int status = expect(r, '{'), fp = -1, have_shape = 0, more = 0;
    int64_t n = -1;
    while (status == OK) {
        const char *key;
        Py_ssize_t key_len;
        status = member_name(r, &key, &key_len);
        if (status != OK)
            break;
        ws(r);
        if (KEY_IS(key, key_len, "name") && name == NULL) {
            status = string_object(r, &name);
            if (status == OK && PyUnicode_GET_LENGTH(name) == 0)
                status = NO;
        } else if (KEY_IS(key, key_len, "datatype") && fp < 0) {
            const char *dt;
            Py_ssize_t dt_len;
            int ascii;
            status = string_text(r, &dt, &dt_len, &ascii);
            if (status == OK)
                fp = KEY_IS(dt, dt_len, "FP64") ? 1 : KEY_IS(dt, dt_len, "BYTES") ? 0 : -1;
            if (status == OK && fp < 0)
                status = NO;
        } else if (KEY_IS(key, key_len, "shape") && !have_shape) {
            int is_int;
            double ignored;
            have_shape = 1;
            status = expect(r, '[');
            if (status == OK) {
                ws(r);
                status = number(r, &is_int, &n, &ignored);
            }
            if (status == OK && (!is_int || n < 0))
                status = NO;
            if (status == OK)
                status = expect(r, ']');
        } else if (KEY_IS(key, key_len, "data") && data == NULL && fp >= 0 && r->p < r->end && *r->p == '[') {
            status = typed_data_of(r, fp ? "FP64" : "BYTES", fp ? 4 : 5, &data);
            if (status == OK && fp && nd_type_num(data) != ND_FLOAT64)
                status = NO; /* integers only, or booleans: converted (or refused) in Python */
        } else {
            status = NO; /* another member, one twice, or data before its datatype */
        }
        if (status == OK) {
            more = next_or_close(r, '}');
            if (more == OK)
                break;
            status = more == MORE ? OK : more;
        }
    }
    if (status == OK && (name == NULL || data == NULL || !have_shape || nd_size(data) != n))
        status = NO;
    if (status == OK && *rows >= 0 && n != *rows)
        status = NO; /* inputs of different row counts: the Python path says which */
    if (status == OK) {
        int known = PyDict_Contains(columns, name);
        status = known < 0 ? ERR : known ? NO : PyDict_SetItem(columns, name, data) < 0 ? ERR : OK;
    }
    if (status == OK)
        *rows = (Py_ssize_t)n;
    Py_XDECREF(name);
    Py_XDECREF(data);
    return status;
}

/* The members of a plain request's top object: `parameters` (an object) and `id`, each at most once, into
 * *parameters and *id; every other member's name to `member`, which reads its value (OK, NO or ERR). OK when the
 * object closed and nothing but whitespace follows it. */
typedef int (*RequestMember)(Reader *r, const char *key, Py_ssize_t key_len, void *state);

static int request_object(Reader *r, RequestMember member, void *state, PyObject **parameters, PyObject **id) {
    int status = expect(r, '{'), step;
    while (status == OK) {
        const char *key;
        Py_ssize_t key_len;
        status = member_name(r, &key, &key_len);
        if (status != OK)
            break;
        ws(r);
        if (KEY_IS(key, key_len, "parameters"))
            status = *parameters == NULL && r->p < r->end && *r->p == '{' ? value(r, 1, parameters) : NO;
        else if (KEY_IS(key, key_len, "id"))
            status = *id == NULL ? value(r, 1, id) : NO;
        else
            status = member(r, key, key_len, state);
        if (status == OK) {
            step = next_or_close(r, '}');
            if (step == OK)
                break;
            status = step == MORE ? OK : step;
        }
    }
    return status == OK ? at_end(r) : status;
}

typedef struct {
    PyObject *columns; /* name -> 1-D array, once `inputs` was read */
    Py_ssize_t rows;
} ColumnsRequest;

/* `inputs` of a plain pd request, once; any other member (outputs, ...) leaves the request to the general reader. */
static int columns_member(Reader *r, const char *key, Py_ssize_t key_len, void *state) {
    ColumnsRequest *q = state;
    int status, step;
    if (!KEY_IS(key, key_len, "inputs") || q->columns != NULL)
        return NO;
    q->columns = PyDict_New();
    status = q->columns == NULL ? ERR : expect(r, '[');
    while (status == OK) {
        status = plain_input(r, q->columns, &q->rows);
        if (status == OK) {
            step = next_or_close(r, ']');
            if (step == OK)
                break;
            status = step == MORE ? OK : step;
        }
    }
    return status;
}

static int v2_columns_body(Reader *r, PyObject **result) {
    PyObject *parameters = NULL, *id = NULL;
    ColumnsRequest q = {NULL, -1};
    int status = request_object(r, columns_member, &q, &parameters, &id);
    if (status == OK && q.columns == NULL)
        status = NO;
    if (status == OK) {
        *result = PyTuple_Pack(3, q.columns, parameters ? parameters : Py_None, id ? id : Py_None);
        status = *result == NULL ? ERR : OK;
    }
    Py_XDECREF(q.columns);
    Py_XDECREF(parameters);
    Py_XDECREF(id);
    return status;
}

PyDoc_STRVAR(v2_columns_doc,
             "v2_columns(body, /)\n--\n\n"
             "A plain V2 inference request JSON as ``(columns, parameters, id)``: ``columns`` maps each input's\n"
             "name to its 1-D array, in input order (FP64: float64; BYTES: an object array of str), ``parameters``\n"
             "the request's parameters object (None when absent) and ``id`` its id as orjson reads it (None when\n"
             "absent). Plain: members ``inputs`` (at least one) and optionally ``parameters`` (an object) and\n"
             "``id``, each once; every input exactly ``name`` (non-empty), ``datatype`` FP64 or BYTES, ``shape``\n"
             "``[n]`` and a flat ``data`` of n values after the datatype (FP64: numbers, one of them not an\n"
             "integer, or nulls), names distinct, every n the same. None for anything else (no exception).");

static PyObject *v2_columns(PyObject *self, PyObject *arg) {
    (void)self;
    return parsed(arg, v2_columns_body);
}

/* ---- V2 inference request, one numeric [N, F] tensor (the np layout): straight to its F columns ---- */

/* The datatypes the np reader takes: name, numpy type, how values are read, integer range. */
static const FFType NP_TYPES[] = {
    {"FP32", 4, ND_FLOAT32, READ_FLOAT, 0, 0},
    {"FP64", 4, ND_FLOAT64, READ_FLOAT, 0, 0},
    {"INT64", 5, ND_INT64, READ_INT, INT64_MIN, INT64_MAX},
    {"INT32", 5, ND_INT32, READ_INT, INT32_MIN, INT32_MAX},
    {"INT16", 5, ND_INT16, READ_INT, INT16_MIN, INT16_MAX},
    {"INT8", 4, ND_INT8, READ_INT, INT8_MIN, INT8_MAX},
    {"UINT64", 6, ND_UINT64, READ_INT, 0, INT64_MAX},
    {"UINT32", 6, ND_UINT, READ_INT, 0, UINT32_MAX},
    {"UINT16", 6, ND_USHORT, READ_INT, 0, UINT16_MAX},
    {"UINT8", 5, ND_UBYTE, READ_INT, 0, UINT8_MAX},
    {"BOOL", 4, ND_BOOL, READ_BOOL, 0, 0},
};
#define N_NP_TYPES (sizeof(NP_TYPES) / sizeof(NP_TYPES[0]))

/* The values of a ``data`` array, row-major, as doubles (null as NaN, booleans as 0 and 1), and what
 * kinds were seen (EL_*). Integers are exact in a double: one past 2^53 is declined. */
typedef struct {
    Vec values;
    int seen;
} NpValues;

#define EXACT_INT (INT64_C(1) << 53)

/* One scalar of a ``data`` array: a number, null, true or false (NO for anything else). */
static int np_scalar(Reader *r, NpValues *v) {
    ws(r);
    if (r->p >= r->end)
        return NO;
    unsigned char c = *r->p;
    double d;
    if (c == 't' || c == 'f') {
        TRY(c == 't' ? literal(r, "true", 4) : literal(r, "false", 5));
        v->seen |= EL_BOOL;
        d = c == 't';
    } else if (c == 'n') {
        TRY(literal(r, "null", 4));
        v->seen |= EL_NULL;
        d = NAN;
    } else {
        int is_int;
        int64_t iv;
        TRY(number(r, &is_int, &iv, &d));
        if (is_int && (iv > EXACT_INT || iv < -EXACT_INT))
            return NO;
        v->seen |= is_int ? EL_NUMBER : EL_NUMBER | EL_FLOAT;
    }
    if (v->values.n == v->values.cap && vec_grow(&v->values) != OK)
        return ERR;
    v->values.data[v->values.n++].d = d;
    return OK;
}

/*
 * ``data`` (the reader at its '['): flat scalars, or rows of scalars all of one non-zero length (what
 * np.array makes a 2-D array of). Anything else (deeper nesting, ragged or empty rows, booleans among
 * other values) is NO: numpy's rules for those are the general path's.
 */
static int np_data(Reader *r, NpValues *v) {
    r->p++;
    ws(r);
    if (r->p >= r->end || *r->p == ']')
        return NO;
    int nested = *r->p == '[';
    Py_ssize_t width = -1;
    for (;;) {
        if (nested) {
            TRY(expect(r, '['));
            Py_ssize_t before = v->values.n;
            for (;;) {
                TRY(np_scalar(r, v));
                int step = next_or_close(r, ']');
                if (step == OK)
                    break;
                if (step != MORE)
                    return step;
            }
            if (width >= 0 && v->values.n - before != width)
                return NO;
            width = v->values.n - before;
        } else {
            TRY(np_scalar(r, v));
        }
        int step = next_or_close(r, ']');
        if (step == OK)
            break;
        if (step != MORE)
            return step;
    }
    return (v->seen & EL_BOOL) && v->seen != EL_BOOL ? NO : OK;
}

/*
 * The F columns of a ``rows`` x F tensor of ``type`` from its values, converted as numpy converts the
 * array ``np.array(data)`` (int64 when every value is an integer, else float64: the same doubles
 * here, integers being exact in them) to the datatype; NO when that conversion is refused or not
 * this exact one (a fraction, null or a value out of range for an integer type, a finite value past
 * FP32's range, numbers for BOOL, booleans for numbers).
 */
static int np_columns(const FFType *type, NpValues *v, Py_ssize_t rows, Py_ssize_t width, PyObject **out) {
    if (type->read == READ_BOOL ? v->seen != EL_BOOL : (v->seen & EL_BOOL) != 0)
        return NO;
    if (type->read == READ_INT && (v->seen & (EL_FLOAT | EL_NULL)))
        return NO;
    for (Py_ssize_t k = 0; k < v->values.n; k++) { /* each value as field_column reads it */
        Item *item = &v->values.data[k];
        if (type->read == READ_INT) {
            if (item->d < (double)type->low || item->d > (double)type->high)
                return NO;
            item->i = (int64_t)item->d;
        } else if (type->read == READ_BOOL) {
            item->i = item->d != 0;
        } else if (type->typenum == ND_FLOAT32 && fabs(item->d) >= 0x1.ffffffp127) {
            return NO; /* rounds to infinity in FP32, which numbers_as refuses for a finite value */
        }
    }
    Group values = {type, width, v->values};
    PyObject *columns = PyTuple_New(width);
    if (columns == NULL)
        return ERR;
    for (Py_ssize_t j = 0; j < width; j++) {
        PyObject *column = field_column(&values, j, rows);
        if (column == NULL) {
            Py_DECREF(columns);
            return ERR;
        }
        PyTuple_SET_ITEM(columns, j, column);
    }
    *out = columns;
    return OK;
}

/* ``[rows, width]``: two integers (the reader at the '['). */
static int np_shape(Reader *r, int64_t *rows, int64_t *width) {
    int is_int;
    double ignored;
    TRY(expect(r, '['));
    ws(r);
    TRY(number(r, &is_int, rows, &ignored));
    if (!is_int)
        return NO;
    TRY(expect(r, ','));
    ws(r);
    TRY(number(r, &is_int, width, &ignored));
    if (!is_int)
        return NO;
    return expect(r, ']');
}

/*
 * The one input of an np request: an object of ``name`` (a non-empty string), ``datatype`` (one of
 * NP_TYPES), ``shape`` ``[rows, F]`` (rows, F > 0) and ``data`` of rows x F values (flat or in rows),
 * each once, in any order, and members nobody reads (skipped, as the general path ignores them).
 */
static int np_input(Reader *r, PyObject **name, const FFType **type, int64_t *rows, int64_t *width, NpValues *v) {
    int status = expect(r, '{'), have_shape = 0, have_data = 0, step;
    while (status == OK) {
        const char *key;
        Py_ssize_t key_len;
        status = member_name(r, &key, &key_len);
        if (status != OK)
            break;
        ws(r);
        if (KEY_IS(key, key_len, "name")) {
            status = *name == NULL ? string_object(r, name) : NO;
            if (status == OK && PyUnicode_GET_LENGTH(*name) == 0)
                status = NO;
        } else if (KEY_IS(key, key_len, "datatype")) {
            const char *dt;
            Py_ssize_t dt_len;
            int ascii;
            status = *type == NULL ? string_text(r, &dt, &dt_len, &ascii) : NO;
            for (size_t t = 0; status == OK && t < N_NP_TYPES && *type == NULL; t++)
                if ((size_t)dt_len == NP_TYPES[t].length && memcmp(dt, NP_TYPES[t].name, (size_t)dt_len) == 0)
                    *type = &NP_TYPES[t];
            if (status == OK && *type == NULL)
                status = NO;
        } else if (KEY_IS(key, key_len, "shape")) {
            status = have_shape++ ? NO : np_shape(r, rows, width);
        } else if (KEY_IS(key, key_len, "data")) {
            status = !have_data++ && r->p < r->end && *r->p == '[' ? np_data(r, v) : NO;
        } else if (KEY_IS(key, key_len, "parameters")) {
            status = NO; /* binary data or an input codec: the general path */
        } else {
            status = skip(r);
        }
        if (status == OK) {
            step = next_or_close(r, '}');
            if (step == OK)
                break;
            status = step == MORE ? OK : step;
        }
    }
    if (status == OK && (*name == NULL || *type == NULL || !have_shape || !have_data))
        status = NO;
    if (status == OK && (*rows <= 0 || *width <= 0 || v->values.n % *width != 0 || v->values.n / *width != *rows))
        status = NO; /* the general path says what is wrong with the shape or the count */
    return status;
}

typedef struct {
    PyObject *name;
    const FFType *type;
    int64_t rows, width;
    NpValues values;
    int inputs; /* `inputs` members read */
} NpRequest;

/* `inputs` of an np request (one input), once; `outputs` leaves it to the general reader; other members
 * (model_name, which kserve sends, and others the general path ignores) are skipped. */
static int np_member(Reader *r, const char *key, Py_ssize_t key_len, void *state) {
    NpRequest *q = state;
    int status;
    if (KEY_IS(key, key_len, "outputs"))
        return NO;
    if (!KEY_IS(key, key_len, "inputs"))
        return skip(r);
    status = q->inputs++ ? NO : expect(r, '[');
    if (status == OK)
        status = np_input(r, &q->name, &q->type, &q->rows, &q->width, &q->values);
    return status == OK ? expect(r, ']') : status; /* one input only */
}

static int v2_np_body(Reader *r, PyObject **result) {
    PyObject *parameters = NULL, *id = NULL, *columns = NULL;
    NpRequest q = {NULL, NULL, 0, 0, {{NULL, 0, 0}, 0}, 0};
    int status = request_object(r, np_member, &q, &parameters, &id);
    if (status == OK && !q.inputs)
        status = NO;
    if (status == OK)
        status = np_columns(q.type, &q.values, (Py_ssize_t)q.rows, (Py_ssize_t)q.width, &columns);
    if (status == OK) {
        *result = Py_BuildValue("(OnNOO)", q.name, (Py_ssize_t)q.rows, columns, parameters ? parameters : Py_None, id ? id : Py_None);
        status = *result == NULL ? ERR : OK;
    }
    PyMem_Free(q.values.values.data);
    Py_XDECREF(q.name);
    Py_XDECREF(parameters);
    Py_XDECREF(id);
    return status;
}

PyDoc_STRVAR(v2_np_doc,
             "v2_np(body, /)\n--\n\n"
             "A V2 inference request JSON of one numeric ``[rows, F]`` tensor (the np layout) as ``(name, rows, columns,\n"
             "parameters, id)``: ``columns`` the tensor's F columns, each a 1-D array of its datatype (FP32, FP64,\n"
             "INT8-64, UINT8-64 or BOOL) holding what the general decoding (``np.array(data)`` converted to the\n"
             "datatype) holds; ``parameters`` the request's parameters object and ``id`` its id (None when absent).\n"
             "Members: ``inputs`` holding one input of exactly ``name``, ``datatype``, ``shape`` and ``data`` (flat, or\n"
             "rows of one length; members nobody reads are skipped), optionally ``parameters`` (an object) and\n"
             "``id``, each once; other members are skipped but ``outputs``. None for anything else, for data the\n"
             "general decoding refuses or converts otherwise, and for an integer past 2^53 (no exception).");

static PyObject *v2_np(PyObject *self, PyObject *arg) {
    (void)self;
    return parsed(arg, v2_np_body);
}

/* ---- answers: a BASIC datum from each typed group's rows -------------------------------------------- */

/* End of the JSON array (flat, of scalars, as orjson writes it) that starts at p; NULL if there is none. */
static const char *row_end(const char *p, const char *end) {
    if (p >= end || *p != '[')
        return NULL;
    int depth = 0;
    while (p < end) {
        char c = *p++;
        if (c == '"') {
            while (p < end && *p != '"')
                p += *p == '\\' ? 2 : 1;
            p++;
        } else if (c == '[') {
            depth++;
        } else if (c == ']' && --depth == 0) {
            return p;
        }
    }
    return NULL;
}

PyDoc_STRVAR(datum_doc,
             "datum(rows, openings, groups, closing, /)\n--\n\n"
             "The ``datum`` JSON array of an answer: per record, ``openings[g]`` then record's row of ``groups[g]``\n"
             "(each group the JSON array of its rows, ``[[...],[...]]``, as orjson writes it) for every group,\n"
             "then ``closing``. None when a group does not hold ``rows`` rows.");

static PyObject *datum(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4 || !PyList_Check(args[1]) || !PyList_Check(args[2]) || !PyBytes_Check(args[3]) ||
        PyList_GET_SIZE(args[1]) != PyList_GET_SIZE(args[2])) {
        PyErr_SetString(PyExc_TypeError, "datum(rows, openings: list[bytes], groups: list[bytes], closing: bytes)");
        return NULL;
    }
    Py_ssize_t rows = PyLong_AsSsize_t(args[0]), n = PyList_GET_SIZE(args[1]), size = 2;
    if (rows < 0 && PyErr_Occurred())
        return NULL;
    const char **at = PyMem_Calloc((size_t)n + 1, sizeof(char *)), **ends = PyMem_Calloc((size_t)n + 1, sizeof(char *));
    if (at == NULL || ends == NULL) {
        PyMem_Free(at);
        PyMem_Free(ends);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t g = 0; g < n; g++) {
        PyObject *opening = PyList_GET_ITEM(args[1], g), *group = PyList_GET_ITEM(args[2], g);
        if (!PyBytes_Check(opening) || !PyBytes_Check(group) || PyBytes_GET_SIZE(group) < 2) {
            PyMem_Free(at);
            PyMem_Free(ends);
            PyErr_SetString(PyExc_TypeError, "openings and groups must be bytes, each group a JSON array");
            return NULL;
        }
        size += rows * PyBytes_GET_SIZE(opening) + PyBytes_GET_SIZE(group);
        at[g] = PyBytes_AS_STRING(group) + 1;
        ends[g] = PyBytes_AS_STRING(group) + PyBytes_GET_SIZE(group) - 1;
    }
    size += rows * (PyBytes_GET_SIZE(args[3]) + 1);
    PyObject *out = PyBytes_FromStringAndSize(NULL, size);
    char *w = out != NULL ? PyBytes_AS_STRING(out) : NULL;
    int ok = out != NULL;
    if (ok)
        *w++ = '[';
    for (Py_ssize_t r = 0; ok && r < rows; r++) {
        if (r > 0)
            *w++ = ',';
        for (Py_ssize_t g = 0; ok && g < n; g++) {
            PyObject *opening = PyList_GET_ITEM(args[1], g);
            memcpy(w, PyBytes_AS_STRING(opening), (size_t)PyBytes_GET_SIZE(opening));
            w += PyBytes_GET_SIZE(opening);
            if (r > 0) {
                if (at[g] >= ends[g] || *at[g] != ',') {
                    ok = 0;
                    break;
                }
                at[g]++;
            }
            const char *stop = row_end(at[g], ends[g]);
            if (stop == NULL) {
                ok = 0;
                break;
            }
            memcpy(w, at[g], (size_t)(stop - at[g]));
            w += stop - at[g];
            at[g] = stop;
        }
        if (ok) {
            memcpy(w, PyBytes_AS_STRING(args[3]), (size_t)PyBytes_GET_SIZE(args[3]));
            w += PyBytes_GET_SIZE(args[3]);
        }
    }
    for (Py_ssize_t g = 0; ok && g < n; g++)
        ok = at[g] == ends[g]; /* every row used */
    PyMem_Free(at);
    PyMem_Free(ends);
    if (out == NULL)
        return NULL;
    if (!ok) {
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    *w++ = ']';
    if (_PyBytes_Resize(&out, w - PyBytes_AS_STRING(out)) < 0)
        return NULL;
    return out;
}

static PyMethodDef methods[] = {
    {"score_request", score_request, METH_O, score_request_doc},
    {"v2_request", v2_request, METH_O, v2_request_doc},
    {"v2_columns", v2_columns, METH_O, v2_columns_doc},
    {"v2_np", v2_np, METH_O, v2_np_doc},
    {"datum", (PyCFunction)(void (*)(void))datum, METH_FASTCALL, datum_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_ffjson", "Request JSON bodies read straight into typed numpy columns, written in C.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__ffjson(void) {
    for (int c = 0x20; c < 0x80; c++)
        PLAIN[c] = c != '"' && c != '\\';
    if (nd_init() < 0)
        return NULL;
    return PyModule_Create(&module);
}
