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
#include <structmember.h>
#include <descrobject.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "varint.h"

static uint64_t zigzag(int64_t v) { return ((uint64_t)v << 1) ^ (uint64_t)(v >> 63); }

/* An encoded event waiting for its sink (LogEntry, below). */
typedef struct {
    PyObject_HEAD
    PyObject *graphpipe, *key, *value, *headers;
    Py_ssize_t size;
} Entry;

static PyTypeObject EntryType;

/* A record's key (None for none), value and encoded headers: new references, released on failure. */
static int key_and_value(PyObject *entry, PyObject *names[3], PyObject **parts) {
    int i = 0;
    if (Py_IS_TYPE(entry, &EntryType)) { /* the log's own entries: their fields, without three lookups */
        const Entry *e = (const Entry *)entry;
        parts[0] = Py_NewRef(e->key);
        parts[1] = Py_NewRef(e->value);
        parts[2] = Py_NewRef(e->headers);
        i = 3;
    } else {
        for (; i < 3; i++)
            if ((parts[i] = PyObject_GetAttr(entry, names[i])) == NULL)
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


/* Days since 1970-01-01 -> civil year, month, day (proleptic Gregorian, as datetime has it). */
static void civil_from_days(int64_t z, int64_t *y, unsigned *m, unsigned *d) {
    int64_t era, yoe, doy, mp;
    z += 719468;
    era = (z >= 0 ? z : z - 146096) / 146097;
    yoe = z - era * 146097;
    yoe = (yoe - yoe / 1460 + yoe / 36524 - yoe / 146096) / 365;
    doy = z - era * 146097 - (365 * yoe + yoe / 4 - yoe / 100);
    mp = (5 * doy + 2) / 153;
    *d = (unsigned)(doy - (153 * mp + 2) / 5 + 1);
    *m = (unsigned)(mp < 10 ? mp + 3 : mp - 9);
    *y = yoe + era * 400 + (*m <= 2);
}

static char *put_digits(char *out, unsigned value, int width) {
    for (int i = width - 1; i >= 0; i--) {
        out[i] = (char)('0' + value % 10);
        value /= 10;
    }
    return out + width;
}

/* The headers a prediction event carries besides the fixed ones: ce_id, then ce_time (24 characters). */
static const char CE_ID[] = "\x0a" "ce_id", CE_TIME[] = "\x0e" "ce_time" "\x30";
/* Event times written here: from 1970 to the end of year 9999 (four-digit years); others go to Python. */
#define LAST_MS INT64_C(253402300799999)

PyDoc_STRVAR(ce_headers_doc,
"ce_headers(fixed, request_id, event_time_ms) -> bytes or None\n\n"
"A prediction event's Kafka record headers section: ``fixed`` (the header count and the headers every\n"
"event of its contract and kind repeats, as written), then ce_id (``request_id``, UTF-8) and ce_time\n"
"(RFC 3339 UTC with milliseconds). None for a time outside 1970-9999 (written in Python then).");

static PyObject *ce_headers(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    const char *rid;
    Py_ssize_t rid_len, fixed_len;
    long long ms;
    int64_t secs, days, rem, year;
    unsigned month, day;
    PyObject *result;
    char *out;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "ce_headers() takes exactly 3 arguments (%zd given)", nargs);
        return NULL;
    }
    if (!PyBytes_Check(args[0]) || !PyUnicode_Check(args[1]) || !PyLong_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "ce_headers() takes (bytes, str, int)");
        return NULL;
    }
#if LONG_MAX == LLONG_MAX /* PyLong_AsLongLong converts a time in ms through _PyLong_AsByteArray */
    ms = PyLong_AsLong(args[2]);
#else
    ms = PyLong_AsLongLong(args[2]);
#endif
    if (ms == -1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return NULL;
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (ms < 0 || ms > LAST_MS)
        Py_RETURN_NONE;
    if ((rid = PyUnicode_AsUTF8AndSize(args[1], &rid_len)) == NULL)
        return NULL;
    fixed_len = PyBytes_GET_SIZE(args[0]);
    result = PyBytes_FromStringAndSize(NULL, fixed_len + (Py_ssize_t)(sizeof(CE_ID) - 1) +
                                                 (Py_ssize_t)varint_len((uint64_t)rid_len << 1) + rid_len +
                                                 (Py_ssize_t)(sizeof(CE_TIME) - 1) + 24);
    if (result == NULL)
        return NULL;
    out = PyBytes_AS_STRING(result);
    memcpy(out, PyBytes_AS_STRING(args[0]), (size_t)fixed_len);
    out += fixed_len;
    memcpy(out, CE_ID, sizeof(CE_ID) - 1);
    out = put_varint(out + sizeof(CE_ID) - 1, (uint64_t)rid_len << 1); /* zigzag of a length */
    memcpy(out, rid, (size_t)rid_len);
    out += rid_len;
    memcpy(out, CE_TIME, sizeof(CE_TIME) - 1);
    out += sizeof(CE_TIME) - 1;
    secs = ms / 1000;
    days = secs / 86400;
    rem = secs % 86400;
    civil_from_days(days, &year, &month, &day);
    out = put_digits(out, (unsigned)year, 4);
    *out++ = '-';
    out = put_digits(out, month, 2);
    *out++ = '-';
    out = put_digits(out, day, 2);
    *out++ = 'T';
    out = put_digits(out, (unsigned)(rem / 3600), 2);
    *out++ = ':';
    out = put_digits(out, (unsigned)(rem / 60 % 60), 2);
    *out++ = ':';
    out = put_digits(out, (unsigned)(rem % 60), 2);
    *out++ = '.';
    out = put_digits(out, (unsigned)(ms % 1000), 3);
    *out = 'Z';
    return result;
}

/* ---- LogEntry: an encoded event waiting for its sink ------------------------------------------------
 * Built once per logged prediction on the request path: a Python class's __init__ (a frame and five
 * attribute stores) cost ten times this. Its fields are read-only. It is a GC type that stays untracked
 * while it holds only bytes, str, None and bools (every entry the log makes), as tuples do: the
 * collector then never walks the entries waiting in the buffer. */

/* Bytes an entry holds against the buffer budget besides its key, value and headers. */
#define EVENT_OVERHEAD_BYTES 64

static PyObject *no_headers; /* b"\x00": a headers section holding no header */

static int atomic(PyObject *o) {
    return o == Py_None || PyBool_Check(o) || PyBytes_CheckExact(o) || PyUnicode_CheckExact(o);
}

static PyObject *entry_make(PyTypeObject *type, PyObject *graphpipe, PyObject *key, PyObject *value, PyObject *headers) {
    Py_ssize_t value_len, key_len = 0, headers_len;
    Entry *e;
    if (headers == NULL)
        headers = no_headers;
    if ((value_len = PyObject_Length(value)) < 0 || (headers_len = PyObject_Length(headers)) < 0)
        return NULL;
    if (key != Py_None) {
        int truth = PyObject_IsTrue(key);
        if (truth < 0 || (truth && (key_len = PyObject_Length(key)) < 0))
            return NULL;
    }
    e = PyObject_GC_New(Entry, type);
    if (e == NULL)
        return NULL;
    e->graphpipe = Py_NewRef(graphpipe);
    e->key = Py_NewRef(key);
    e->value = Py_NewRef(value);
    e->headers = Py_NewRef(headers);
    e->size = value_len + key_len + headers_len - 1 + EVENT_OVERHEAD_BYTES;
    if (!(atomic(graphpipe) && atomic(key) && atomic(value) && atomic(headers)))
        PyObject_GC_Track(e);
    return (PyObject *)e;
}

static PyObject *entry_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"graphpipe", "key", "value", "headers", NULL};
    PyObject *graphpipe, *key, *value, *headers = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO|O:LogEntry", kwlist, &graphpipe, &key, &value, &headers))
        return NULL;
    return entry_make(type, graphpipe, key, value, headers);
}

static PyObject *entry_vectorcall(PyObject *type, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames == NULL && (nargs == 3 || nargs == 4)) /* how the log builds them: positional */
        return entry_make((PyTypeObject *)type, args[0], args[1], args[2], nargs == 4 ? args[3] : NULL);
    PyObject *tuple = PyTuple_New(nargs), *kwds = NULL, *result = NULL;
    if (tuple == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < nargs; i++)
        PyTuple_SET_ITEM(tuple, i, Py_NewRef(args[i]));
    if (kwnames != NULL) {
        if ((kwds = PyDict_New()) == NULL)
            goto done;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kwnames); i++)
            if (PyDict_SetItem(kwds, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]) < 0)
                goto done;
    }
    result = entry_new((PyTypeObject *)type, tuple, kwds);
done:
    Py_DECREF(tuple);
    Py_XDECREF(kwds);
    return result;
}

static int entry_traverse(Entry *e, visitproc visit, void *arg) {
    Py_VISIT(e->graphpipe);
    Py_VISIT(e->key);
    Py_VISIT(e->value);
    Py_VISIT(e->headers);
    return 0;
}

static int entry_clear(Entry *e) {
    Py_CLEAR(e->graphpipe);
    Py_CLEAR(e->key);
    Py_CLEAR(e->value);
    Py_CLEAR(e->headers);
    return 0;
}

static void entry_dealloc(Entry *e) {
    PyObject_GC_UnTrack(e);
    entry_clear(e);
    PyObject_GC_Del(e);
}

static PyObject *entry_repr(Entry *e) {
    Py_ssize_t len = PyObject_Length(e->value);
    if (len < 0)
        return NULL;
    return PyUnicode_FromFormat("LogEntry(graphpipe=%R, key=%R, value=<%zd bytes>, size=%zd)", e->graphpipe, e->key, len,
                                e->size);
}

static PyMemberDef entry_members[] = {
    {"graphpipe", T_OBJECT_EX, offsetof(Entry, graphpipe), READONLY, "Whether it goes to the GraphPipe topic / file."},
    {"key", T_OBJECT_EX, offsetof(Entry, key), READONLY, "The Kafka record key (bytes), None for none."},
    {"value", T_OBJECT_EX, offsetof(Entry, value), READONLY, "The encoded event."},
    {"headers", T_OBJECT_EX, offsetof(Entry, headers), READONLY,
     "The Kafka record's headers section, encoded (predlog/cloudevents.py); b'\\x00' for none."},
    {"size", T_PYSSIZET, offsetof(Entry, size), READONLY,
     "Bytes it holds against the buffer budget: value, key and headers past their count, and EVENT_OVERHEAD_BYTES."},
    {NULL, 0, 0, 0, NULL},
};

PyDoc_STRVAR(entry_doc,
"LogEntry(graphpipe, key, value, headers=b'\\x00')\n\n"
"An encoded event waiting for its sink: ``key`` bytes or None, ``value`` the event's bytes,\n"
"``headers`` the Kafka record's encoded headers section.");

static PyTypeObject EntryType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "forestflow.predlog._kafka_records.LogEntry",
    .tp_basicsize = sizeof(Entry),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = entry_doc,
    .tp_new = entry_new,
    .tp_vectorcall = entry_vectorcall,
    .tp_dealloc = (destructor)entry_dealloc,
    .tp_traverse = (traverseproc)entry_traverse,
    .tp_clear = (inquiry)entry_clear,
    .tp_repr = (reprfunc)entry_repr,
    .tp_members = entry_members,
};


/* ---- new_record: a slots dataclass instance built without its __init__ ---------------------------
 * The service builds one PredictionRecord per logged prediction with 19 positional arguments; the
 * dataclass's generated __init__ (a frame and 20 slot stores, each a descriptor lookup) cost about
 * 4.5k instructions of the request. Here the instance is allocated and its slots filled straight
 * from the member descriptors' offsets, read once by set_record_type(). */

#define MAX_RECORD_FIELDS 32
static PyTypeObject *record_type;
static Py_ssize_t record_fields, record_offsets[MAX_RECORD_FIELDS];
static PyObject *record_defaults[MAX_RECORD_FIELDS]; /* NULL: the field has no default */

PyDoc_STRVAR(set_record_type_doc,
"set_record_type(cls, names, defaults)\n\n"
"The class new_record() builds: a class with ``__slots__`` (a ``dataclass(slots=True)``), ``names`` its\n"
"fields in constructor order, ``defaults`` each one's default or ``cls`` itself for none. Its ``__init__``\n"
"must do nothing but store its arguments (no __post_init__, no default factories).");

static PyObject *set_record_type(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t n, i, offsets[MAX_RECORD_FIELDS];
    PyObject *cls, *names, *defaults;
    if (nargs != 3 || !PyType_Check(args[0]) || !PyTuple_Check(args[1]) || !PyTuple_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "set_record_type() takes (type, tuple of names, tuple of defaults)");
        return NULL;
    }
    cls = args[0], names = args[1], defaults = args[2];
    n = PyTuple_GET_SIZE(names);
    if (n > MAX_RECORD_FIELDS || PyTuple_GET_SIZE(defaults) != n || ((PyTypeObject *)cls)->tp_itemsize != 0) {
        PyErr_SetString(PyExc_ValueError, "set_record_type(): one default per name, at most 32 fields, a fixed-size type");
        return NULL;
    }
    for (i = 0; i < n; i++) {
        PyObject *descr = PyObject_GetAttr(cls, PyTuple_GET_ITEM(names, i));
        PyMemberDef *member;
        if (descr == NULL)
            return NULL;
        member = Py_IS_TYPE(descr, &PyMemberDescr_Type) ? ((PyMemberDescrObject *)descr)->d_member : NULL;
        if (member == NULL || member->type != T_OBJECT_EX || (member->flags & READONLY) ||
            ((PyMemberDescrObject *)descr)->d_common.d_type != (PyTypeObject *)cls) {
            PyErr_Format(PyExc_TypeError, "set_record_type(): %R is not a writable slot of the class itself",
                         PyTuple_GET_ITEM(names, i));
            Py_DECREF(descr);
            return NULL;
        }
        offsets[i] = member->offset;
        Py_DECREF(descr);
    }
    Py_XSETREF(record_type, (PyTypeObject *)Py_NewRef(cls));
    for (i = 0; i < MAX_RECORD_FIELDS; i++)
        Py_CLEAR(record_defaults[i]);
    for (i = 0; i < n; i++) {
        PyObject *d = PyTuple_GET_ITEM(defaults, i);
        record_offsets[i] = offsets[i];
        record_defaults[i] = d == cls ? NULL : Py_NewRef(d);
    }
    record_fields = n;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(new_record_doc,
"new_record(*fields)\n\n"
"An instance of the set_record_type() class holding ``fields`` positionally (the later ones at their\n"
"defaults), as its dataclass __init__ would build it.");

static PyObject *new_record(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    PyObject *obj;
    Py_ssize_t i;
    if (record_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "new_record() needs set_record_type() first");
        return NULL;
    }
    if (nargs > record_fields) {
        PyErr_Format(PyExc_TypeError, "new_record() takes at most %zd fields (%zd given)", record_fields, nargs);
        return NULL;
    }
    for (i = nargs; i < record_fields; i++)
        if (record_defaults[i] == NULL) {
            PyErr_Format(PyExc_TypeError, "new_record() is missing field %zd", i);
            return NULL;
        }
    obj = record_type->tp_alloc(record_type, 0); /* zeroed, and tracked by the GC when the type is */
    if (obj == NULL)
        return NULL;
    for (i = 0; i < record_fields; i++)
        *(PyObject **)((char *)obj + record_offsets[i]) = Py_NewRef(i < nargs ? args[i] : record_defaults[i]);
    return obj;
}

static PyMethodDef methods[] = {
    {"set_record_type", (PyCFunction)(void (*)(void))set_record_type, METH_FASTCALL, set_record_type_doc},
    {"new_record", (PyCFunction)(void (*)(void))new_record, METH_FASTCALL, new_record_doc},
    {"records", records, METH_O, records_doc},
    {"ce_headers", (PyCFunction)(void (*)(void))ce_headers, METH_FASTCALL, ce_headers_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_kafka_records", "The records of a Kafka record batch, written in C.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__kafka_records(void) {
    PyObject *m;
    if (PyType_Ready(&EntryType) < 0 || (no_headers = PyBytes_FromStringAndSize("\x00", 1)) == NULL)
        return NULL;
    if ((m = PyModule_Create(&module)) == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "LogEntry", (PyObject *)&EntryType) < 0 ||
        PyModule_AddIntConstant(m, "EVENT_OVERHEAD_BYTES", EVENT_OVERHEAD_BYTES) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
