/*
 * forestflow.predlog._kafka_records: the records of a Kafka record batch (magic 2), in one call.
 *
 * aiokafka appends records one Python call at a time (a method call, keyword arguments, a
 * metadata object per record); the prediction log hands over hundreds of events a batch, all
 * with the same timestamp, so here one call writes every record of a batch:
 *
 *   length (varint) | attributes 0 | timestampDelta 0 | offsetDelta (varint) |
 *   keyLength (varint, -1 for none) | key | valueLength (varint) | value | headers
 *
 * where headers are the entry's ``headers`` bytes as they are (the header count and each header,
 * already encoded: the CloudEvents headers of predlog/cloudevents.py), a single 0 for none.
 *
 * Every varint is zigzag-encoded, as the Kafka protocol has them. The header and the CRC are
 * written in Python (kafka_batch.py), after compression.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "varint.h"

static uint64_t zigzag(int64_t v) { return ((uint64_t)v << 1) ^ (uint64_t)(v >> 63); }

/* A record's key (None for none), value and encoded headers: new references, released on failure. */
static int key_and_value(PyObject *entry, PyObject *names[3], PyObject **parts) {
    int i;
    for (i = 0; i < 3; i++) {
        parts[i] = PyObject_GetAttr(entry, names[i]);
        if (parts[i] == NULL)
            goto fail;
    }
    if ((parts[0] != Py_None && !PyBytes_Check(parts[0])) || !PyBytes_Check(parts[1]) || !PyBytes_Check(parts[2]) ||
        PyBytes_GET_SIZE(parts[2]) < 1) {
        PyErr_SetString(PyExc_TypeError, "an entry's key must be bytes or None, its value bytes and its headers non-empty bytes");
        goto fail;
    }
    return 0;
fail:
    while (i-- > 0)
        Py_DECREF(parts[i]);
    return -1;
}

/* Bytes of the record at offsetDelta i, without its length prefix. */
static size_t body_len(Py_ssize_t i, PyObject *key, PyObject *value, PyObject *headers) {
    size_t key_len = key == Py_None ? 1 : varint_len(zigzag(PyBytes_GET_SIZE(key))) + (size_t)PyBytes_GET_SIZE(key);
    return 1 + 1 + varint_len(zigzag(i)) + key_len + varint_len(zigzag(PyBytes_GET_SIZE(value))) +
           (size_t)PyBytes_GET_SIZE(value) + (size_t)PyBytes_GET_SIZE(headers);
}

PyDoc_STRVAR(records_doc,
"records(entries) -> bytes\n\n"
"The records section of a Kafka record batch (magic 2) holding ``entries`` in order: each an object\n"
"with ``key`` (bytes or None), ``value`` (bytes) and ``headers`` (the record's headers section,\n"
"encoded; b'\\x00' for none), offset deltas 0..n-1, timestamp delta 0.");

static PyObject *records(PyObject *Py_UNUSED(self), PyObject *entries) {
    static PyObject *names[3] = {NULL, NULL, NULL};
    Py_ssize_t n, i, read = 0;
    size_t total = 0;
    PyObject *seq, **pairs = NULL, *result = NULL; /* pairs: key, value, headers of each entry (new references) */
    char *out;
    if (names[2] == NULL && ((names[0] = PyUnicode_InternFromString("key")) == NULL ||
                             (names[1] = PyUnicode_InternFromString("value")) == NULL ||
                             (names[2] = PyUnicode_InternFromString("headers")) == NULL))
        return NULL;
    seq = PySequence_Fast(entries, "records() takes a sequence of entries");
    if (seq == NULL)
        return NULL;
    n = PySequence_Fast_GET_SIZE(seq);
    pairs = PyMem_Malloc(((size_t)n * 3 + 1) * sizeof(PyObject *));
    if (pairs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (; read < n; read++) {
        size_t body;
        if (key_and_value(PySequence_Fast_GET_ITEM(seq, read), names, &pairs[3 * read]) < 0)
            goto done;
        body = body_len(read, pairs[3 * read], pairs[3 * read + 1], pairs[3 * read + 2]);
        total += varint_len(zigzag((int64_t)body)) + body;
    }
    result = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (result == NULL)
        goto done;
    out = PyBytes_AS_STRING(result);
    for (i = 0; i < n; i++) {
        PyObject *key = pairs[3 * i], *value = pairs[3 * i + 1], *headers = pairs[3 * i + 2];
        out = put_varint(out, zigzag((int64_t)body_len(i, key, value, headers)));
        *out++ = 0; /* attributes */
        *out++ = 0; /* timestampDelta */
        out = put_varint(out, zigzag(i));
        if (key == Py_None) {
            *out++ = 1; /* zigzag(-1) */
        } else {
            out = put_varint(out, zigzag(PyBytes_GET_SIZE(key)));
            memcpy(out, PyBytes_AS_STRING(key), (size_t)PyBytes_GET_SIZE(key));
            out += PyBytes_GET_SIZE(key);
        }
        out = put_varint(out, zigzag(PyBytes_GET_SIZE(value)));
        memcpy(out, PyBytes_AS_STRING(value), (size_t)PyBytes_GET_SIZE(value));
        out += PyBytes_GET_SIZE(value);
        memcpy(out, PyBytes_AS_STRING(headers), (size_t)PyBytes_GET_SIZE(headers));
        out += PyBytes_GET_SIZE(headers);
    }
done:
    for (i = 0; i < 3 * read; i++)
        Py_DECREF(pairs[i]);
    PyMem_Free(pairs);
    Py_DECREF(seq);
    return result;
}

static PyMethodDef methods[] = {
    {"records", records, METH_O, records_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_kafka_records", "The records of a Kafka record batch, written in C.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__kafka_records(void) { return PyModule_Create(&module); }
