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

static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static void put_u32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

PyDoc_STRVAR(read_strings_doc,
"read_strings(buf, start, count) -> list[str] | list[bytes] | None\n\n"
"The ``count`` strings whose uoffsets start at ``start`` in the flatbuffer ``buf``: as str when\n"
"every one is valid UTF-8, else all as bytes; None when an offset or a length points outside\n"
"``buf`` (the caller then says which).");

static PyObject *read_strings(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    const unsigned char *buf;
    Py_ssize_t size, start, count, i;
    int text = 1;
    PyObject *out;
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
        if (text) {
            value = PyUnicode_DecodeUTF8((const char *)buf + at + 4, len, NULL);
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

static PyMethodDef methods[] = {
    {"read_strings", (PyCFunction)(void (*)(void))read_strings, METH_FASTCALL, read_strings_doc},
    {"write_strings", write_strings, METH_O, write_strings_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_ffgp", "GraphPipe flatbuffer string vectors, read and written in C.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__ffgp(void) { return PyModule_Create(&module); }
