/*
 * forestflow.codecs._ffgp: GraphPipe flatbuffer string vectors, read and written in one call.
 *
 * A String tensor holds one flatbuffer string per value; walked in Python, each costs a few
 * struct unpacks, a slice and a decode (most of a 100-record request's decoding), and each
 * answer label a few bytes appends. Everything else of a GraphPipe body stays in Python
 * (codecs/graphpipe.py): these two calls only do the per-value loops, and leave every error
 * message to the Python code (a read that finds anything wrong returns None).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "ndarray.h"

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

PyDoc_STRVAR(write_strings_doc,
"write_strings(values) -> bytes\n\n"
"A flatbuffer vector of strings placed at a 4-aligned position: its length, one uoffset per value,\n"
"then each distinct value once (labels repeat), 4-aligned, as length + bytes + NUL. A value is\n"
"written as its bytes (bytes, bytearray), empty (None) or its str() in UTF-8.");

static PyObject *write_strings(PyObject *Py_UNUSED(self), PyObject *arg) {
    PyObject *seq, *encoded = NULL, *seen = NULL, *out = NULL;
    Py_ssize_t n, i, total;
    unsigned char *p;
    seq = PySequence_Fast(arg, "write_strings() takes a sequence");
    if (seq == NULL)
        return NULL;
    n = PySequence_Fast_GET_SIZE(seq);
    if (n > (Py_ssize_t)UINT32_MAX / 4) {
        PyErr_SetString(PyExc_OverflowError, "write_strings(): too many values for a flatbuffer");
        goto done;
    }
    encoded = PyList_New(n);
    seen = PyDict_New(); /* encoded value -> its position in the output */
    if (encoded == NULL || seen == NULL)
        goto done;
    /* First pass: encode, and lay out the distinct values after the uoffsets. */
    total = 4 + 4 * n;
    for (i = 0; i < n; i++) {
        PyObject *raw = element_bytes(PySequence_Fast_GET_ITEM(seq, i)), *at;
        if (raw == NULL)
            goto done;
        PyList_SET_ITEM(encoded, i, raw);
        at = PyDict_GetItemWithError(seen, raw);
        if (at == NULL) {
            if (PyErr_Occurred())
                goto done;
            total += -total & 3;
            at = PyLong_FromSsize_t(total);
            if (at == NULL || PyDict_SetItem(seen, raw, at) < 0) {
                Py_XDECREF(at);
                goto done;
            }
            Py_DECREF(at);
            total += 4 + PyBytes_GET_SIZE(raw) + 1;
        }
    }
    if (total > (Py_ssize_t)UINT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "write_strings(): values too large for a flatbuffer");
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL)
        goto done;
    p = (unsigned char *)PyBytes_AS_STRING(out);
    memset(p, 0, (size_t)total); /* padding is zeros */
    put_u32(p, (uint32_t)n);
    for (i = 0; i < n; i++) {
        PyObject *raw = PyList_GET_ITEM(encoded, i);
        Py_ssize_t at = PyLong_AsSsize_t(PyDict_GetItem(seen, raw)), len = PyBytes_GET_SIZE(raw);
        put_u32(p + 4 + 4 * i, (uint32_t)(at - (4 + 4 * i)));
        put_u32(p + at, (uint32_t)len); /* a repeated value is written again in place, the same bytes */
        memcpy(p + at + 4, PyBytes_AS_STRING(raw), (size_t)len);
    }
done:
    Py_DECREF(seq);
    Py_XDECREF(encoded);
    Py_XDECREF(seen);
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

PyDoc_STRVAR(infer_response_doc,
"infer_response(tensors) -> bytes\n\n"
"An InferResponse holding ``tensors``, each (GraphPipe type, shape, payload, is_text): the payload\n"
"is a numeric tensor's little-endian data, or a String tensor's vector from write_strings.\n"
"Written front to back, every uoffset pointing forward; shapes and data start 8-aligned.");

static PyObject *infer_response(PyObject *Py_UNUSED(self), PyObject *arg) {
    Out o = {NULL, 0, 0};
    PyObject *seq, *result = NULL;
    Py_ssize_t n, k, response, vector;
    unsigned char zeros4[4] = {0, 0, 0, 0};
    seq = PySequence_Fast(arg, "infer_response() takes a sequence of tensors");
    if (seq == NULL)
        return NULL;
    n = PySequence_Fast_GET_SIZE(seq);
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
        PyObject *item = PySequence_Fast_GET_ITEM(seq, k), *shape, *payload;
        unsigned char inline_bytes[12] = {0};
        long gp_type;
        int is_text;
        Py_ssize_t table, dims, d, at;
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 4 || !PyTuple_Check(PyTuple_GET_ITEM(item, 1)) ||
            !PyBytes_Check(PyTuple_GET_ITEM(item, 2))) {
            PyErr_SetString(PyExc_TypeError, "infer_response(): each tensor is (type, shape tuple, bytes, is_text)");
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
        inline_bytes[8] = (unsigned char)gp_type;
        table = out_table(&o, is_text ? STRINGS_VTABLE : DATA_VTABLE, 6, inline_bytes, 12);
        if (table < 0)
            goto done;
        out_point(&o, vector + 4 + 4 * k, table);
        dims = PyTuple_GET_SIZE(shape);
        if (out_align(&o, 8, 4) < 0 || (at = out_zeros(&o, 4 + 8 * dims)) < 0)
            goto done;
        put_u32(o.p + at, (uint32_t)dims);
        for (d = 0; d < dims; d++) {
            long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, d));
            if (v == -1 && PyErr_Occurred())
                goto done;
            put_u32(o.p + at + 4 + 8 * d, (uint32_t)((unsigned long long)v & 0xFFFFFFFFu));
            put_u32(o.p + at + 8 + 8 * d, (uint32_t)((unsigned long long)v >> 32));
        }
        out_point(&o, table + 4, at);
        if (is_text) {
            if (out_align(&o, 4, 4) < 0 || (at = out_bytes(&o, PyBytes_AS_STRING(payload), PyBytes_GET_SIZE(payload))) < 0)
                goto done;
        } else if ((at = out_vector(&o, PyBytes_GET_SIZE(payload), PyBytes_AS_STRING(payload), PyBytes_GET_SIZE(payload), 8)) < 0) {
            goto done;
        }
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

enum { REQ_INFER = 1, TYPE_FIRST_NUMERIC = 1, TYPE_FLOAT16 = 9, TYPE_FLOAT32 = 10, TYPE_LAST_NUMERIC = 11, TYPE_STRING = 12 };

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
        long long type, width, start;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(tensors, t), "LLL;grouped_columns(): each tensor is (type, width, start)", &type, &width, &start))
            return NULL;
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
