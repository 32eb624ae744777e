/*
 * forestflow.codecs._ffgp: GraphPipe flatbuffers, read and written in C (codecs/graphpipe.py).
 *
 * A String tensor holds one flatbuffer string per value; walked in Python, each costs a few
 * struct unpacks, a slice and a decode (most of a 100-record request's decoding), and each
 * answer label a few bytes appends. Here: the string vectors (read_strings, write_strings), the
 * InferResponse (infer_response, from numpy columns as they are in the usual case), the walk of an
 * InferRequest's structure (infer_request), and the plain path (plain_request, grouped_columns):
 * the usual request checked whole and read straight into its Frame's columns. Every error message
 * stays with the Python code: a read that finds anything wrong or unusual returns None, and the
 * Python reader then reads the body (and says what is wrong).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "ndarray.h"

/* The Request union's InferRequest, and GraphPipe's tensor types (graphpipe.fbs's Type) used here. */
enum { REQ_INFER = 1, TYPE_FIRST_NUMERIC = 1, TYPE_FLOAT16 = 9, TYPE_FLOAT32 = 10, TYPE_LAST_NUMERIC = 11, TYPE_STRING = 12 };

static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static void put_u32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

/* Recent short ASCII strings of one vector, by a hash of their bytes (see read_strings). */
#define TEXT_CACHE 64
#define TEXT_CACHE_MAX_LEN 48

PyDoc_STRVAR(read_strings_doc,
"read_strings(buf, start, count) -> list[str] | list[bytes] | None\n\n"
"The ``count`` strings whose uoffsets start at ``start`` in the flatbuffer ``buf``: as str when\n"
"every one is valid UTF-8, else all as bytes; None when an offset or a length points outside\n"
"``buf`` (the caller then says which).");

static PyObject *read_strings(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    const unsigned char *buf;
    Py_ssize_t size, start, count, i;
    int text = 1;
    PyObject *out, *cache[TEXT_CACHE] = {NULL};
    if (nargs != 3 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "read_strings() takes (bytes, start, count)");
        return NULL;
    }
    buf = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    size = PyBytes_GET_SIZE(args[0]);
    start = PyLong_AsSsize_t(args[1]);
    if (start == -1 && PyErr_Occurred())
        return NULL;
    count = PyLong_AsSsize_t(args[2]);
    if (count == -1 && PyErr_Occurred())
        return NULL;
    if (start < 0 || count < 0 || count > (size - start) / 4)
        Py_RETURN_NONE;
    /* Bounds first, so a bad body costs no allocation; then the values. */
    for (i = 0; i < count; i++) {
        Py_ssize_t slot = start + 4 * i, at = slot + (Py_ssize_t)get_u32(buf + slot);
        if (at + 4 > size || at + 4 + (Py_ssize_t)get_u32(buf + at) > size)
            Py_RETURN_NONE;
    }
    out = PyList_New(count);
    if (out == NULL)
        return NULL;
    for (i = 0; i < count; i++) {
        Py_ssize_t slot = start + 4 * i, at = slot + (Py_ssize_t)get_u32(buf + slot);
        Py_ssize_t len = (Py_ssize_t)get_u32(buf + at);
        PyObject *value = NULL;
        if (text && len <= TEXT_CACHE_MAX_LEN) {
            /* a level seen lately (categorical columns repeat a few): the same str object again */
            const unsigned char *p = buf + at + 4;
            uint32_t h = (uint32_t)len;
            Py_ssize_t k;
            for (k = 0; k < len; k++)
                h = h * 31u + p[k];
            PyObject **cached = &cache[(h ^ (h >> 7)) % TEXT_CACHE];
            if (*cached != NULL && PyUnicode_GET_LENGTH(*cached) == len && memcmp(PyUnicode_DATA(*cached), p, (size_t)len) == 0) {
                Py_INCREF(*cached);
                Py_XSETREF(((PyListObject *)out)->ob_item[i], *cached);
                continue;
            }
            value = PyUnicode_DecodeUTF8((const char *)p, len, NULL);
            if (value != NULL && PyUnicode_IS_COMPACT_ASCII(value))
                *cached = value; /* borrowed: the list holds it */
        } else if (text) {
            value = PyUnicode_DecodeUTF8((const char *)buf + at + 4, len, NULL);
        }
        if (text) {
            if (value == NULL) {
                if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                    Py_DECREF(out);
                    return NULL;
                }
                PyErr_Clear();
                text = 0; /* not text: every value goes to the model as the bytes that came */
                i = -1;
                continue;
            }
        } else {
            value = PyBytes_FromStringAndSize((const char *)buf + at + 4, len);
            if (value == NULL) {
                Py_DECREF(out);
                return NULL;
            }
        }
        Py_XSETREF(((PyListObject *)out)->ob_item[i], value); /* on the bytes pass, replaces the str */
    }
    return out;
}

/* The bytes written for one value: bytes as they are, None as empty, anything else its str() in UTF-8. */
static PyObject *element_bytes(PyObject *value) {
    PyObject *text, *out;
    if (PyBytes_CheckExact(value)) {
        Py_INCREF(value);
        return value;
    }
    if (PyBytes_Check(value) || PyByteArray_Check(value))
        return PyBytes_FromObject(value);
    if (value == Py_None)
        return PyBytes_FromStringAndSize("", 0);
    text = PyUnicode_CheckExact(value) ? (Py_INCREF(value), value) : PyObject_Str(value);
    if (text == NULL)
        return NULL;
    out = PyUnicode_AsUTF8String(text);
    Py_DECREF(text);
    return out;
}

/* A flatbuffer written front to back (as codecs/graphpipe.py's _ForwardWriter did in Python). */
typedef struct {
    unsigned char *p;
    Py_ssize_t len, cap;
} Out;

static int out_reserve(Out *o, Py_ssize_t more) {
    if (o->len + more <= o->cap)
        return 0;
    Py_ssize_t cap = o->cap ? o->cap : 256;
    while (cap < o->len + more)
        cap *= 2;
    unsigned char *p = PyMem_Realloc(o->p, (size_t)cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    o->p = p;
    o->cap = cap;
    return 0;
}

/* ``n`` zero bytes; their position. */
static Py_ssize_t out_zeros(Out *o, Py_ssize_t n) {
    Py_ssize_t at = o->len;
    if (out_reserve(o, n) < 0)
        return -1;
    memset(o->p + at, 0, (size_t)n);
    o->len += n;
    return at;
}

/* Zero padding so that the position ``before`` bytes further on is a multiple of ``n``. */
static int out_align(Out *o, Py_ssize_t n, Py_ssize_t before) {
    Py_ssize_t pad = (n - (o->len + before) % n) % n;
    return out_zeros(o, pad) < 0 ? -1 : 0;
}

static Py_ssize_t out_bytes(Out *o, const void *src, Py_ssize_t n) {
    Py_ssize_t at = out_zeros(o, n);
    if (at >= 0 && n)
        memcpy(o->p + at, src, (size_t)n);
    return at;
}

/* The pointer cache of strings_into: recent immutable values (str, bytes, None) and where their bytes went. */
#define SEEN_CACHE 16

/* A flatbuffer vector of strings of the ``n`` values ``items`` appended to ``o`` (at a 4-aligned position):
 * its length, one uoffset per value, then each distinct value once (labels repeat), 4-aligned, as length +
 * bytes + NUL. A value is written as its bytes (bytes, bytearray), empty (None) or its str() in UTF-8.
 * The same object met again (the labels of a class column are a few objects) is found by its address
 * before its bytes are looked up. 0, or -1 with an exception set. */
static int strings_into(Out *o, PyObject *const *items, Py_ssize_t n) {
    PyObject *encoded = NULL, *seen = NULL;
    PyObject *cached[SEEN_CACHE] = {NULL};
    Py_ssize_t cached_at[SEEN_CACHE], *at = NULL, i, total, base = o->len;
    unsigned char *p;
    int status = -1;
    if (n > (Py_ssize_t)UINT32_MAX / 4) {
        PyErr_SetString(PyExc_OverflowError, "write_strings(): too many values for a flatbuffer");
        return -1;
    }
    encoded = PyList_New(n);
    seen = PyDict_New(); /* encoded value -> its position in the vector */
    at = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(Py_ssize_t));
    if (encoded == NULL || seen == NULL || at == NULL) {
        if (at == NULL)
            PyErr_NoMemory();
        goto done;
    }
    /* First pass: encode, and lay out the distinct values after the uoffsets. */
    total = 4 + 4 * n;
    for (i = 0; i < n; i++) {
        PyObject *value = items[i], *raw, *known;
        size_t slot = ((uintptr_t)value >> 4) % SEEN_CACHE;
        int immutable = PyUnicode_CheckExact(value) || PyBytes_CheckExact(value) || value == Py_None;
        if (immutable && cached[slot] == value) {
            at[i] = cached_at[slot];
            continue;
        }
        raw = element_bytes(value);
        if (raw == NULL)
            goto done;
        PyList_SET_ITEM(encoded, i, raw);
        known = PyDict_GetItemWithError(seen, raw);
        if (known != NULL) {
            at[i] = PyLong_AsSsize_t(known);
        } else {
            if (PyErr_Occurred())
                goto done;
            total += -total & 3;
            known = PyLong_FromSsize_t(total);
            if (known == NULL || PyDict_SetItem(seen, raw, known) < 0) {
                Py_XDECREF(known);
                goto done;
            }
            Py_DECREF(known);
            at[i] = total;
            total += 4 + PyBytes_GET_SIZE(raw) + 1;
        }
        if (immutable) {
            cached[slot] = value; /* the caller holds it until the end */
            cached_at[slot] = at[i];
        }
    }
    if (total > (Py_ssize_t)UINT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "write_strings(): values too large for a flatbuffer");
        goto done;
    }
    if (out_zeros(o, total) < 0) /* padding is zeros */
        goto done;
    p = o->p + base;
    put_u32(p, (uint32_t)n);
    for (i = 0; i < n; i++) {
        PyObject *raw = PyList_GET_ITEM(encoded, i);
        put_u32(p + 4 + 4 * i, (uint32_t)(at[i] - (4 + 4 * i)));
        if (raw != NULL) { /* the first of its value (or a repeat found by its bytes): written in place */
            put_u32(p + at[i], (uint32_t)PyBytes_GET_SIZE(raw));
            memcpy(p + at[i] + 4, PyBytes_AS_STRING(raw), (size_t)PyBytes_GET_SIZE(raw));
        }
    }
    status = 0;
done:
    Py_XDECREF(encoded);
    Py_XDECREF(seen);
    PyMem_Free(at);
    return status;
}

PyDoc_STRVAR(write_strings_doc,
"write_strings(values) -> bytes\n\n"
"A flatbuffer vector of strings placed at a 4-aligned position: its length, one uoffset per value,\n"
"then each distinct value once (labels repeat), 4-aligned, as length + bytes + NUL. A value is\n"
"written as its bytes (bytes, bytearray), empty (None) or its str() in UTF-8.");

static PyObject *write_strings(PyObject *Py_UNUSED(self), PyObject *arg) {
    Out o = {NULL, 0, 0};
    PyObject *seq, *out = NULL;
    seq = PySequence_Tuple(arg); /* its own references: a value's str() may change a list meanwhile */
    if (seq == NULL)
        return NULL;
    if (strings_into(&o, &PyTuple_GET_ITEM(seq, 0), PyTuple_GET_SIZE(seq)) == 0)
        out = PyBytes_FromStringAndSize((const char *)o.p, o.len);
    Py_DECREF(seq);
    PyMem_Free(o.p);
    return out;
}

/* Point the uoffset at ``slot`` to ``target`` (always later in the buffer). */
static void out_point(Out *o, Py_ssize_t slot, Py_ssize_t target) { put_u32(o->p + slot, (uint32_t)(target - slot)); }

/* A vtable then its table (soffset back to it, then ``inline_len`` bytes); the table's position. */
static Py_ssize_t out_table(Out *o, const uint16_t *vtable, int fields, const unsigned char *inline_bytes, Py_ssize_t inline_len) {
    Py_ssize_t at, table;
    int i;
    if (out_align(o, 4, 0) < 0)
        return -1;
    at = o->len;
    if (out_reserve(o, 2 * fields) < 0)
        return -1;
    for (i = 0; i < fields; i++) {
        o->p[o->len++] = (unsigned char)vtable[i];
        o->p[o->len++] = (unsigned char)(vtable[i] >> 8);
    }
    if (out_align(o, 4, 0) < 0)
        return -1;
    table = out_zeros(o, 4 + inline_len);
    if (table < 0)
        return -1;
    put_u32(o->p + table, (uint32_t)(table - at));
    memcpy(o->p + table + 4, inline_bytes, (size_t)inline_len);
    return table;
}

/* A vector: length ``count``, then ``payload``, its length field placed so the payload starts
 * ``elem_align``-aligned; the vector's position. */
static Py_ssize_t out_vector(Out *o, Py_ssize_t count, const void *payload, Py_ssize_t n, Py_ssize_t elem_align) {
    Py_ssize_t at;
    unsigned char head[4];
    if (out_align(o, elem_align, 4) < 0)
        return -1;
    put_u32(head, (uint32_t)count);
    at = out_bytes(o, head, 4);
    if (at < 0 || out_bytes(o, payload, n) < 0)
        return -1;
    return at;
}

static const uint16_t RESPONSE_VTABLE[] = {6, 8, 4};
static const uint16_t DATA_VTABLE[] = {12, 16, 12, 4, 8, 0};
static const uint16_t STRINGS_VTABLE[] = {12, 16, 12, 4, 0, 8};

/* What infer_response writes for a numpy column: its GraphPipe type and shape (a 1-D column as [n, 1]), and
 * its data (numbers) or its values (an object array's, as a tuple). */
typedef struct {
    long type;
    int nd;
    Py_ssize_t shape[2];
    const Py_ssize_t *dims;
    const char *data;
    Py_ssize_t nbytes;
    PyObject *values;
} Column;

static int host_is_little_endian(void) {
    const uint16_t one = 1;
    return *(const unsigned char *)&one == 1;
}

/* The GraphPipe type of a numpy type number and item size, as codecs/graphpipe.py's _wire_tensor
 * gives it (bool as Uint8); 0 for the others (str arrays, dates, complex...), TYPE_STRING for objects. */
static long column_type(int type_num, Py_ssize_t itemsize) {
    switch (type_num) {
    case ND_BOOL:
    case ND_UBYTE: return 1;
    case ND_BYTE: return 2;
    case ND_USHORT: return 3;
    case ND_SHORT: return 4;
    case ND_UINT:
    case ND_ULONG:
    case ND_ULONGLONG: return itemsize == 4 ? 5 : itemsize == 8 ? 7 : 0;
    case ND_INT:
    case ND_LONG:
    case ND_LONGLONG: return itemsize == 4 ? 6 : itemsize == 8 ? 8 : 0;
    case ND_HALF: return TYPE_FLOAT16;
    case ND_FLOAT: return TYPE_FLOAT32;
    case ND_DOUBLE: return TYPE_LAST_NUMERIC;
    case ND_OBJECT: return TYPE_STRING;
    default: return 0;
    }
}

/* A C-contiguous numpy column of rank >= 1 in this machine's little-endian order (or of one-byte items)
 * whose type GraphPipe carries, described in `c`: 1; 0 for any other (the caller then writes what
 * _wire_tensor makes of it); -1 on error. */
static int column_of(PyObject *array, Column *c) {
    const NdArray *a = (const NdArray *)array;
    Py_ssize_t itemsize, expect, count = 1;
    char order = a->descr->byteorder;
    if (a->nd < 1 || a->descr->type_num < 0 || a->descr->type_num >= ND_NTYPES || nd_dtypes[a->descr->type_num] == NULL)
        return 0;
    itemsize = nd_itemsizes[a->descr->type_num];
    c->type = column_type(a->descr->type_num, itemsize);
    if (c->type == 0 || !(order == '=' || order == '|' || (order == '<' && host_is_little_endian())))
        return 0;
    if (itemsize > 1 && c->type != TYPE_STRING && !host_is_little_endian())
        return 0;
    expect = itemsize;
    for (int k = a->nd - 1; k >= 0; k--) {
        if (a->dimensions[k] > 1 && a->strides[k] != expect)
            return 0;
        expect *= a->dimensions[k];
        count *= a->dimensions[k];
    }
    c->nd = a->nd == 1 ? 2 : a->nd;
    c->shape[0] = a->dimensions[0];
    c->shape[1] = 1;
    c->dims = a->nd == 1 ? c->shape : a->dimensions;
    c->data = a->data;
    c->nbytes = count * itemsize;
    c->values = NULL;
    if (c->type == TYPE_STRING) { /* the values, held here (a value's str() may change the array meanwhile) */
        PyObject *const *items = (PyObject *const *)a->data;
        c->values = PyTuple_New(count);
        if (c->values == NULL)
            return -1;
        for (Py_ssize_t i = 0; i < count; i++) /* NULL is numpy's None */
            PyTuple_SET_ITEM(c->values, i, Py_NewRef(items[i] != NULL ? items[i] : Py_None));
    }
    return 1;
}

PyDoc_STRVAR(infer_response_doc,
"infer_response(tensors) -> bytes | None\n\n"
"An InferResponse holding ``tensors``, each (GraphPipe type, shape, payload, is_text) or a numpy column.\n"
"In a tuple, the payload is a numeric tensor's little-endian data, or a String tensor's vector from\n"
"write_strings. A column (C-contiguous, of numbers, booleans or objects) is written as codecs/graphpipe.py's\n"
"_wire_tensor makes it: a 1-D column as [n, 1], objects as write_strings writes them; None when a column is\n"
"of any other kind (the caller then passes _wire_tensor's tuple). Written front to back, every uoffset\n"
"pointing forward; shapes and data start 8-aligned.");

static PyObject *infer_response(PyObject *Py_UNUSED(self), PyObject *arg) {
    Out o = {NULL, 0, 0};
    PyObject *seq, *result = NULL;
    Py_ssize_t n, k, response, vector;
    unsigned char zeros4[4] = {0, 0, 0, 0};
    seq = PySequence_Tuple(arg);
    if (seq == NULL)
        return NULL;
    n = PyTuple_GET_SIZE(seq);
    if (out_zeros(&o, 4) < 0) /* the root uoffset */
        goto done;
    response = out_table(&o, RESPONSE_VTABLE, 3, zeros4, 4);
    if (response < 0)
        goto done;
    out_point(&o, 0, response);
    if (out_align(&o, 4, 4) < 0 || (vector = out_zeros(&o, 4 + 4 * n)) < 0)
        goto done;
    put_u32(o.p + vector, (uint32_t)n);
    out_point(&o, response + 4, vector);
    for (k = 0; k < n; k++) {
        PyObject *item = PyTuple_GET_ITEM(seq, k), *shape = NULL, *payload = NULL;
        unsigned char inline_bytes[12] = {0};
        Column column = {0, 0, {0, 0}, NULL, NULL, 0, NULL};
        long gp_type;
        int is_text, ok = 1;
        Py_ssize_t table, dims, d, at = 0;
        if (nd_check(item)) {
            int got = column_of(item, &column);
            if (got <= 0) {
                if (got == 0)
                    result = Py_NewRef(Py_None);
                goto done;
            }
            gp_type = column.type;
            is_text = gp_type == TYPE_STRING;
            dims = column.nd;
        } else {
            if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 4 || !PyTuple_Check(PyTuple_GET_ITEM(item, 1)) ||
                !PyBytes_Check(PyTuple_GET_ITEM(item, 2))) {
                PyErr_SetString(PyExc_TypeError, "infer_response(): each tensor is (type, shape tuple, bytes, is_text) or a numpy array");
                goto done;
            }
            gp_type = PyLong_AsLong(PyTuple_GET_ITEM(item, 0));
            if (gp_type == -1 && PyErr_Occurred())
                goto done;
            shape = PyTuple_GET_ITEM(item, 1);
            payload = PyTuple_GET_ITEM(item, 2);
            is_text = PyObject_IsTrue(PyTuple_GET_ITEM(item, 3));
            if (is_text < 0)
                goto done;
            dims = PyTuple_GET_SIZE(shape);
        }
        inline_bytes[8] = (unsigned char)gp_type;
        table = out_table(&o, is_text ? STRINGS_VTABLE : DATA_VTABLE, 6, inline_bytes, 12);
        if (table < 0 || out_align(&o, 8, 4) < 0 || (at = out_zeros(&o, 4 + 8 * dims)) < 0)
            ok = 0;
        if (ok) {
            out_point(&o, vector + 4 + 4 * k, table);
            put_u32(o.p + at, (uint32_t)dims);
        }
        for (d = 0; ok && d < dims; d++) {
            long long v = shape != NULL ? PyLong_AsLongLong(PyTuple_GET_ITEM(shape, d)) : (long long)column.dims[d];
            if (v == -1 && PyErr_Occurred()) {
                ok = 0;
                break;
            }
            put_u32(o.p + at + 4 + 8 * d, (uint32_t)((unsigned long long)v & 0xFFFFFFFFu));
            put_u32(o.p + at + 8 + 8 * d, (uint32_t)((unsigned long long)v >> 32));
        }
        if (ok) {
            out_point(&o, table + 4, at);
            if (payload == NULL && is_text) { /* a column's values: write_strings' vector in place */
                ok = out_align(&o, 4, 4) == 0;
                at = o.len;
                ok = ok && strings_into(&o, &PyTuple_GET_ITEM(column.values, 0), PyTuple_GET_SIZE(column.values)) == 0;
            } else if (payload == NULL) {
                ok = (at = out_vector(&o, column.nbytes, column.data, column.nbytes, 8)) >= 0;
            } else if (is_text) {
                ok = out_align(&o, 4, 4) == 0 && (at = out_bytes(&o, PyBytes_AS_STRING(payload), PyBytes_GET_SIZE(payload))) >= 0;
            } else {
                ok = (at = out_vector(&o, PyBytes_GET_SIZE(payload), PyBytes_AS_STRING(payload), PyBytes_GET_SIZE(payload), 8)) >= 0;
            }
        }
        Py_XDECREF(column.values);
        if (!ok)
            goto done;
        out_point(&o, table + 8, at);
    }
    result = PyBytes_FromStringAndSize((const char *)o.p, o.len);
done:
    Py_DECREF(seq);
    PyMem_Free(o.p);
    return result;
}

/* ---- the structure of an InferRequest, walked with every bound checked (codecs/graphpipe.py) ---- */
typedef struct {
    const unsigned char *b;
    int64_t size;
} Walk;

static int at_u32(const Walk *w, int64_t pos, int64_t *out) {
    if (pos < 0 || pos + 4 > w->size)
        return -1;
    *out = (int64_t)get_u32(w->b + pos);
    return 0;
}

/* The table at `pos`: its vtable and vtable size, as graphpipe.py's _Reader.table checks them. */
static int walk_table(const Walk *w, int64_t pos, int64_t *vt, int64_t *vs) {
    int64_t rel;
    if (at_u32(w, pos, &rel) < 0)
        return -1;
    *vt = pos - (int64_t)(int32_t)(uint32_t)rel;
    if (*vt < 0 || *vt + 4 > w->size)
        return -1;
    *vs = (int64_t)w->b[*vt] | ((int64_t)w->b[*vt + 1] << 8);
    return *vt + *vs > w->size ? -1 : 0;
}

/* The position of the field in vtable `slot`, 0 when absent, -1 when it points outside. */
static int64_t walk_field(const Walk *w, int64_t pos, int64_t vt, int64_t vs, int64_t slot) {
    int64_t off;
    if (slot + 2 > vs)
        return 0;
    off = (int64_t)w->b[vt + slot] | ((int64_t)w->b[vt + slot + 1] << 8);
    if (off && pos + off >= w->size)
        return -1;
    return off ? pos + off : 0;
}

/* A vector field: its first element and count ((0, 0) when absent); -1 when anything is outside. */
static int walk_vector(const Walk *w, int64_t pos, int64_t vt, int64_t vs, int64_t slot, int64_t elem, int64_t *start, int64_t *count) {
    int64_t at = walk_field(w, pos, vt, vs, slot), rel, n;
    *start = *count = 0;
    if (at < 0)
        return -1;
    if (at == 0)
        return 0;
    if (at_u32(w, at, &rel) < 0 || at_u32(w, at + rel, &n) < 0)
        return -1;
    if (n * elem > w->size || at + rel + 4 + n * elem > w->size)
        return -1;
    *start = at + rel + 4;
    *count = n;
    return 0;
}

/* Whether every string of a vector of `count` uoffsets from `start` lies inside the buffer. */
static int strings_inside(const Walk *w, int64_t start, int64_t count) {
    for (int64_t i = 0; i < count; i++) {
        int64_t slot = start + 4 * i, rel, len;
        if (at_u32(w, slot, &rel) < 0 || at_u32(w, slot + rel, &len) < 0 || slot + rel + 4 + len > w->size)
            return 0;
    }
    return 1;
}

/* The strings of a vector field as bytes (all inside: strings_inside said so). */
static PyObject *walk_bytes_list(const Walk *w, int64_t start, int64_t count) {
    PyObject *out = PyList_New((Py_ssize_t)count);
    for (int64_t i = 0; out != NULL && i < count; i++) {
        int64_t slot = start + 4 * i, at = slot + (int64_t)get_u32(w->b + slot);
        PyObject *item = PyBytes_FromStringAndSize((const char *)w->b + at + 4, (Py_ssize_t)get_u32(w->b + at));
        if (item == NULL)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, (Py_ssize_t)i, item);
    }
    return out;
}


/* The InferRequest table of a Request body (its position, vtable and vtable size); -1 for anything else. */
static int walk_infer(const Walk *w, int64_t *infer, int64_t *vt, int64_t *vs) {
    int64_t root, rvt, rvs, kind_at, req, rel;
    if (w->size < 8 || at_u32(w, 0, &root) < 0 || walk_table(w, root, &rvt, &rvs) < 0)
        return -1;
    kind_at = walk_field(w, root, rvt, rvs, 4);
    if (kind_at <= 0 || w->b[kind_at] != REQ_INFER)
        return -1;
    req = walk_field(w, root, rvt, rvs, 6);
    if (req <= 0 || at_u32(w, req, &rel) < 0)
        return -1;
    *infer = req + rel;
    return walk_table(w, *infer, vt, vs);
}

PyDoc_STRVAR(infer_request_doc,
"infer_request(body) -> tuple | None\n\n"
"The parts of a GraphPipe Request body holding an InferRequest, walked as codecs/graphpipe.py's\n"
"reader walks it: ``(config, input_names, output_names, tensors)``, the texts as bytes (config\n"
"None when absent) and each tensor ``(type, shape, start, count)``: for a String tensor the\n"
"position of its first uoffset and its string count, else its data's position and byte count.\n"
"None for anything else (a MetadataRequest, a bound or offset outside the body, a tensor without a\n"
"shape or of an unknown type): the Python reader then says what is wrong.");

static PyObject *infer_request(PyObject *Py_UNUSED(self), PyObject *arg) {
    Walk w;
    int64_t rel, infer, vt, vs, start, count, cfg, tstart, ntensors;
    PyObject *names = NULL, *outputs = NULL, *tensors = NULL, *config = NULL, *result = NULL;
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "infer_request() takes bytes");
        return NULL;
    }
    w.b = (const unsigned char *)PyBytes_AS_STRING(arg);
    w.size = PyBytes_GET_SIZE(arg);
    if (walk_infer(&w, &infer, &vt, &vs) < 0)
        Py_RETURN_NONE;
    /* names (6) and output names (10): every string inside */
    if (walk_vector(&w, infer, vt, vs, 6, 4, &start, &count) < 0 || !strings_inside(&w, start, count))
        Py_RETURN_NONE;
    names = walk_bytes_list(&w, start, count);
    if (names == NULL)
        goto done;
    if (walk_vector(&w, infer, vt, vs, 10, 4, &start, &count) < 0 || !strings_inside(&w, start, count))
        goto decline;
    outputs = walk_bytes_list(&w, start, count);
    if (outputs == NULL)
        goto done;
    if (walk_vector(&w, infer, vt, vs, 8, 4, &tstart, &ntensors) < 0)
        goto decline;
    tensors = PyList_New(0);
    if (tensors == NULL)
        goto done;
    for (int64_t i = 0; i < ntensors; i++) {
        int64_t pos, tvt, tvs, type_at, type, sstart, dims, dstart, dcount;
        PyObject *shape, *item;
        if (at_u32(&w, tstart + 4 * i, &rel) < 0)
            goto decline;
        pos = tstart + 4 * i + rel;
        if (walk_table(&w, pos, &tvt, &tvs) < 0)
            goto decline;
        type_at = walk_field(&w, pos, tvt, tvs, 4);
        if (type_at < 0)
            goto decline;
        type = type_at ? w.b[type_at] : 0;
        if (walk_vector(&w, pos, tvt, tvs, 6, 8, &sstart, &dims) < 0 || dims == 0)
            goto decline;
        if (type == TYPE_STRING) {
            if (walk_vector(&w, pos, tvt, tvs, 10, 4, &dstart, &dcount) < 0 || !strings_inside(&w, dstart, dcount))
                goto decline;
        } else if (type >= TYPE_FIRST_NUMERIC && type <= TYPE_LAST_NUMERIC) {
            if (walk_vector(&w, pos, tvt, tvs, 8, 1, &dstart, &dcount) < 0)
                goto decline;
        } else {
            goto decline;
        }
        shape = PyTuple_New((Py_ssize_t)dims);
        if (shape == NULL)
            goto done;
        for (int64_t d = 0; d < dims; d++) {
            const unsigned char *p = w.b + sstart + 8 * d;
            uint64_t v = (uint64_t)get_u32(p) | ((uint64_t)get_u32(p + 4) << 32);
            int64_t sv = v <= (uint64_t)INT64_MAX ? (int64_t)v : -(int64_t)(~v) - 1; /* two's complement, as "<q" */
            PyObject *dim = PyLong_FromLongLong((long long)sv);
            if (dim == NULL) {
                Py_DECREF(shape);
                goto done;
            }
            PyTuple_SET_ITEM(shape, (Py_ssize_t)d, dim);
        }
        item = Py_BuildValue("(LNLL)", (long long)type, shape, (long long)dstart, (long long)dcount);
        if (item == NULL || PyList_Append(tensors, item) < 0) {
            Py_XDECREF(item);
            goto done;
        }
        Py_DECREF(item);
    }
    cfg = walk_field(&w, infer, vt, vs, 4);
    if (cfg < 0)
        goto decline;
    if (cfg) {
        int64_t len;
        if (at_u32(&w, cfg, &rel) < 0 || at_u32(&w, cfg + rel, &len) < 0 || cfg + rel + 4 + len > w.size)
            goto decline;
        config = PyBytes_FromStringAndSize((const char *)w.b + cfg + rel + 4, (Py_ssize_t)len);
        if (config == NULL)
            goto done;
    } else {
        config = Py_NewRef(Py_None);
    }
    result = PyTuple_Pack(4, config, names, outputs, tensors);
    goto done;
decline:
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(names);
    Py_XDECREF(outputs);
    Py_XDECREF(tensors);
    Py_XDECREF(config);
    return result;
}

/* ---- the plain path: a request of grouped tensors read straight into its Frame's columns ---- */

/* Bytes per value of a numeric wire type the plain path reads (0: not one: Float16 and the rest). */
static int64_t plain_itemsize(int64_t type) {
    static const int64_t sizes[TYPE_LAST_NUMERIC + 1] = {0, 1, 1, 2, 2, 4, 4, 8, 8, 0, 4, 8};
    return type >= TYPE_FIRST_NUMERIC && type <= TYPE_LAST_NUMERIC ? sizes[type] : 0;
}

/* A UTF-8 text as str; NULL with no exception when it is not UTF-8 (the general path then reads it). */
static PyObject *utf8_or_null(const unsigned char *p, int64_t len) {
    PyObject *text = PyUnicode_DecodeUTF8((const char *)p, (Py_ssize_t)len, NULL);
    if (text == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
        PyErr_Clear();
    return text;
}

PyDoc_STRVAR(plain_request_doc,
"plain_request(body) -> tuple | None\n\n"
"A GraphPipe Request body holding the usual InferRequest, checked whole: ``(config, output_names, rows,\n"
"tensors)``, the texts as str (config \"\" when absent) and ``tensors`` one or two ``(type, width,\n"
"start)``, at most one String and one numeric tensor (not Float16), each of shape ``[rows, width]``\n"
"(rows, width > 0) with exactly that many values, ``start`` its first uoffset (String) or data byte.\n"
"None for anything else (input_names, other shapes or counts, texts that are not UTF-8, any bound\n"
"outside the body), which codecs/graphpipe.py's general reader then reads (or says what is wrong).\n"
"A body taken here is one that reader reads without an error.");

static PyObject *plain_request(PyObject *Py_UNUSED(self), PyObject *arg) {
    Walk w;
    int64_t infer, vt, vs, start, count, rel, tstart, ntensors, rows = 0, cfg;
    int kinds = 0; /* 1: a String tensor seen, 2: a numeric one */
    PyObject *outputs = NULL, *tensors = NULL, *config = NULL, *result = NULL;
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "plain_request() takes bytes");
        return NULL;
    }
    w.b = (const unsigned char *)PyBytes_AS_STRING(arg);
    w.size = PyBytes_GET_SIZE(arg);
    if (walk_infer(&w, &infer, &vt, &vs) < 0)
        Py_RETURN_NONE;
    /* input_names (6): none (named tensors are laid out by the general path) */
    if (walk_vector(&w, infer, vt, vs, 6, 4, &start, &count) < 0 || count != 0)
        Py_RETURN_NONE;
    if (walk_vector(&w, infer, vt, vs, 10, 4, &start, &count) < 0 || !strings_inside(&w, start, count))
        Py_RETURN_NONE;
    outputs = PyList_New((Py_ssize_t)count);
    if (outputs == NULL)
        return NULL;
    for (int64_t i = 0; i < count; i++) {
        int64_t slot = start + 4 * i, at = slot + (int64_t)get_u32(w.b + slot);
        PyObject *name = utf8_or_null(w.b + at + 4, (int64_t)get_u32(w.b + at));
        if (name == NULL)
            goto fail;
        PyList_SET_ITEM(outputs, (Py_ssize_t)i, name);
    }
    if (walk_vector(&w, infer, vt, vs, 8, 4, &tstart, &ntensors) < 0 || ntensors < 1 || ntensors > 2)
        goto decline;
    tensors = PyTuple_New((Py_ssize_t)ntensors);
    if (tensors == NULL)
        goto fail;
    for (int64_t i = 0; i < ntensors; i++) {
        int64_t pos, tvt, tvs, type_at, type, sstart, dims, dstart, dcount, values, shape[2], itemsize = 0;
        int kind;
        PyObject *item;
        if (at_u32(&w, tstart + 4 * i, &rel) < 0)
            goto decline;
        pos = tstart + 4 * i + rel;
        if (walk_table(&w, pos, &tvt, &tvs) < 0 || (type_at = walk_field(&w, pos, tvt, tvs, 4)) < 0)
            goto decline;
        type = type_at ? w.b[type_at] : 0;
        if (walk_vector(&w, pos, tvt, tvs, 6, 8, &sstart, &dims) < 0 || dims != 2)
            goto decline;
        if (type == TYPE_STRING) {
            kind = 1;
            if (walk_vector(&w, pos, tvt, tvs, 10, 4, &dstart, &dcount) < 0 || !strings_inside(&w, dstart, dcount))
                goto decline;
            values = dcount;
        } else {
            kind = 2;
            itemsize = plain_itemsize(type);
            if (itemsize == 0 || walk_vector(&w, pos, tvt, tvs, 8, 1, &dstart, &dcount) < 0 || dcount % itemsize != 0)
                goto decline;
            values = dcount / itemsize;
        }
        for (int d = 0; d < 2; d++) { /* as "<q": two's complement */
            uint64_t v = (uint64_t)get_u32(w.b + sstart + 8 * d) | ((uint64_t)get_u32(w.b + sstart + 8 * d + 4) << 32);
            shape[d] = v <= (uint64_t)INT64_MAX ? (int64_t)v : -1;
        }
        /* [rows, width] holding exactly its values (both at most `values`, so the product cannot overflow) */
        if (shape[0] < 1 || shape[1] < 1 || shape[0] > values || shape[1] > values || shape[0] * shape[1] != values)
            goto decline;
        if ((kinds & kind) || (rows && shape[0] != rows))
            goto decline; /* two tensors of one kind, or of different record counts: the general path says so */
        kinds |= kind;
        rows = shape[0];
        item = Py_BuildValue("(LLL)", (long long)type, (long long)shape[1], (long long)dstart);
        if (item == NULL)
            goto fail;
        PyTuple_SET_ITEM(tensors, (Py_ssize_t)i, item);
    }
    cfg = walk_field(&w, infer, vt, vs, 4);
    if (cfg < 0)
        goto decline;
    if (cfg) {
        int64_t len;
        if (at_u32(&w, cfg, &rel) < 0 || at_u32(&w, cfg + rel, &len) < 0 || cfg + rel + 4 + len > w.size)
            goto decline;
        config = utf8_or_null(w.b + cfg + rel + 4, len);
    } else {
        config = PyUnicode_FromStringAndSize("", 0);
    }
    if (config == NULL)
        goto fail;
    result = Py_BuildValue("(OOLO)", config, outputs, (long long)rows, tensors);
    goto done;
fail:
    if (!PyErr_Occurred()) /* a text that is not UTF-8 */
        goto decline;
    goto done;
decline:
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(outputs);
    Py_XDECREF(tensors);
    Py_XDECREF(config);
    return result;
}

/* One numeric wire value (little-endian) as a double, as numpy's astype(float64) converts it. */
static double wire_double(const unsigned char *p, int64_t type) {
    uint64_t lo = get_u32(p), v;
    switch (type) {
    case 1: return (double)p[0];
    case 2: return (double)(int8_t)p[0];
    case 3: return (double)(uint16_t)(p[0] | (p[1] << 8));
    case 4: return (double)(int16_t)(uint16_t)(p[0] | (p[1] << 8));
    case 5: return (double)(uint32_t)lo;
    case 6: return (double)(int32_t)(uint32_t)lo;
    case TYPE_FLOAT32: {
        uint32_t bits = (uint32_t)lo;
        float f;
        memcpy(&f, &bits, 4);
        return (double)f;
    }
    default: break;
    }
    v = lo | ((uint64_t)get_u32(p + 4) << 32);
    if (type == 7)
        return (double)v;
    if (type == 8)
        return (double)(int64_t)v;
    {
        double d;
        memcpy(&d, &v, 8);
        return d;
    }
}

/* The `width` String columns of a [rows, width] tensor whose uoffsets start at `start`, as object arrays
 * in `cols`; 0 when done, 1 when a bound is outside or a value is not UTF-8 (the general path reads it), -1 on error. */
static int string_columns(const Walk *w, int64_t start, int64_t rows, int64_t width, PyObject **cols) {
    PyObject *cache[TEXT_CACHE] = {NULL};
    if (start < 0 || rows * width > (w->size - start) / 4)
        return 1;
    for (int64_t j = 0; j < width; j++)
        if ((cols[j] = nd_new(ND_OBJECT, (Py_ssize_t)rows)) == NULL)
            return -1;
    for (int64_t k = 0; k < rows * width; k++) {
        int64_t slot = start + 4 * k, at = slot + (int64_t)get_u32(w->b + slot), len;
        const unsigned char *p;
        PyObject *value = NULL, **cached = NULL;
        if (at + 4 > w->size || at + 4 + (len = (int64_t)get_u32(w->b + at)) > w->size)
            return 1;
        p = w->b + at + 4;
        if (len <= TEXT_CACHE_MAX_LEN) { /* a level seen lately: the same str object again (as read_strings) */
            uint32_t h = (uint32_t)len;
            for (int64_t c = 0; c < len; c++)
                h = h * 31u + p[c];
            cached = &cache[(h ^ (h >> 7)) % TEXT_CACHE];
            if (*cached != NULL && PyUnicode_GET_LENGTH(*cached) == len && memcmp(PyUnicode_DATA(*cached), p, (size_t)len) == 0)
                value = Py_NewRef(*cached);
        }
        if (value == NULL) {
            value = utf8_or_null(p, len);
            if (value == NULL)
                return PyErr_Occurred() ? -1 : 1;
            if (cached != NULL && PyUnicode_IS_COMPACT_ASCII(value))
                *cached = value; /* borrowed: a column holds it */
        }
        ((PyObject **)nd_data(cols[k % width]))[k / width] = value;
    }
    return 0;
}

/* The `width` FP64 columns of a numeric [rows, width] tensor of `type` whose data starts at `start`. */
static int number_columns(const Walk *w, int64_t type, int64_t start, int64_t rows, int64_t width, PyObject **cols) {
    int64_t itemsize = plain_itemsize(type);
    if (itemsize == 0 || start < 0 || rows * width > (w->size - start) / itemsize)
        return 1;
    for (int64_t j = 0; j < width; j++) {
        double *out;
        const unsigned char *p = w->b + start + itemsize * j;
        if ((cols[j] = nd_new(ND_DOUBLE, (Py_ssize_t)rows)) == NULL)
            return -1;
        out = (double *)nd_data(cols[j]);
        for (int64_t i = 0; i < rows; i++, p += itemsize * width)
            out[i] = wire_double(p, type);
    }
    return 0;
}

PyDoc_STRVAR(grouped_columns_doc,
"grouped_columns(body, rows, tensors, layout) -> dict | None\n\n"
"The Frame columns of a plain request (``plain_request(body)``'s ``rows`` and ``tensors``) for a model\n"
"whose inputs, in metadata order, are ``layout``: ``(name, is_text)`` each, every numeric one FP64.\n"
"As codecs/graphpipe.py's grouping lays unnamed tensors out: the String tensor's columns are the text\n"
"inputs, the numeric tensor's the others (as FP64), in order; here only when each tensor has exactly\n"
"one column per input of its group. None for anything else (a tensor for a group the model lacks, a\n"
"width that is not the group's size, a String value that is not UTF-8, a bound outside the body).");

static PyObject *grouped_columns(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    Walk w;
    PyObject *tensors, *layout, *out = NULL, **cols = NULL;
    Py_ssize_t inputs, n_text = 0, n_tensors;
    int64_t rows, text_start = -1, number_start = -1, number_type = 0;
    int status = 0;
    if (nargs != 4 || !PyBytes_Check(args[0]) || !PyTuple_Check(args[2]) || !PyTuple_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "grouped_columns() takes (bytes, int, tuple, tuple)");
        return NULL;
    }
    w.b = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    w.size = PyBytes_GET_SIZE(args[0]);
    rows = PyLong_AsLongLong(args[1]);
    if (rows == -1 && PyErr_Occurred())
        return NULL;
    tensors = args[2];
    layout = args[3];
    inputs = PyTuple_GET_SIZE(layout);
    n_tensors = PyTuple_GET_SIZE(tensors);
    for (Py_ssize_t k = 0; k < inputs; k++) {
        PyObject *spec = PyTuple_GET_ITEM(layout, k);
        int is_text;
        if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 2 || !PyUnicode_Check(PyTuple_GET_ITEM(spec, 0))) {
            PyErr_SetString(PyExc_TypeError, "grouped_columns(): each input is (name, is_text)");
            return NULL;
        }
        if ((is_text = PyObject_IsTrue(PyTuple_GET_ITEM(spec, 1))) < 0)
            return NULL;
        n_text += is_text;
    }
    if (rows < 1 || rows > w.size || inputs == 0 || n_tensors != (n_text > 0) + (inputs - n_text > 0))
        Py_RETURN_NONE;
    for (Py_ssize_t t = 0; t < n_tensors; t++) {
        PyObject *tensor = PyTuple_GET_ITEM(tensors, t);
        long long type, width, start;
        if (!PyTuple_Check(tensor) || !PyArg_ParseTuple(tensor, "LLL", &type, &width, &start)) {
            PyErr_SetString(PyExc_TypeError, "grouped_columns(): each tensor is (type, width, start)");
            return NULL;
        }
        if (type == TYPE_STRING ? (width != n_text || text_start >= 0) : (width != inputs - n_text || number_start >= 0))
            Py_RETURN_NONE;
        if (type == TYPE_STRING) {
            text_start = start;
        } else {
            number_start = start;
            number_type = type;
        }
    }
    cols = PyMem_Calloc((size_t)inputs, sizeof(PyObject *));
    if (cols == NULL)
        return PyErr_NoMemory();
    /* text columns first in cols, then the numeric ones */
    if (n_text)
        status = string_columns(&w, text_start, rows, (int64_t)n_text, cols);
    if (status == 0 && n_text < inputs)
        status = number_columns(&w, number_type, number_start, rows, (int64_t)(inputs - n_text), cols + n_text);
    if (status == 0 && (out = PyDict_New()) != NULL) {
        Py_ssize_t text = 0, number = n_text;
        for (Py_ssize_t k = 0; k < inputs; k++) {
            PyObject *spec = PyTuple_GET_ITEM(layout, k);
            PyObject *column = PyObject_IsTrue(PyTuple_GET_ITEM(spec, 1)) ? cols[text++] : cols[number++];
            if (PyDict_SetItem(out, PyTuple_GET_ITEM(spec, 0), column) < 0) {
                Py_CLEAR(out);
                break;
            }
        }
    }
    for (Py_ssize_t k = 0; k < inputs; k++)
        Py_XDECREF(cols[k]);
    PyMem_Free(cols);
    if (status > 0)
        Py_RETURN_NONE;
    return out;
}

static PyMethodDef methods[] = {
    {"read_strings", (PyCFunction)(void (*)(void))read_strings, METH_FASTCALL, read_strings_doc},
    {"write_strings", write_strings, METH_O, write_strings_doc},
    {"infer_response", infer_response, METH_O, infer_response_doc},
    {"infer_request", infer_request, METH_O, infer_request_doc},
    {"plain_request", plain_request, METH_O, plain_request_doc},
    {"grouped_columns", (PyCFunction)(void (*)(void))grouped_columns, METH_FASTCALL, grouped_columns_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_ffgp", "GraphPipe flatbuffer string vectors, read and written in C.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__ffgp(void) {
    if (nd_init() < 0)
        return NULL;
    return PyModule_Create(&module);
}
