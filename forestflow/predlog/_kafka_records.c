/*
 * forestflow.predlog._kafka_records: the records of a Kafka record batch (magic 2), in one call.
 *
 * aiokafka appends records one Python call at a time (a method call, keyword arguments, a
 * metadata object per record); the prediction log hands over hundreds of events a batch, all
 * with the same timestamp and no headers, so here one call writes every record of a batch:
 *
 *   length (varint) | attributes 0 | timestampDelta 0 | offsetDelta (varint) |
 *   keyLength (varint, -1 for none) | key | valueLength (varint) | value | headers 0
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

/* A record's key (None for none) and value: new references, released on failure. */
static int key_and_value(PyObject *entry, PyObject *key_name, PyObject *value_name, PyObject **key, PyObject **value) {
    *key = PyObject_GetAttr(entry, key_name);
    if (*key == NULL)
        return -1;
    *value = PyObject_GetAttr(entry, value_name);
    if (*value == NULL) {
        Py_DECREF(*key);
        return -1;
    }
    if ((*key != Py_None && !PyBytes_Check(*key)) || !PyBytes_Check(*value)) {
        PyErr_SetString(PyExc_TypeError, "an entry's key must be bytes or None and its value bytes");
        Py_DECREF(*key);
        Py_DECREF(*value);
        return -1;
    }
    return 0;
}

/* Bytes of the record at offsetDelta i, without its length prefix. */
static size_t body_len(Py_ssize_t i, PyObject *key, PyObject *value) {
    size_t key_len = key == Py_None ? 1 : varint_len(zigzag(PyBytes_GET_SIZE(key))) + (size_t)PyBytes_GET_SIZE(key);
    return 1 + 1 + varint_len(zigzag(i)) + key_len + varint_len(zigzag(PyBytes_GET_SIZE(value))) +
           (size_t)PyBytes_GET_SIZE(value) + 1;
}

PyDoc_STRVAR(records_doc,
"records(entries) -> bytes\n\n"
"The records section of a Kafka record batch (magic 2) holding ``entries`` in order: each an object\n"
"with ``key`` (bytes or None) and ``value`` (bytes), offset deltas 0..n-1, timestamp delta 0, no\n"
"headers.");

static PyObject *records(PyObject *Py_UNUSED(self), PyObject *entries) {
    static PyObject *key_name = NULL, *value_name = NULL;
    Py_ssize_t n, i, read = 0;
    size_t total = 0;
    PyObject *seq, **pairs = NULL, *result = NULL; /* pairs: key, value of each entry (new references) */
    char *out;
    if (key_name == NULL && ((key_name = PyUnicode_InternFromString("key")) == NULL ||
                             (value_name = PyUnicode_InternFromString("value")) == NULL))
        return NULL;
    seq = PySequence_Fast(entries, "records() takes a sequence of entries");
    if (seq == NULL)
        return NULL;
    n = PySequence_Fast_GET_SIZE(seq);
    pairs = PyMem_Malloc(((size_t)n * 2 + 1) * sizeof(PyObject *));
    if (pairs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (; read < n; read++) {
        size_t body;
        if (key_and_value(PySequence_Fast_GET_ITEM(seq, read), key_name, value_name, &pairs[2 * read], &pairs[2 * read + 1]) < 0)
            goto done;
        body = body_len(read, pairs[2 * read], pairs[2 * read + 1]);
        total += varint_len(zigzag((int64_t)body)) + body;
    }
    result = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (result == NULL)
        goto done;
    out = PyBytes_AS_STRING(result);
    for (i = 0; i < n; i++) {
        PyObject *key = pairs[2 * i], *value = pairs[2 * i + 1];
        out = put_varint(out, zigzag((int64_t)body_len(i, key, value)));
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
        *out++ = 0; /* no headers */
    }
done:
    for (i = 0; i < 2 * read; i++)
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
