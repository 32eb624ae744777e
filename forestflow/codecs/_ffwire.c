/*
 * forestflow.codecs._ffwire: the records of a frame as ForestFlow protobuf Datum messages.
 *
 * The prediction log writes every BASIC request and its answer to Kafka as ForestFlow's
 * PredictionEvent, where each record is a Datum holding one Tensor per typed group of columns,
 * each element a field of its own (unpacked repeated fields). Assembled in Python this costs a
 * few function calls per record and element, several times the cost of the request itself;
 * here one call writes every Datum of a frame, reading the numpy columns through the buffer
 * protocol (no numpy headers needed). The Python side (ff_protobuf.py) keeps what is about
 * layout (type groups, schema entries) and caches it per layout.
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

/* ForestFlow type codes of kinds(), in the order of schema_datum.FF_DTYPES. */
enum { FF_FLOAT16, FF_FLOAT32, FF_FLOAT64, FF_INT8, FF_INT16, FF_INT32, FF_INT64, FF_STRING, FF_BOOL, FF_BYTES, FF_UNKNOWN = 255 };
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
} Column;

/* Element i of a column (in record-major order). */
#define AT(c, i) ((const char *)(c)->view.buf + (i) * (c)->stride)

typedef struct {
    const char *tag;  /* the Tensor oneof field's key, e.g. "\x5a" */
    Py_ssize_t tag_len;
    Py_ssize_t first; /* index of its first column in the flat column array */
    Py_ssize_t count;
} Group;

static size_t varint_len(uint64_t v) {
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static char *put_varint(char *out, uint64_t v) {
    while (v >= 0x80) {
        *out++ = (char)((v & 0x7F) | 0x80);
        v >>= 7;
    }
    *out++ = (char)v;
    return out;
}

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
    if (PyUnicode_Check(item) && c->text != TEXT_BYTES)
        return PyUnicode_AsUTF8AndSize(item, len); /* cached in the str after the first call */
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

/* Bytes of one record's elements of one column (the column's part of the Tensor's data). */
static int column_row_size(const Column *c, Py_ssize_t row, size_t *size) {
    Py_ssize_t j, start = row * c->width;
    size_t total = 0;
    switch (c->kind) {
    case KIND_F64:
        total = (size_t)c->width * 9;
        break;
    case KIND_F32:
    case KIND_F16:
        total = (size_t)c->width * 5;
        break;
    case KIND_SIGNED:
    case KIND_UNSIGNED:
        for (j = 0; j < c->width; j++)
            total += 1 + varint_len(varint_value(c, start + j));
        break;
    default:
        for (j = 0; j < c->width; j++) {
            Py_ssize_t len;
            if (text_of(c, *(PyObject *const *)AT(c, start + j), &len) == NULL)
                return -1;
            total += 1 + varint_len((uint64_t)len) + (size_t)len;
        }
    }
    *size = total;
    return 0;
}

static char *put_column_row(char *out, const Column *c, Py_ssize_t row) {
    Py_ssize_t j, start = row * c->width;
    for (j = 0; j < c->width; j++) {
        Py_ssize_t i = start + j;
        switch (c->kind) {
        case KIND_F64:
            *out++ = 0x09;
            memcpy(out, AT(c, i), 8); /* little-endian hosts only: checked at import */
            out += 8;
            break;
        case KIND_F32:
            *out++ = 0x0D;
            memcpy(out, AT(c, i), 4);
            out += 4;
            break;
        case KIND_F16: {
            uint16_t h;
            float f;
            memcpy(&h, AT(c, i), 2);
            f = half_to_float(h);
            *out++ = 0x0D;
            memcpy(out, &f, 4);
            out += 4;
            break;
        }
        case KIND_SIGNED:
        case KIND_UNSIGNED:
            *out++ = 0x08;
            out = put_varint(out, varint_value(c, i));
            break;
        default: {
            Py_ssize_t len;
            const char *data = text_of(c, *(PyObject *const *)AT(c, i), &len); /* checked when sized */
            *out++ = 0x0A;
            out = put_varint(out, (uint64_t)len);
            memcpy(out, data, (size_t)len);
            out += len;
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
    if (view->ndim <= 1)
        return view->strides != NULL && view->ndim == 1 ? view->strides[0] : view->itemsize;
    return PyBuffer_IsContiguous(view, 'C') ? view->itemsize : -1;
}

/* The ForestFlow type of a column kind (schema_datum._ff_type's mapping), or FF_UNKNOWN. */
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

static int load_column(PyObject *array, Column *c, Py_ssize_t rows, int text) {
    if (PyObject_GetBuffer(array, &c->view, PyBUF_RECORDS_RO) < 0)
        return -1;
    c->has_view = 1;
    c->itemsize = c->view.itemsize;
    c->stride = element_stride(&c->view);
    if (c->stride < 0) {
        PyErr_SetString(PyExc_TypeError, "a column of more than one dimension must be C-contiguous");
        return -1;
    }
    c->kind = kind_of_format(c->view.format, c->itemsize);
    c->text = text;
    if (c->kind < 0) {
        PyErr_Format(PyExc_TypeError, "unsupported column format '%s'", c->view.format ? c->view.format : "?");
        return -1;
    }
    if (c->itemsize <= 0 || c->view.len % c->itemsize != 0 || (rows > 0 && (c->view.len / c->itemsize) % rows != 0) ||
        (rows == 0 && c->view.len != 0)) {
        PyErr_Format(PyExc_ValueError, "a column of %zd values does not split into %zd records", c->view.len / c->itemsize, rows);
        return -1;
    }
    c->width = rows > 0 ? c->view.len / c->itemsize / rows : 0;
    return 0;
}

PyDoc_STRVAR(kinds_doc,
"kinds(columns) -> bytes\n\n"
"The ForestFlow type of each column as an index into schema_datum.FF_DTYPES, 255 for a column\n"
"datums() cannot read as it is (a strided matrix, text of fixed width, another byte order, ...).");

static PyObject *kinds(PyObject *self, PyObject *columns) {
    Py_ssize_t i, n;
    PyObject *result, *seq = PySequence_Fast(columns, "kinds() takes a sequence of arrays");
    if (seq == NULL)
        return NULL;
    n = PySequence_Fast_GET_SIZE(seq);
    result = PyBytes_FromStringAndSize(NULL, n);
    if (result != NULL) {
        for (i = 0; i < n; i++) {
            Py_buffer view;
            int code = FF_UNKNOWN, kind;
            if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, i), &view, PyBUF_RECORDS_RO) < 0) {
                PyErr_Clear();
            } else {
                kind = kind_of_format(view.format, view.itemsize);
                if (kind >= 0 && element_stride(&view) >= 0)
                    code = ff_type_of(&view, kind);
                PyBuffer_Release(&view);
            }
            PyBytes_AS_STRING(result)[i] = (char)code;
        }
    }
    Py_DECREF(seq);
    return result;
}

PyDoc_STRVAR(datums_doc,
"datums(datum_tag, rows, columns, groups) -> bytes\n\n"
"Every record of a frame as field ``datum_tag`` (one byte) holding a Datum: per group, a\n"
"``tensors`` entry holding the group's Tensor field (``tag``) with the record's elements.\n"
"``columns`` is a list of 1-D arrays (any stride) or C-contiguous ones; ``groups`` a tuple of\n"
"(tag, text, indices): ``text`` 1 for a String group (str elements), 2 for Bytes (bytes elements),\n"
"0 otherwise, ``indices`` a tuple of the group's positions in ``columns``.");

static PyObject *datums(PyObject *self, PyObject *args) {
    const char *datum_tag;
    Py_ssize_t datum_tag_len, rows, n_groups, n_cols = 0, all_cols = 0, g, k, r;
    PyObject *column_list, *group_list, *result = NULL;
    Group *groups = NULL;
    Column *cols = NULL;
    size_t *data_len = NULL, total = 0;
    char *out;

    if (!PyArg_ParseTuple(args, "y#nO!O!:datums", &datum_tag, &datum_tag_len, &rows, &PyList_Type, &column_list,
                          &PyTuple_Type, &group_list))
        return NULL;
    if (rows < 0) {
        PyErr_SetString(PyExc_ValueError, "rows must not be negative");
        return NULL;
    }
    n_groups = PyTuple_GET_SIZE(group_list);
    for (g = 0; g < n_groups; g++) {
        PyObject *spec = PyTuple_GET_ITEM(group_list, g);
        if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 3 || !PyBytes_Check(PyTuple_GET_ITEM(spec, 0)) ||
            !PyLong_Check(PyTuple_GET_ITEM(spec, 1)) || !PyTuple_Check(PyTuple_GET_ITEM(spec, 2))) {
            PyErr_SetString(PyExc_TypeError, "a group is a (tag bytes, text int, tuple of column indices) tuple");
            return NULL;
        }
        n_cols += PyTuple_GET_SIZE(PyTuple_GET_ITEM(spec, 2));
    }
    all_cols = n_cols;
    groups = PyMem_Calloc((size_t)n_groups + 1, sizeof(Group));
    cols = PyMem_Calloc((size_t)n_cols + 1, sizeof(Column));
    data_len = PyMem_Calloc((size_t)(rows * n_groups) + 1, sizeof(size_t));
    if (groups == NULL || cols == NULL || data_len == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    n_cols = 0;
    for (g = 0; g < n_groups; g++) {
        PyObject *spec = PyTuple_GET_ITEM(group_list, g), *indices = PyTuple_GET_ITEM(spec, 2);
        int text = (int)PyLong_AsLong(PyTuple_GET_ITEM(spec, 1));
        groups[g].tag = PyBytes_AS_STRING(PyTuple_GET_ITEM(spec, 0));
        groups[g].tag_len = PyBytes_GET_SIZE(PyTuple_GET_ITEM(spec, 0));
        groups[g].first = n_cols;
        groups[g].count = PyTuple_GET_SIZE(indices);
        for (k = 0; k < groups[g].count; k++, n_cols++) {
            Py_ssize_t at = PyLong_AsSsize_t(PyTuple_GET_ITEM(indices, k));
            if (at == -1 && PyErr_Occurred())
                goto done;
            if (at < 0 || at >= PyList_GET_SIZE(column_list)) {
                PyErr_Format(PyExc_IndexError, "column index %zd out of range", at);
                goto done;
            }
            if (load_column(PyList_GET_ITEM(column_list, at), &cols[n_cols], rows, text) < 0)
                goto done;
        }
    }

    /* Sizing pass: every length prefix is known before anything is written. */
    for (r = 0; r < rows; r++) {
        size_t datum = 0;
        for (g = 0; g < n_groups; g++) {
            size_t data = 0, one, tensor;
            for (k = 0; k < groups[g].count; k++) {
                if (column_row_size(&cols[groups[g].first + k], r, &one) < 0)
                    goto done;
                data += one;
            }
            data_len[r * n_groups + g] = data;
            tensor = (size_t)groups[g].tag_len + varint_len(data) + data;
            datum += 1 + varint_len(tensor) + tensor;
        }
        total += (size_t)datum_tag_len + varint_len(datum) + datum;
    }

    result = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (result == NULL)
        goto done;
    out = PyBytes_AS_STRING(result);
    for (r = 0; r < rows; r++) {
        size_t datum = 0;
        for (g = 0; g < n_groups; g++) {
            size_t data = data_len[r * n_groups + g], tensor = (size_t)groups[g].tag_len + varint_len(data) + data;
            datum += 1 + varint_len(tensor) + tensor;
        }
        memcpy(out, datum_tag, (size_t)datum_tag_len);
        out = put_varint(out + datum_tag_len, datum);
        for (g = 0; g < n_groups; g++) {
            size_t data = data_len[r * n_groups + g], tensor = (size_t)groups[g].tag_len + varint_len(data) + data;
            *out++ = 0x0A; /* Datum.tensors */
            out = put_varint(out, tensor);
            memcpy(out, groups[g].tag, (size_t)groups[g].tag_len);
            out = put_varint(out + groups[g].tag_len, data);
            for (k = 0; k < groups[g].count; k++)
                out = put_column_row(out, &cols[groups[g].first + k], r);
        }
    }

done:
    if (cols != NULL)
        for (k = 0; k < all_cols; k++)  /* a column that failed its checks may hold a view too */
            if (cols[k].has_view)
                PyBuffer_Release(&cols[k].view);
    PyMem_Free(groups);
    PyMem_Free(cols);
    PyMem_Free(data_len);
    if (PyErr_Occurred()) {
        Py_CLEAR(result);
    }
    return result;
}

PyDoc_STRVAR(string_map_doc,
"string_map(tag, mapping) -> bytes\n\n"
"Every entry of a dict of str as field ``tag`` (one byte) holding key (1) and value (2): a protobuf\n"
"map<string, string> (InferenceRequest.configs).");

static PyObject *string_map(PyObject *self, PyObject *args) {
    const char *tag;
    Py_ssize_t tag_len, pos = 0, klen, vlen;
    PyObject *mapping, *k, *v, *result;
    size_t total = 0, entry;
    char *out;
    if (!PyArg_ParseTuple(args, "y#O!:string_map", &tag, &tag_len, &PyDict_Type, &mapping))
        return NULL;
    if (tag_len != 1) {
        PyErr_SetString(PyExc_ValueError, "string_map() takes a one-byte tag");
        return NULL;
    }
    while (PyDict_Next(mapping, &pos, &k, &v)) {
        if (!PyUnicode_Check(k) || !PyUnicode_Check(v)) {
            PyErr_SetString(PyExc_TypeError, "string_map() takes a dict of str to str");
            return NULL;
        }
        if (PyUnicode_AsUTF8AndSize(k, &klen) == NULL || PyUnicode_AsUTF8AndSize(v, &vlen) == NULL)
            return NULL;
        entry = 2 + varint_len((uint64_t)klen) + (size_t)klen + varint_len((uint64_t)vlen) + (size_t)vlen;
        total += 1 + varint_len(entry) + entry;
    }
    result = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (result == NULL)
        return NULL;
    out = PyBytes_AS_STRING(result);
    pos = 0;
    while (PyDict_Next(mapping, &pos, &k, &v)) {
        const char *kd = PyUnicode_AsUTF8AndSize(k, &klen), *vd = PyUnicode_AsUTF8AndSize(v, &vlen);
        entry = 2 + varint_len((uint64_t)klen) + (size_t)klen + varint_len((uint64_t)vlen) + (size_t)vlen;
        *out++ = tag[0];
        out = put_varint(out, entry);
        *out++ = 0x0A;
        out = put_varint(out, (uint64_t)klen);
        memcpy(out, kd, (size_t)klen);
        out += klen;
        *out++ = 0x12;
        out = put_varint(out, (uint64_t)vlen);
        memcpy(out, vd, (size_t)vlen);
        out += vlen;
    }
    return result;
}

PyDoc_STRVAR(varint_doc,
"varint(value) -> bytes\n\n"
"The protobuf base-128 varint of an int (negative numbers as their 64-bit two's complement).");

static PyObject *varint(PyObject *self, PyObject *value) {
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

static PyMethodDef methods[] = {
    {"datums", datums, METH_VARARGS, datums_doc},
    {"kinds", kinds, METH_O, kinds_doc},
    {"varint", varint, METH_O, varint_doc},
    {"string_map", string_map, METH_VARARGS, string_map_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_ffwire", "ForestFlow protobuf Datum records of a frame, written in C.", -1, methods,
};

PyMODINIT_FUNC PyInit__ffwire(void) {
    const uint16_t probe = 1;
    if (*(const uint8_t *)&probe != 1) { /* protobuf's fixed-width numbers are little-endian */
        PyErr_SetString(PyExc_ImportError, "forestflow.codecs._ffwire needs a little-endian host");
        return NULL;
    }
    return PyModule_Create(&module);
}
