/*
 * forestflow.codecs._ffwire: the records of a frame as ForestFlow protobuf Datum messages.
 *
 * The prediction log writes every BASIC request and its answer to Kafka as ForestFlow's
 * PredictionEvent, where each record is a Datum holding one Tensor per typed group of columns,
 * each element a field of its own (unpacked repeated fields). Assembled in Python this costs a
 * few function calls per record and element, several times the cost of the request itself;
 * here one call writes every Datum of a frame, reading the numpy columns' memory straight from the
 * arrays (ndarray.h) and other columns through the buffer protocol, with its schema (one entry per type group) and, for an
 * InferenceRequest, its configs: one call per message, nothing cached between calls.
 *
 * Elements by the column's buffer format:
 *   'd'                      tag 0x09 + 8 bytes little-endian (Float64)
 *   'f', 'e'                 tag 0x0D + 4 bytes little-endian (Float32, Float16 widened)
 *   signed/unsigned ints, '?' tag 0x08 + varint (negative numbers as 64-bit two's complement)
 *   'O' (str or bytes)       tag 0x0A + length + UTF-8 / raw bytes
 * Each column holds ``rows * width`` elements, row-major (a vector column contributes ``width``
 * elements to every record). A record's elements are its columns' elements in column order.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "ndarray.h"
#include "pylong.h"
#include "varint.h"

/* The byte loops copying a few bytes (a tag, a category level) stay loops: GCC otherwise turns them into
 * memcpy calls (-ftree-loop-distribute-patterns), each costing more than the bytes it copies. */
#if defined(__GNUC__) && !defined(__clang__)
#define SHORT_COPIES __attribute__((optimize("no-tree-loop-distribute-patterns")))
#else
#define SHORT_COPIES
#endif
/* The rare element layouts' writer stays a call: inlined into the record loop, its registers spill
 * the loop's own on every column. */
#if defined(__GNUC__)
#define NOINLINE __attribute__((noinline))
#else
#define NOINLINE
#endif

/* ForestFlow type codes of the columns, in the order of schema_datum.FF_DTYPES. */
enum { FF_FLOAT16, FF_FLOAT32, FF_FLOAT64, FF_INT8, FF_INT16, FF_INT32, FF_INT64, FF_STRING, FF_BOOL, FF_BYTES };
/* How a column's elements are read and written. */
enum { KIND_F64, KIND_F32, KIND_F16, KIND_SIGNED, KIND_UNSIGNED, KIND_OBJECT };
/* What an object group requires of its elements (a String group str, a Bytes group bytes). */
enum { TEXT_ANY = 0, TEXT_STR = 1, TEXT_BYTES = 2 };

typedef struct {
    int kind;
    Py_ssize_t itemsize;
    Py_ssize_t stride; /* bytes from one element to the next (a column of a row-major matrix is strided) */
    Py_ssize_t width;
    int text;
    Py_buffer view;
    int has_view;
    struct Text *texts; /* a text column's elements, read while sizing */
} Column;

/* Element i of a column (in record-major order). */
#define AT(c, i) ((const char *)(c)->view.buf + (i) * (c)->stride)

typedef struct {
    const char *tag;  /* the Tensor oneof field's key, e.g. "\x5a" */
    Py_ssize_t tag_len;
    Py_ssize_t first; /* index of its first column in the flat column array */
    Py_ssize_t count;
    /* A group of fixed-size elements only (no text, no varint) has the same Tensor head in every record
     * (Datum.tensors key and length, the oneof key, the data length): written once, copied per record.
     * head_len 0 for the others. */
    char head[32];
    Py_ssize_t head_len;
} Group;

/* IEEE half -> float, exactly (every half is a float). */
static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, mant = h & 0x3FF, bits;
    float f;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000 | (mant << 13); /* inf, nan */
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    } else if (mant == 0) {
        bits = sign; /* signed zero */
    } else { /* subnormal half: a normal float */
        exp = 113;
        while (!(mant & 0x400)) {
            mant <<= 1;
            exp--;
        }
        bits = sign | (exp << 23) | ((mant & 0x3FF) << 13);
    }
    memcpy(&f, &bits, 4);
    return f;
}

/* The varint of an integer element: signed values as their 64-bit two's complement bits. */
static uint64_t varint_value(const Column *c, Py_ssize_t i) {
    const char *p = AT(c, i);
    int sign = c->kind == KIND_SIGNED;
    switch (c->itemsize) {
    case 1: return sign ? (uint64_t)(int64_t)*(const int8_t *)p : *(const uint8_t *)p;
    case 2: { uint16_t v; memcpy(&v, p, 2); return sign ? (uint64_t)(int64_t)(int16_t)v : v; }
    case 4: { uint32_t v; memcpy(&v, p, 4); return sign ? (uint64_t)(int64_t)(int32_t)v : v; }
    default: { uint64_t v; memcpy(&v, p, 8); return v; }
    }
}

/* The bytes of a str or bytes element (a String group takes only str, a Bytes group only bytes). */
static const char *text_of(const Column *c, PyObject *item, Py_ssize_t *len) {
    if (PyUnicode_Check(item) && c->text != TEXT_BYTES) {
        /* Read twice per message (sized, then written): an ASCII str's characters are its UTF-8,
         * read in place without a call. */
        if (PyUnicode_IS_COMPACT_ASCII(item)) {
            *len = PyUnicode_GET_LENGTH(item);
            return (const char *)PyUnicode_DATA(item);
        }
        return PyUnicode_AsUTF8AndSize(item, len); /* cached in the str after the first call */
    }
    if (PyBytes_Check(item) && c->text != TEXT_STR) {
        *len = PyBytes_GET_SIZE(item);
        return PyBytes_AS_STRING(item);
    }
    if (PyByteArray_Check(item) && c->text != TEXT_STR) {
        *len = PyByteArray_GET_SIZE(item);
        return PyByteArray_AS_STRING(item);
    }
    PyErr_Format(PyExc_TypeError, "a %s column holds a %.50s", c->text == TEXT_STR ? "String" : "Bytes",
                 Py_TYPE(item)->tp_name);
    return NULL;
}

/* A text element read once (while sizing) and copied from there while writing. */
typedef struct Text {
    const char *data;
    Py_ssize_t len;
} Text;

/* Adds a column's elements to each record's data size in ``data_len`` (one entry per record, ``step``
 * apart); a text column's elements are read here, once, into ``texts``. */
static int add_column_sizes(const Column *c, Py_ssize_t rows, size_t *data_len, Py_ssize_t step, Text *texts) {
    Py_ssize_t r, j, i = 0;
    if (c->kind == KIND_OBJECT && c->width == 1) { /* the usual text column: one element a record */
        const char *p = (const char *)c->view.buf;
        const Py_ssize_t stride = c->stride;
        const int str_ok = c->text != TEXT_BYTES;
        for (r = 0; r < rows; r++, p += stride, data_len += step) {
            PyObject *item = *(PyObject *const *)p;
            Text *t = &texts[r];
            const PyASCIIObject *ascii = (const PyASCIIObject *)item;
            if (str_ok && Py_IS_TYPE(item, &PyUnicode_Type) && ascii->state.ascii && ascii->state.compact) {
                t->len = ascii->length; /* a compact ASCII str: its characters, right after it, are its UTF-8 */
                t->data = (const char *)(ascii + 1);
            } else if ((t->data = text_of(c, item, &t->len)) == NULL) {
                return -1;
            }
            *data_len += (t->len < 0x80 ? 2 : 1 + varint_len((uint64_t)t->len)) + (size_t)t->len;
        }
        return 0;
    }
    for (r = 0; r < rows; r++) {
        size_t total = 0;
        if (c->kind == KIND_OBJECT) {
            for (j = 0; j < c->width; j++, i++) {
                if ((texts[i].data = text_of(c, *(PyObject *const *)AT(c, i), &texts[i].len)) == NULL)
                    return -1;
                total += 1 + varint_len((uint64_t)texts[i].len) + (size_t)texts[i].len;
            }
        } else {
            for (j = 0; j < c->width; j++, i++)
                total += 1 + varint_len(varint_value(c, i));
        }
        data_len[r * step] += total;
    }
    return 0;
}

/* Writes one record's elements of a column; ``texts``: the text column's elements read while sizing. */
SHORT_COPIES NOINLINE static char *put_column_row(char *out, const Column *c, Py_ssize_t row, const Text *texts) {
    Py_ssize_t j, start = row * c->width;
    const char *p = AT(c, start);
    switch (c->kind) {
    case KIND_F64:
        for (j = 0; j < c->width; j++, p += c->stride) {
            out[0] = 0x09;
            memcpy(out + 1, p, 8); /* little-endian hosts only: checked at import */
            out += 9;
        }
        break;
    case KIND_F32:
        for (j = 0; j < c->width; j++, p += c->stride) {
            out[0] = 0x0D;
            memcpy(out + 1, p, 4);
            out += 5;
        }
        break;
    case KIND_F16:
        for (j = 0; j < c->width; j++, p += c->stride) {
            uint16_t h;
            float f;
            memcpy(&h, p, 2);
            f = half_to_float(h);
            out[0] = 0x0D;
            memcpy(out + 1, &f, 4);
            out += 5;
        }
        break;
    case KIND_SIGNED:
    case KIND_UNSIGNED:
        for (j = 0; j < c->width; j++) {
            *out++ = 0x08;
            out = put_varint(out, varint_value(c, start + j));
        }
        break;
    default:
        for (j = 0; j < c->width; j++) {
            const Text *t = &texts[start + j];
            *out++ = 0x0A;
            out = put_varint(out, (uint64_t)t->len);
            if (t->len <= 16) { /* the usual category level: no call */
                for (Py_ssize_t b = 0; b < t->len; b++)
                    out[b] = t->data[b];
            } else {
                memcpy(out, t->data, (size_t)t->len);
            }
            out += t->len;
        }
    }
    return out;
}

/* Writes every record's Datum: ``data_len`` holds each record's data size per group (``n_groups`` a
 * record), then each record's Datum size, as the sizing pass left them. */
SHORT_COPIES static char *put_datums(char *out, char datum_tag, Py_ssize_t rows, Py_ssize_t n_groups, const Group *groups,
                        Column *const *ordered, const size_t *data_len) {
    const size_t *datum_len = data_len + rows * n_groups;
    for (Py_ssize_t r = 0; r < rows; r++) {
        *out++ = datum_tag;
        out = put_varint(out, datum_len[r]);
        for (Py_ssize_t g = 0; g < n_groups; g++) {
            /* Read into locals: stores through ``out`` (a char *) could alias the group, which would be
             * reread after every byte written otherwise. */
            const char *tag = groups[g].tag, *head = groups[g].head;
            const Py_ssize_t tag_len = groups[g].tag_len, head_len = groups[g].head_len, count = groups[g].count;
            Column *const *columns = ordered + groups[g].first;
            if (head_len > 0) { /* fixed-size elements: the head every record of the group has */
                for (Py_ssize_t i = 0; i < head_len; i++)
                    out[i] = head[i];
                out += head_len;
            } else {
                const size_t data = data_len[r * n_groups + g];
                *out++ = 0x0A; /* Datum.tensors */
                out = put_varint(out, (size_t)tag_len + varint_len(data) + data);
                for (Py_ssize_t i = 0; i < tag_len; i++) /* 1 to 3 bytes: no call */
                    out[i] = tag[i];
                out = put_varint(out + tag_len, data);
            }
            for (Py_ssize_t k = 0; k < count; k++) {
                const Column *c = columns[k];
                if (c->width == 1 && c->kind == KIND_F64) { /* the usual feature column */
                    out[0] = 0x09;
                    memcpy(out + 1, AT(c, r), 8); /* little-endian hosts only: checked at import */
                    out += 9;
                } else if (c->width == 1 && c->kind == KIND_OBJECT && c->texts[r].len < 0x80) { /* a category level */
                    const char *text = c->texts[r].data;
                    const Py_ssize_t len = c->texts[r].len;
                    out[0] = 0x0A;
                    out[1] = (char)len;
                    out += 2;
                    for (Py_ssize_t b = 0; b < len; b++) /* a few bytes: no call */
                        out[b] = text[b];
                    out += len;
                } else {
                    out = put_column_row(out, c, r, c->texts);
                }
            }
        }
    }
    return out;
}

/* The element kind of a buffer format (numpy's, as PEP 3118 writes it), or -1. */
static int kind_of_format(const char *fmt, Py_ssize_t itemsize) {
    if (fmt == NULL)
        return -1;
    if (fmt[0] == '<' || fmt[0] == '=' || fmt[0] == '@' || fmt[0] == '|')
        fmt++;
    if (fmt[0] == '\0' || fmt[1] != '\0')
        return -1;
    switch (fmt[0]) {
    case 'd': return itemsize == 8 ? KIND_F64 : -1;
    case 'f': return itemsize == 4 ? KIND_F32 : -1;
    case 'e': return itemsize == 2 ? KIND_F16 : -1;
    case 'b': case 'h': case 'i': case 'l': case 'q': return KIND_SIGNED;
    case 'B': case 'H': case 'I': case 'L': case 'Q': case '?': return KIND_UNSIGNED;
    case 'O': return itemsize == (Py_ssize_t)sizeof(PyObject *) ? KIND_OBJECT : -1;
    default: return -1;
    }
}

/* Bytes between consecutive elements of a buffer read in record-major order: a 1-D buffer with
 * any stride, or a C-contiguous one of any shape; -1 for anything else. */
static Py_ssize_t element_stride(const Py_buffer *view) {
    if (view->len <= view->itemsize) /* one element or none: no step (numpy may report any stride) */
        return view->itemsize;
    if (view->ndim <= 1)
        return view->strides != NULL && view->ndim == 1 ? view->strides[0] : view->itemsize;
    return PyBuffer_IsContiguous(view, 'C') ? view->itemsize : -1;
}

/* The ForestFlow type of a column kind (schema_datum._ff_type's mapping). */
static int ff_type_of(const Py_buffer *view, int kind) { /* view: a readable one (see element_stride) */
    char code;
    switch (kind) {
    case KIND_F64: return FF_FLOAT64;
    case KIND_F32: return FF_FLOAT32;
    case KIND_F16: return FF_FLOAT16;
    case KIND_OBJECT: {
        PyObject *first;
        if (view->len == 0)
            return FF_STRING;
        first = *(PyObject *const *)view->buf;
        return PyBytes_Check(first) || PyByteArray_Check(first) ? FF_BYTES : FF_STRING;
    }
    default:
        code = view->format[0] == '<' || view->format[0] == '=' || view->format[0] == '@' || view->format[0] == '|'
                   ? view->format[1] : view->format[0];
        if (code == '?')
            return FF_BOOL;
        if (kind == KIND_SIGNED)
            return view->itemsize == 1 ? FF_INT8 : view->itemsize == 2 ? FF_INT16 : view->itemsize == 4 ? FF_INT32 : FF_INT64;
        return view->itemsize <= 2 ? FF_INT32 : FF_INT64; /* unsigned: widened to the next signed type */
    }
}

/* Per ForestFlow type code: the TensorType enum number and the key of its Tensor oneof field
 * (set once by set_types() from the generated protobuf module, so no field number lives here). */
static uint64_t type_number[FF_BYTES + 1];
static char tensor_key[FF_BYTES + 1][4];
static Py_ssize_t tensor_key_len[FF_BYTES + 1];
static int types_set = 0;

PyDoc_STRVAR(set_types_doc,
"set_types(table)\n\n"
"``table``: per ForestFlow type code (schema_datum.FF_DTYPES order), a (TensorType number, Tensor\n"
"oneof field key bytes) pair. message() needs it.");

static PyObject *set_types(PyObject *Py_UNUSED(self), PyObject *table) {
    Py_ssize_t i;
    if (!PyTuple_Check(table) || PyTuple_GET_SIZE(table) != FF_BYTES + 1) {
        PyErr_SetString(PyExc_TypeError, "set_types() takes a tuple of 10 (number, key) pairs");
        return NULL;
    }
    for (i = 0; i <= FF_BYTES; i++) {
        PyObject *pair = PyTuple_GET_ITEM(table, i);
        unsigned long long number;
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyLong_Check(PyTuple_GET_ITEM(pair, 0)) ||
            !PyBytes_Check(PyTuple_GET_ITEM(pair, 1)) || PyBytes_GET_SIZE(PyTuple_GET_ITEM(pair, 1)) < 1 ||
            PyBytes_GET_SIZE(PyTuple_GET_ITEM(pair, 1)) > 3) {
            PyErr_SetString(PyExc_TypeError, "set_types() takes (int, bytes of 1-3) pairs");
            return NULL;
        }
        number = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(pair, 0));
        if (PyErr_Occurred())
            return NULL;
        type_number[i] = number;
        tensor_key_len[i] = PyBytes_GET_SIZE(PyTuple_GET_ITEM(pair, 1));
        memcpy(tensor_key[i], PyBytes_AS_STRING(PyTuple_GET_ITEM(pair, 1)), (size_t)tensor_key_len[i]);
    }
    types_set = 1;
    Py_RETURN_NONE;
}

/* Size of a map<string, string> written as repeated entries (InferenceRequest.configs). */
static int map_size(PyObject *mapping, size_t *size) {
    Py_ssize_t pos = 0, klen, vlen;
    PyObject *k, *v;
    size_t total = 0, entry;
    while (PyDict_Next(mapping, &pos, &k, &v)) {
        if (!PyUnicode_Check(k) || !PyUnicode_Check(v)) {
            PyErr_SetString(PyExc_TypeError, "configs must be a dict of str to str");
            return -1;
        }
        if (PyUnicode_AsUTF8AndSize(k, &klen) == NULL || PyUnicode_AsUTF8AndSize(v, &vlen) == NULL)
            return -1;
        entry = 2 + varint_len((uint64_t)klen) + (size_t)klen + varint_len((uint64_t)vlen) + (size_t)vlen;
        total += 1 + varint_len(entry) + entry;
    }
    *size = total;
    return 0;
}

static char *put_map(char *out, char tag, PyObject *mapping) { /* after map_size() succeeded */
    Py_ssize_t pos = 0, klen, vlen;
    PyObject *k, *v;
    while (PyDict_Next(mapping, &pos, &k, &v)) {
        const char *kd = PyUnicode_AsUTF8AndSize(k, &klen), *vd = PyUnicode_AsUTF8AndSize(v, &vlen);
        size_t entry = 2 + varint_len((uint64_t)klen) + (size_t)klen + varint_len((uint64_t)vlen) + (size_t)vlen;
        *out++ = tag;
        out = put_varint(out, entry);
        *out++ = 0x0A;
        out = put_delimited(out, kd, (size_t)klen);
        *out++ = 0x12;
        out = put_delimited(out, vd, (size_t)vlen);
    }
    return out;
}

/* The buffer format of a numpy type number (what its buffer would carry), or NULL for a type written otherwise. */
static const char *numpy_format(int type_num) {
    switch (type_num) {
    case ND_DOUBLE: return "d";
    case ND_FLOAT: return "f";
    case ND_HALF: return "e";
    case ND_BYTE: return "b";
    case ND_SHORT: return "h";
    case ND_INT: return "i";
    case ND_LONG: return "l";
    case ND_LONGLONG: return "q";
    case ND_UBYTE: return "B";
    case ND_USHORT: return "H";
    case ND_UINT: return "I";
    case ND_ULONG: return "L";
    case ND_ULONGLONG: return "Q";
    case ND_BOOL: return "?";
    case ND_OBJECT: return "O";
    default: return NULL;
    }
}

/* A numpy array's memory described as its buffer would be, read straight from the array: numpy
 * builds a buffer's format and shape for every new array, which costs more than writing a small
 * column. 0 when the array is of a type or byte order the buffer path would refuse too. */
static int view_of_array(const NdArray *array, Py_buffer *view) {
    int type_num = array->descr->type_num;
    const char *format = numpy_format(type_num);
    Py_ssize_t count = 1;
    if (format == NULL || array->descr->byteorder == '>') /* big-endian ('>'): the host is little-endian */
        return 0;
    for (int d = 0; d < array->nd; d++)
        count *= array->dimensions[d];
    memset(view, 0, sizeof(*view));
    view->buf = array->data;
    view->itemsize = nd_itemsizes[type_num];
    view->len = count * view->itemsize;
    view->readonly = 1;
    view->ndim = array->nd;
    view->format = (char *)format;
    view->shape = array->dimensions;
    view->strides = array->strides;
    return 1;
}

/* Reads a column (a numpy array straight from its fields, anything else through its buffer); 1 when
 * it can be written as it is, 0 when it cannot (the caller converts it and calls again), -1 on error. */
static int open_column(PyObject *array, Column *c, Py_ssize_t rows, int *code) {
    if (nd_check(array)) {
        if (!view_of_array((const NdArray *)array, &c->view))
            return 0;
    } else if (PyObject_GetBuffer(array, &c->view, PyBUF_RECORDS_RO) < 0) {
        PyErr_Clear();
        return 0;
    } else {
        c->has_view = 1;
    }
    c->itemsize = c->view.itemsize;
    c->stride = element_stride(&c->view);
    c->kind = kind_of_format(c->view.format, c->itemsize);
    if (c->kind < 0 || c->stride < 0)
        return 0;
    *code = ff_type_of(&c->view, c->kind);
    c->text = *code == FF_STRING ? TEXT_STR : *code == FF_BYTES ? TEXT_BYTES : TEXT_ANY;
    if (c->itemsize <= 0 || c->view.len % c->itemsize != 0 || (rows > 0 && (c->view.len / c->itemsize) % rows != 0) ||
        (rows == 0 && c->view.len != 0)) {
        PyErr_Format(PyExc_ValueError, "a column of %zd values does not split into %zd records", c->view.len / c->itemsize, rows);
        return -1;
    }
    c->width = rows > 0 ? c->view.len / c->itemsize / rows : 0;
    if (c->kind == KIND_UNSIGNED && c->itemsize == 8) { /* Int64 cannot hold 2^63 and above: the caller writes those as text */
        Py_ssize_t n = c->view.len / c->itemsize;
        for (Py_ssize_t i = 0; i < n; i++)
            if (varint_value(c, i) > (uint64_t)INT64_MAX)
                return 0;
    }
    return 1;
}

PyDoc_STRVAR(message_doc,
"message(outer, prefix, schema_tag, datum_tag, rows, columns, configs[, flat_only[, before, after]]) -> bytes or None\n\n"
"A ForestFlow message holding a frame (InferenceRequest or Prediction): ``prefix`` (fields written\n"
"first, e.g. a Prediction's fqrv), one TensorSchema entry per type group of the columns (groups in\n"
"order of first appearance) as field ``schema_tag``, every record as a Datum in field ``datum_tag``\n"
"(per group a Tensor of the record's elements, columns in order) and, unless ``configs`` is None,\n"
"that dict of str as map entries in field 3. With a non-empty ``outer`` (a field key) the message is\n"
"returned as that length-delimited field. ``columns`` is a dict of str to arrays of ``rows`` records\n"
"each (-1: as many as the first column has), in column order (a frame's own dict, passed as it is). None when a column cannot be read as it is (strided matrix, text of\n"
"fixed width, another byte order): convert it (contiguous, native, text as objects) and call again.\n"
"With an eighth argument ``flat_only`` true, None also when a column has more than one dimension.\n"
"With ``before`` and ``after`` (bytes), the message comes between them in one buffer (an event's\n"
"head and its next field: the event without a join copying the message again).");

/* METH_FASTCALL arguments, checked one by one: PyArg_ParseTuple's format parsing costs more than a
 * small message's writing (these run once or twice per logged prediction). */
static int arg_count(const char *fn, Py_ssize_t nargs, Py_ssize_t want) {
    if (nargs == want)
        return 0;
    PyErr_Format(PyExc_TypeError, "%s() takes exactly %zd arguments (%zd given)", fn, want, nargs);
    return -1;
}

static int bytes_arg(const char *fn, int at, PyObject *arg, const char **data, Py_ssize_t *len) {
    if (!PyBytes_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "%s() argument %d must be bytes, not %.50s", fn, at, Py_TYPE(arg)->tp_name);
        return -1;
    }
    *data = PyBytes_AS_STRING(arg);
    *len = PyBytes_GET_SIZE(arg);
    return 0;
}

static int long_arg(const char *fn, int at, PyObject *arg, long long *value) {
    if (!PyLong_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "%s() argument %d must be int, not %.50s", fn, at, Py_TYPE(arg)->tp_name);
        return -1;
    }
    *value = as_long_long(arg);
    return *value == -1 && PyErr_Occurred() ? -1 : 0;
}

/* Columns and records of the usual small message, held on the stack (no allocation per call). */
#define SMALL_COLUMNS 32
#define SMALL_ROWS 16
/* Text elements held on the stack (more are allocated). */
#define SMALL_TEXTS 256

static PyObject *message(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    const char *outer, *prefix, *name_data[SMALL_COLUMNS], **names_utf8 = NULL;
    Py_ssize_t outer_len, prefix_len, rows, n, i, k, r, g, n_groups = 0, pos = 0, *name_len = NULL;
    Py_ssize_t small_name_len[SMALL_COLUMNS + 1];
    long long schema_tag, datum_tag, rows_arg;
    int status = 1, group_of_code[FF_BYTES + 1], group_code[FF_BYTES + 1], small, small_codes[SMALL_COLUMNS + 1];
    PyObject *columns, *configs, *name, *array, *result = NULL;
    Column *cols = NULL, **ordered = NULL, small_cols[SMALL_COLUMNS + 1], *small_ordered[SMALL_COLUMNS + 1];
    Group groups[FF_BYTES + 1];
    size_t *data_len = NULL, small_data_len[SMALL_ROWS * (FF_BYTES + 2) + 1];
    size_t fixed[FF_BYTES + 1], schema_entry[FF_BYTES + 1], schema_total = 0, datums_total = 0, map_total = 0, body, total;
    int *codes = NULL, variable[FF_BYTES + 1];
    Text small_texts[SMALL_TEXTS], *texts = NULL;
    char *out;

    int flat_only = 0;
    const char *before = NULL, *after = NULL;
    Py_ssize_t before_len = 0, after_len = 0;
    if (nargs == 10) { /* before, after: written around the message */
        if (bytes_arg("message", 9, args[8], &before, &before_len) < 0 || bytes_arg("message", 10, args[9], &after, &after_len) < 0)
            return NULL;
        nargs = 8;
    }
    if (nargs == 8) { /* flat_only: None for a column of more than one dimension */
        flat_only = PyObject_IsTrue(args[7]);
        if (flat_only < 0)
            return NULL;
        nargs = 7;
    }
    if (arg_count("message", nargs, 7) < 0 || bytes_arg("message", 1, args[0], &outer, &outer_len) < 0 ||
        bytes_arg("message", 2, args[1], &prefix, &prefix_len) < 0 || long_arg("message", 3, args[2], &schema_tag) < 0 ||
        long_arg("message", 4, args[3], &datum_tag) < 0 || long_arg("message", 5, args[4], &rows_arg) < 0)
        return NULL;
    columns = args[5];
    configs = args[6];
    if (!PyDict_Check(columns)) {
        PyErr_Format(PyExc_TypeError, "message() argument 6 must be dict, not %.50s", Py_TYPE(columns)->tp_name);
        return NULL;
    }
    if (!types_set) {
        PyErr_SetString(PyExc_RuntimeError, "message() needs set_types() first");
        return NULL;
    }
    n = PyDict_GET_SIZE(columns);
    if (rows_arg == -1) { /* the length of the first column, as Frame.num_rows has it */
        PyObject *first_name, *first = NULL;
        Py_ssize_t first_pos = 0;
        rows_arg = 0;
        if (PyDict_Next(columns, &first_pos, &first_name, &first) && (rows_arg = PyObject_Length(first)) < 0)
            return NULL;
    }
    if (rows_arg < 0) {
        PyErr_SetString(PyExc_ValueError, "rows must not be negative");
        return NULL;
    }
    if (rows_arg > PY_SSIZE_T_MAX / (FF_BYTES + 2) - 1) {
        PyErr_SetString(PyExc_OverflowError, "rows is too large");
        return NULL;
    }
    rows = (Py_ssize_t)rows_arg;
    if (configs != Py_None && !PyDict_Check(configs)) {
        PyErr_SetString(PyExc_TypeError, "configs must be a dict of str to str or None");
        return NULL;
    }
    if (outer_len > 3 || schema_tag < 1 || schema_tag > 127 || datum_tag < 1 || datum_tag > 127) {
        PyErr_SetString(PyExc_ValueError, "field keys are single bytes, the outer one up to 3");
        return NULL;
    }
    small = n <= SMALL_COLUMNS && rows <= SMALL_ROWS;
    if (small) {
        names_utf8 = name_data;
        name_len = small_name_len;
        cols = small_cols;
        ordered = small_ordered;
        codes = small_codes;
        data_len = small_data_len;
    } else {
        names_utf8 = PyMem_Calloc((size_t)n + 1, sizeof(char *));
        name_len = PyMem_Calloc((size_t)n + 1, sizeof(Py_ssize_t));
        cols = PyMem_Calloc((size_t)n + 1, sizeof(Column));
        ordered = PyMem_Calloc((size_t)n + 1, sizeof(Column *));
        codes = PyMem_Calloc((size_t)n + 1, sizeof(int));
        /* Not zeroed (kilobytes at 100 rows): the sizing pass writes every entry before it is read. */
        data_len = PyMem_Malloc(((size_t)rows * (FF_BYTES + 2) + 1) * sizeof(size_t));
    }
    if (names_utf8 == NULL || name_len == NULL || cols == NULL || ordered == NULL || codes == NULL || data_len == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (i = 0; i < n; i++) { /* what the clean-up reads (no memset of whole columns: kilobytes per call) */
        cols[i].has_view = 0;
        cols[i].texts = NULL;
    }
    /* Borrowed keys and values: nothing below runs Python code, so the dict cannot change meanwhile. */
    for (i = 0; i < n && PyDict_Next(columns, &pos, &name, &array); i++) {
        if (!PyUnicode_Check(name)) {
            PyErr_SetString(PyExc_TypeError, "column names must be str");
            goto done;
        }
        if (PyUnicode_IS_COMPACT_ASCII(name)) { /* its characters are its UTF-8: no call */
            name_len[i] = PyUnicode_GET_LENGTH(name);
            names_utf8[i] = (const char *)PyUnicode_DATA(name);
        } else if ((names_utf8[i] = PyUnicode_AsUTF8AndSize(name, &name_len[i])) == NULL) {
            goto done;
        }
        status = open_column(array, &cols[i], rows, &codes[i]);
        if (status > 0 && flat_only && cols[i].view.ndim > 1)
            status = 0;
        if (status <= 0)
            goto done;
    }

    /* Type groups in order of first appearance; columns in group order. */
    for (g = 0; g <= FF_BYTES; g++)
        group_of_code[g] = -1;
    for (i = 0; i < n; i++) {
        if (group_of_code[codes[i]] < 0) {
            group_of_code[codes[i]] = (int)n_groups;
            group_code[n_groups] = codes[i];
            groups[n_groups].count = 0;
            n_groups++;
        }
        groups[group_of_code[codes[i]]].count++;
    }
    for (g = 0, k = 0; g < n_groups; g++) {
        size_t entry = 1 + varint_len(type_number[group_code[g]]);
        groups[g].first = k;
        groups[g].tag = tensor_key[group_code[g]];
        groups[g].tag_len = tensor_key_len[group_code[g]];
        fixed[g] = 0;
        variable[g] = 0;
        for (i = 0; i < n; i++) {
            if (codes[i] != group_code[g])
                continue;
            ordered[k++] = &cols[i];
            entry += 1 + varint_len((uint64_t)name_len[i]) + (size_t)name_len[i];
            if (cols[i].kind == KIND_F64)
                fixed[g] += (size_t)cols[i].width * 9;
            else if (cols[i].kind == KIND_F32 || cols[i].kind == KIND_F16)
                fixed[g] += (size_t)cols[i].width * 5;
            else
                variable[g] = 1;
        }
        schema_entry[g] = entry;
        groups[g].head_len = 0;
        if (!variable[g]) {
            char *h = groups[g].head;
            size_t tensor = (size_t)groups[g].tag_len + varint_len(fixed[g]) + fixed[g];
            *h++ = 0x0A; /* Datum.tensors */
            h = put_varint(h, tensor);
            memcpy(h, groups[g].tag, (size_t)groups[g].tag_len);
            h = put_varint(h + groups[g].tag_len, fixed[g]);
            groups[g].head_len = h - groups[g].head;
        }
        schema_total += 1 + varint_len(entry) + entry;
    }

    /* Sizing pass: every length prefix is known before anything is written. Column by column (each
     * text element read once, kept for the writing pass), then record by record. */
    if (n_groups > 0 && rows > 0) {
        size_t n_texts = 0, used = 0;
        for (i = 0; i < n; i++)
            if (cols[i].kind == KIND_OBJECT)
                n_texts += (size_t)(cols[i].view.len / cols[i].itemsize);
        texts = n_texts <= SMALL_TEXTS ? small_texts : PyMem_Malloc(n_texts * sizeof(Text));
        if (texts == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        /* Group by group: record by record, GCC makes each record's few entries a copy (rep movsq), whose
         * start-up cost ~30% of the whole sizing pass at 100 rows. */
        for (g = 0; g < n_groups; g++) {
            const size_t length = fixed[g];
            for (r = 0; r < rows; r++)
                data_len[r * n_groups + g] = length;
        }
        for (g = 0; g < n_groups; g++) {
            if (!variable[g])
                continue;
            for (k = 0; k < groups[g].count; k++) {
                Column *c = ordered[groups[g].first + k];
                if (c->kind == KIND_F64 || c->kind == KIND_F32 || c->kind == KIND_F16)
                    continue;
                if (c->kind == KIND_OBJECT) {
                    c->texts = texts + used;
                    used += (size_t)(c->view.len / c->itemsize);
                }
                if (add_column_sizes(c, rows, &data_len[g], n_groups, c->texts) < 0)
                    goto done;
            }
        }
        for (r = 0; r < rows; r++) {
            size_t datum = 0;
            for (g = 0; g < n_groups; g++) {
                size_t data = data_len[r * n_groups + g], tensor = (size_t)groups[g].tag_len + varint_len(data) + data;
                datum += 1 + varint_len(tensor) + tensor;
            }
            data_len[rows * n_groups + r] = datum; /* kept for the writing pass */
            datums_total += 1 + varint_len(datum) + datum;
        }
    }
    if (configs != Py_None && map_size(configs, &map_total) < 0)
        goto done;

    body = (size_t)prefix_len + schema_total + datums_total + map_total;
    total = body + (outer_len ? (size_t)outer_len + varint_len(body) : 0);
    result = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(total + (size_t)before_len + (size_t)after_len));
    if (result == NULL)
        goto done;
    out = PyBytes_AS_STRING(result);
    if (before_len) {
        memcpy(out, before, (size_t)before_len);
        out += before_len;
    }
    if (after_len) /* the message's end is known: total bytes past its start */
        memcpy(out + total, after, (size_t)after_len);
    if (outer_len) {
        memcpy(out, outer, (size_t)outer_len);
        out = put_varint(out + outer_len, body);
    }
    memcpy(out, prefix, (size_t)prefix_len);
    out += prefix_len;
    for (g = 0; g < n_groups; g++) {
        *out++ = (char)schema_tag;
        out = put_varint(out, schema_entry[g]);
        *out++ = 0x08; /* TensorSchema.type */
        out = put_varint(out, type_number[group_code[g]]);
        for (k = 0; k < groups[g].count; k++) {
            Py_ssize_t at = ordered[groups[g].first + k] - cols;
            *out++ = 0x12; /* TensorSchema.fields */
            out = put_delimited(out, names_utf8[at], (size_t)name_len[at]);
        }
    }
    if (n_groups > 0)
        out = put_datums(out, (char)datum_tag, rows, n_groups, groups, ordered, data_len);
    if (configs != Py_None)
        out = put_map(out, 0x1A, configs); /* InferenceRequest.configs */

done:
    if (cols != NULL)
        for (i = 0; i < n; i++)
            if (cols[i].has_view)
                PyBuffer_Release(&cols[i].view);
    if (texts != small_texts)
        PyMem_Free(texts);
    if (!small) {
        PyMem_Free((void *)names_utf8);
        PyMem_Free(name_len);
        PyMem_Free(cols);
        PyMem_Free(ordered);
        PyMem_Free(codes);
        PyMem_Free(data_len);
    }
    if (PyErr_Occurred()) {
        Py_CLEAR(result);
        return NULL;
    }
    if (status == 0 && result == NULL)
        Py_RETURN_NONE;
    return result;
}

PyDoc_STRVAR(varint_doc,
"varint(value) -> bytes\n\n"
"The protobuf base-128 varint of an int (negative numbers as their 64-bit two's complement).");

static PyObject *varint(PyObject *Py_UNUSED(self), PyObject *value) {
    char buf[10];
    uint64_t bits;
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (v == -1 && PyErr_Occurred())
        return NULL;
    if (overflow > 0) { /* 2**63 and up: as unsigned, if it fits */
        bits = PyLong_AsUnsignedLongLong(value);
        if (bits == (uint64_t)-1 && PyErr_Occurred())
            return NULL;
    } else if (overflow < 0) {
        PyErr_SetString(PyExc_OverflowError, "varint() takes values from -2**63 to 2**64-1");
        return NULL;
    } else {
        bits = (uint64_t)v;
    }
    return PyBytes_FromStringAndSize(buf, put_varint(buf, bits) - buf);
}

PyDoc_STRVAR(event_head_doc,
"event_head(head, event_time_ms, request_id, fqrv_field, latency_ms, status, tail) -> bytes\n\n"
"A prediction event's fields 2-17 in field order: ``head`` (servedRequest and loggingSettings, as\n"
"written), eventTimeMS (10), requestId (11), ``fqrv_field`` (12, as written), latencyMs (13),\n"
"status (14), then ``tail`` (error, errorCode and protocol, as written).");

PyDoc_STRVAR(wire_event_doc,
"wire_event(head, event_time_ms, request_id, fqrv_field, latency_ms, status, tail, request, response,\n"
"           request_json_length, response_json_length) -> bytes\n\n"
"event_head()'s fields, then a V2 event's wireRequest (18, ``request``), wireResponse (19, ``response``)\n"
"and the JSON lengths (20, 21), each unless None, in one buffer: a wire event whole, or event_head()'s\n"
"bytes when all four are None.");

PyDoc_STRVAR(graphpipe_event_doc,
"graphpipe_event(head, event_time_ms, request_id, fqrv_field, latency_ms, status, tail, infer_bytes,\n"
"                infer_response, prediction_fqrv) -> bytes\n\n"
"A whole PredictionEventGP in one buffer: event_head()'s fields, then inferBytes (3, ``infer_bytes``, the\n"
"GraphPipe request as it came) and, unless ``infer_response`` is None, prediction (1): a message of\n"
"inferResponse (1, ``infer_response``) and ``prediction_fqrv`` (its fqrv field 2, as written). The\n"
"fields come in that order (3 after 17, 1 last), as the events were always written.");

/* A wire body or None (absent): its bytes. */
static int optional_bytes(const char *fn, int at, PyObject *arg, const char **data, Py_ssize_t *len) {
    if (arg == Py_None) {
        *data = NULL;
        *len = 0;
        return 0;
    }
    return bytes_arg(fn, at, arg, data, len);
}

/* An optional varint field's value: 0 when absent (None), else 1 and the value. */
static int optional_long(const char *fn, int at, PyObject *arg, long long *value) {
    if (arg == Py_None)
        return 0;
    return long_arg(fn, at, arg, value) < 0 ? -1 : 1;
}

/* What follows event_head()'s fields: nothing, a V2 event's wire fields, or a GraphPipe event's fields. */
enum { EVENT_HEAD, EVENT_WIRE, EVENT_GRAPHPIPE };

static PyObject *head_and_wire(const char *fn, PyObject *const *args, Py_ssize_t nargs, int kind) {
    const char *head, *request_id, *fqrv, *tail, *request = NULL, *response = NULL, *prediction_fqrv = NULL;
    Py_ssize_t head_len, request_id_len, fqrv_len, tail_len, request_len = 0, response_len = 0, prediction_fqrv_len = 0, size;
    Py_ssize_t prediction_len = 0; /* a GraphPipe event's prediction message */
    const int wire = kind == EVENT_WIRE;
    long long event_time, status_arg, request_json_length = 0, response_json_length = 0;
    int has_request_json = 0, has_response_json = 0;
    double latency;
    int status;
    uint64_t latency_bits;
    PyObject *result;
    char *out;
    if (arg_count(fn, nargs, kind == EVENT_WIRE ? 11 : kind == EVENT_GRAPHPIPE ? 10 : 7) < 0 ||
        bytes_arg(fn, 1, args[0], &head, &head_len) < 0 ||
        long_arg(fn, 2, args[1], &event_time) < 0)
        return NULL;
    if (!PyUnicode_Check(args[2])) {
        PyErr_Format(PyExc_TypeError, "%s() argument 3 must be str, not %.50s", fn, Py_TYPE(args[2])->tp_name);
        return NULL;
    }
    if ((request_id = PyUnicode_AsUTF8AndSize(args[2], &request_id_len)) == NULL ||
        bytes_arg(fn, 4, args[3], &fqrv, &fqrv_len) < 0)
        return NULL;
    latency = PyFloat_AsDouble(args[4]); /* a float, or anything with __float__ / __index__ */
    if (latency == -1.0 && PyErr_Occurred())
        return NULL;
    if (long_arg(fn, 6, args[5], &status_arg) < 0 || bytes_arg(fn, 7, args[6], &tail, &tail_len) < 0)
        return NULL;
    if (status_arg < INT32_MIN || status_arg > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "status is an int32");
        return NULL;
    }
    status = (int)status_arg;
    size = head_len + 1 + (Py_ssize_t)varint_len((uint64_t)event_time) + 1 + (Py_ssize_t)varint_len((uint64_t)request_id_len) +
           request_id_len + fqrv_len + 1 + 8 + 1 + (Py_ssize_t)varint_len((uint64_t)(int64_t)status) + tail_len;
    if (wire) {
        if (optional_bytes(fn, 8, args[7], &request, &request_len) < 0 || optional_bytes(fn, 9, args[8], &response, &response_len) < 0 ||
            (has_request_json = optional_long(fn, 10, args[9], &request_json_length)) < 0 ||
            (has_response_json = optional_long(fn, 11, args[10], &response_json_length)) < 0)
            return NULL;
        if (request != NULL)
            size += 2 + (Py_ssize_t)varint_len((uint64_t)request_len) + request_len;
        if (response != NULL)
            size += 2 + (Py_ssize_t)varint_len((uint64_t)response_len) + response_len;
        if (has_request_json)
            size += 2 + (Py_ssize_t)varint_len((uint64_t)request_json_length);
        if (has_response_json)
            size += 2 + (Py_ssize_t)varint_len((uint64_t)response_json_length);
    } else if (kind == EVENT_GRAPHPIPE) {
        if (bytes_arg(fn, 8, args[7], &request, &request_len) < 0 || optional_bytes(fn, 9, args[8], &response, &response_len) < 0 ||
            bytes_arg(fn, 10, args[9], &prediction_fqrv, &prediction_fqrv_len) < 0)
            return NULL;
        size += 1 + (Py_ssize_t)varint_len((uint64_t)request_len) + request_len;
        if (response != NULL) {
            prediction_len = 1 + (Py_ssize_t)varint_len((uint64_t)response_len) + response_len + prediction_fqrv_len;
            size += 1 + (Py_ssize_t)varint_len((uint64_t)prediction_len) + prediction_len;
        }
    }
    result = PyBytes_FromStringAndSize(NULL, size);
    if (result == NULL)
        return NULL;
    out = PyBytes_AS_STRING(result);
    memcpy(out, head, (size_t)head_len);
    out += head_len;
    *out++ = 0x50; /* 10: eventTimeMS, varint */
    out = put_varint(out, (uint64_t)event_time);
    *out++ = 0x5A; /* 11: requestId, length-delimited */
    out = put_delimited(out, request_id, (size_t)request_id_len);
    memcpy(out, fqrv, (size_t)fqrv_len);
    out += fqrv_len;
    *out++ = 0x69; /* 13: latencyMs, fixed64 (little-endian host, checked at import) */
    memcpy(&latency_bits, &latency, 8);
    memcpy(out, &latency_bits, 8);
    out += 8;
    *out++ = 0x70; /* 14: status, varint (int32: negative as 64-bit two's complement) */
    out = put_varint(out, (uint64_t)(int64_t)status);
    memcpy(out, tail, (size_t)tail_len);
    out += tail_len;
    if (wire) { /* keys of fields 18-21: (number << 3 | wire type) as two-byte varints */
        if (request != NULL) {
            *out++ = (char)0x92, *out++ = 0x01; /* 18: wireRequest, length-delimited */
            out = put_delimited(out, request, (size_t)request_len);
        }
        if (response != NULL) {
            *out++ = (char)0x9A, *out++ = 0x01; /* 19: wireResponse, length-delimited */
            out = put_delimited(out, response, (size_t)response_len);
        }
        if (has_request_json) {
            *out++ = (char)0xA0, *out++ = 0x01; /* 20: wireRequestJsonLength, varint */
            out = put_varint(out, (uint64_t)request_json_length);
        }
        if (has_response_json) {
            *out++ = (char)0xA8, *out++ = 0x01; /* 21: wireResponseJsonLength, varint */
            out = put_varint(out, (uint64_t)response_json_length);
        }
    } else if (kind == EVENT_GRAPHPIPE) {
        *out++ = 0x1A; /* 3: inferBytes, length-delimited */
        out = put_delimited(out, request, (size_t)request_len);
        if (response != NULL) {
            *out++ = 0x0A; /* 1: prediction, length-delimited */
            out = put_varint(out, (uint64_t)prediction_len);
            *out++ = 0x0A; /* its 1: inferResponse, length-delimited */
            out = put_delimited(out, response, (size_t)response_len);
            memcpy(out, prediction_fqrv, (size_t)prediction_fqrv_len);
            out += prediction_fqrv_len;
        }
    }
    return result;
}

static PyObject *event_head(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    return head_and_wire("event_head", args, nargs, EVENT_HEAD);
}

static PyObject *wire_event(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    return head_and_wire("wire_event", args, nargs, EVENT_WIRE);
}

static PyObject *graphpipe_event(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    return head_and_wire("graphpipe_event", args, nargs, EVENT_GRAPHPIPE);
}

PyDoc_STRVAR(read_varint_doc,
"read_varint(data, pos) -> (value, next_pos)\n\n"
"The protobuf varint of a bytes-like object at pos, and the position after it. ValueError if it is cut short.");

static PyObject *read_varint(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    Py_buffer view;
    uint64_t value = 0;
    size_t taken = 0;
    Py_ssize_t pos;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "read_varint() takes exactly 2 arguments (data, pos)");
        return NULL;
    }
    pos = PyLong_AsSsize_t(args[1]);
    if (pos == -1 && PyErr_Occurred())
        return NULL;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (pos >= 0 && pos < view.len)
        taken = get_varint((const unsigned char *)view.buf + pos, (size_t)(view.len - pos), &value);
    PyBuffer_Release(&view);
    if (taken == 0) {
        PyErr_Format(PyExc_ValueError, "no whole varint at position %zd", pos);
        return NULL;
    }
    return Py_BuildValue("(Kn)", (unsigned long long)value, pos + (Py_ssize_t)taken);
}

static PyMethodDef methods[] = {
    {"read_varint", (PyCFunction)(void (*)(void))read_varint, METH_FASTCALL, read_varint_doc},
    {"message", (PyCFunction)(void (*)(void))message, METH_FASTCALL, message_doc},
    {"event_head", (PyCFunction)(void (*)(void))event_head, METH_FASTCALL, event_head_doc},
    {"wire_event", (PyCFunction)(void (*)(void))wire_event, METH_FASTCALL, wire_event_doc},
    {"graphpipe_event", (PyCFunction)(void (*)(void))graphpipe_event, METH_FASTCALL, graphpipe_event_doc},
    {"set_types", set_types, METH_O, set_types_doc},
    {"varint", varint, METH_O, varint_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_ffwire", "ForestFlow protobuf messages of a frame (schema, Datum records, configs), written in C.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__ffwire(void) {
    const uint16_t probe = 1;
    if (*(const uint8_t *)&probe != 1) { /* protobuf's fixed-width numbers are little-endian */
        PyErr_SetString(PyExc_ImportError, "forestflow.codecs._ffwire needs a little-endian host");
        return NULL;
    }
    if (nd_init() < 0)
        return NULL;
    return PyModule_Create(&module);
}
