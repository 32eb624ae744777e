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
static PyObject *record_names; /* the fields' names, in constructor order */
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
    Py_XSETREF(record_names, Py_NewRef(names));
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


/* ---- usual_entry: the LogEntry of the usual event, in one call ----------------------------------
 * Nearly every logged prediction is a V2 or GraphPipe answer (to Kafka or a protobuf file), or a
 * /score, V2 or GraphPipe answer (to the JSON-lines file), with no error, pin, trace or feedback. In
 * Python its entry took five frames (emit, the key, the servable's cached fields, the encoder's
 * dispatch and its checks) around the one C call that writes the event; here the checks, the key and
 * the dispatch run in C, the servable's fields come from a small cache kept here, and the event is
 * written by the same C encoders (set_usual() hands them over), so the bytes are the Python path's.
 * Anything else returns None and is encoded by predlog/encode.py. */

enum { F_FQRV, F_SERVED, F_REQUEST, F_CONFIGS, F_LOGGING, F_REQUEST_ID, F_PROTOCOL, F_TIME, F_LATENCY, F_STATUS, F_RESPONSE,
       F_ERROR, F_RAW_REQUEST, F_RAW_RESPONSE, F_REQUEST_JSON, F_RESPONSE_JSON, F_TRACE_ID, F_PINNED, F_FEEDBACK,
       USED_FIELDS };
static const char *const used_names[USED_FIELDS] = {
    "fqrv", "served", "request", "configs", "logging", "request_id", "protocol", "event_time_ms", "latency_ms", "status",
    "response", "error", "raw_request", "raw_response", "request_json", "response_json", "trace_id", "pinned", "feedback",
};
static Py_ssize_t used_offsets[USED_FIELDS];
static PyObject *used_for; /* the record_names used_offsets were read from */

/* What set_usual() hands over: the servable-fields function, the protocol-field cache, the encoders. */
static PyObject *fields_of, *protocol_fields, *wire_event, *graphpipe_event, *usual_line, *dumps, *wire_body_type, *message;
static PyObject *s_json_length, *s_parameters, *s_metadata, *s_intermediate, *s_key_features, *s_v2, *s_columns;
/* A /score event's constants: the Prediction (field 1) and InferenceRequest (field 3) keys, b"", and the
 * schema and datum field tags of each message, as predlog/encode.py hands them to _ffwire.message. */
static PyObject *prediction_key, *request_key, *empty_bytes, *tag_0a, *tag_12, *tag_1a, *minus_one;

/* A servable's fields, by the identity of its fqrv and logging settings (strong references: neither
 * object can be freed and its address reused while it is cached). */
enum { SV_SERVED_HEAD, SV_SHADOW_HEAD, SV_FQRV_FIELD, SV_GRAPHPIPE_FQRV, SV_PREDICTION_FQRV, SV_LOGGING_JSON,
       SV_FQRV_JSON, SV_CE_SERVED, SV_CE_SHADOW, SV_FIELDS };
static const char *const servable_names[SV_FIELDS] = {
    "served_head", "shadow_head", "fqrv_field", "graphpipe_fqrv", "prediction_fqrv", "logging_json_bytes",
    "fqrv_json_bytes", "ce_served", "ce_shadow",
};
typedef struct {
    PyObject *fqrv, *logging;
    PyObject *key_feature; /* the one key feature (str), NULL for none; a servable with more is not cached */
    PyObject *fields[SV_FIELDS];
} Servable;
#define SERVABLES 8
static Servable servables[SERVABLES];
static unsigned next_servable;

static void servable_clear(Servable *sv) {
    Py_CLEAR(sv->fqrv);
    Py_CLEAR(sv->logging);
    Py_CLEAR(sv->key_feature);
    for (int i = 0; i < SV_FIELDS; i++)
        Py_CLEAR(sv->fields[i]);
}

/* The cached fields of (fqrv, logging); NULL with no error when the servable is not a usual one (more
 * than one key feature, or a field that is not bytes), NULL with an error on failure. */
static Servable *servable_of(PyObject *fqrv, PyObject *logging) {
    Servable *sv;
    PyObject *fields, *features;
    for (int i = 0; i < SERVABLES; i++)
        if (servables[i].fqrv == fqrv && servables[i].logging == logging)
            return &servables[i];
    if ((features = PyObject_GetAttr(logging, s_key_features)) == NULL)
        return NULL;
    if (!PyTuple_CheckExact(features) || PyTuple_GET_SIZE(features) > 1 ||
        (PyTuple_GET_SIZE(features) == 1 && !PyUnicode_CheckExact(PyTuple_GET_ITEM(features, 0)))) {
        Py_DECREF(features);
        return NULL;
    }
    if ((fields = PyObject_CallFunctionObjArgs(fields_of, logging, fqrv, NULL)) == NULL) {
        Py_DECREF(features);
        return NULL;
    }
    sv = &servables[next_servable++ % SERVABLES];
    servable_clear(sv);
    for (int i = 0; i < SV_FIELDS; i++) {
        PyObject *value = PyObject_GetAttrString(fields, servable_names[i]);
        if (value == NULL || !PyBytes_CheckExact(value)) {
            Py_XDECREF(value);
            servable_clear(sv);
            Py_DECREF(fields);
            Py_DECREF(features);
            return NULL; /* with the error of a missing field; without one for a field that is not bytes */
        }
        sv->fields[i] = value;
    }
    Py_DECREF(fields);
    sv->key_feature = PyTuple_GET_SIZE(features) ? Py_NewRef(PyTuple_GET_ITEM(features, 0)) : NULL;
    Py_DECREF(features);
    sv->fqrv = Py_NewRef(fqrv);
    sv->logging = Py_NewRef(logging);
    return sv;
}

/* Where each used field lives in the record (read once per set_record_type()). */
static int find_offsets(void) {
    if (used_for == record_names)
        return 0;
    for (int u = 0; u < USED_FIELDS; u++) {
        Py_ssize_t i;
        for (i = 0; i < record_fields; i++)
            if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(record_names, i), used_names[u]) == 0)
                break;
        if (i == record_fields) {
            PyErr_Format(PyExc_TypeError, "usual_entry(): the record type has no field %s", used_names[u]);
            return -1;
        }
        used_offsets[u] = record_offsets[i];
    }
    Py_XSETREF(used_for, Py_NewRef(record_names));
    return 0;
}

/* 1 when ``o`` is a WireBody, else 0; its json_length (a new reference) in *length when it is one. */
static int wire_body(PyObject *o, PyObject **length) {
    if (!PyObject_TypeCheck(o, (PyTypeObject *)wire_body_type))
        return 0;
    return (*length = PyObject_GetAttr(o, s_json_length)) == NULL ? -1 : 1;
}

/* Whether a pipeline's answer carries what the JSON line leaves to Python (step metadata or
 * intermediate tensors in its parameters): 1, 0, or -1 on failure. */
static int pipeline_extras(PyObject *response) {
    PyObject *parameters, *value;
    int found = 0;
    if (response == Py_None)
        return 0;
    if ((parameters = PyObject_GetAttr(response, s_parameters)) == NULL)
        return -1;
    if (!PyDict_CheckExact(parameters)) {
        Py_DECREF(parameters);
        return 1; /* not the usual answer: Python decides */
    }
    for (int i = 0; i < 2 && !found; i++) {
        value = PyDict_GetItemWithError(parameters, i ? s_intermediate : s_metadata);
        if (value == NULL && PyErr_Occurred()) {
            found = -1;
            break;
        }
        if (value != NULL && (found = PyObject_IsTrue(value)) < 0)
            break;
    }
    Py_DECREF(parameters);
    return found;
}

static PyObject *call(PyObject *callable, PyObject *const *args, size_t nargs) {
    return PyObject_Vectorcall(callable, args, nargs, NULL);
}

/* A /score answer's PredictionEvent: the head (wire_event with no wire fields), then the request and the
 * answer written from their frames by _ffwire.message, as encode.py's _event does. None when message
 * leaves a frame to Python (a column that is not 1-D, a dtype it does not write). */
static PyObject *score_event(PyObject **f, PyObject **svf, PyObject *head, PyObject *tail) {
    PyObject *payload = NULL, *prediction = NULL, *answer_columns = NULL, *request_columns = NULL, *value = NULL;
    PyObject *head_args[11] = {head, f[F_TIME], f[F_REQUEST_ID], svf[SV_FQRV_FIELD], f[F_LATENCY], f[F_STATUS],
                               tail, Py_None, Py_None, Py_None, Py_None};
    if ((answer_columns = PyObject_GetAttr(f[F_RESPONSE], s_columns)) == NULL ||
        (request_columns = PyObject_GetAttr(f[F_REQUEST], s_columns)) == NULL)
        goto done;
    PyObject *answer_args[8] = {prediction_key, svf[SV_PREDICTION_FQRV], tag_12, tag_1a, minus_one,
                                answer_columns, Py_None, Py_True};
    if ((prediction = call(message, answer_args, 8)) == NULL || prediction == Py_None)
        goto done;
    if ((payload = call(wire_event, head_args, 11)) == NULL)
        goto done;
    PyObject *request_args[10] = {request_key, empty_bytes, tag_0a, tag_12, minus_one, request_columns, f[F_CONFIGS],
                                  Py_False, payload, prediction};
    value = call(message, request_args, 10);
done:
    Py_XDECREF(payload);
    Py_XDECREF(prediction);
    Py_XDECREF(answer_columns);
    Py_XDECREF(request_columns);
    return value;
}

enum { MODE_KAFKA, MODE_PROTOBUF, MODE_JSONL };

PyDoc_STRVAR(usual_entry_doc,
"usual_entry(record, mode) -> LogEntry or None\n\n"
"The entry of a usual prediction record (see the comment in _kafka_records.c) for ``mode`` 0 (Kafka:\n"
"the protobuf event with its CloudEvents headers), 1 (a protobuf file) or 2 (a JSON-lines file), the\n"
"same entry predlog/encode.py builds; None for any other record (or any object that is not an instance\n"
"of the set_record_type() class), which Python encodes.");

static PyObject *usual_entry(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    PyObject *f[USED_FIELDS], *key_text = NULL, *key = NULL, *value = NULL, *headers = NULL, *result = NULL;
    PyObject *request_length = NULL, *response_length = NULL;
    /* The servable's fields, new references: a finalizer run by the collector during an encoder's
     * allocation could log an event of its own and evict the cache entry they came from. */
    PyObject *svf[SV_FIELDS] = {NULL};
    Servable *sv;
    int mode, served, wire, graphpipe, truth;
    if (nargs != 2 || !PyLong_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "usual_entry() takes (record, mode)");
        return NULL;
    }
    if (fields_of == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "usual_entry() needs set_usual() first");
        return NULL;
    }
    if (record_type == NULL || !Py_IS_TYPE(args[0], record_type))
        Py_RETURN_NONE; /* another kind of record (a subclass, a test's own): Python encodes it */
    mode = (int)PyLong_AsLong(args[1]);
    if (mode < MODE_KAFKA || mode > MODE_JSONL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "usual_entry(): mode is 0 (Kafka), 1 (protobuf) or 2 (JSON lines)");
        return NULL;
    }
    if (find_offsets() < 0)
        return NULL;
    /* New references: the encoders called below cannot free what this reads from the record. */
    for (int u = 0; u < USED_FIELDS; u++) {
        f[u] = *(PyObject **)((char *)args[0] + used_offsets[u]);
        if (f[u] == NULL) { /* a slot never set: not a record new_record() or the dataclass built */
            for (int k = 0; k < u; k++)
                Py_DECREF(f[k]);
            PyErr_Format(PyExc_AttributeError, "usual_entry(): the record has no %s", used_names[u]);
            return NULL;
        }
        Py_INCREF(f[u]);
    }
    /* An error, a pin, a trace or a feedback event: not the usual event. */
    if (f[F_FEEDBACK] != Py_None)
        goto unusual;
    for (int u = 0; u < 3; u++) {
        truth = PyObject_IsTrue(f[u == 0 ? F_ERROR : u == 1 ? F_PINNED : F_TRACE_ID]);
        if (truth != 0)
            goto unusual_or_error;
    }
    if (!PyDict_CheckExact(f[F_CONFIGS]) || !PyUnicode_CheckExact(f[F_PROTOCOL]) || !PyUnicode_CheckExact(f[F_REQUEST_ID]))
        goto unusual;
    if ((sv = servable_of(f[F_FQRV], f[F_LOGGING])) == NULL)
        goto unusual_or_error;
    for (int i = 0; i < SV_FIELDS; i++)
        svf[i] = Py_NewRef(sv->fields[i]);
    if (sv->key_feature != NULL) {
        PyObject *found = PyDict_GetItemWithError(f[F_CONFIGS], sv->key_feature); /* borrowed */
        if (found == NULL && PyErr_Occurred())
            goto done;
        if (found != NULL && !PyUnicode_CheckExact(found))
            goto unusual;
        key_text = Py_NewRef(found != NULL ? found : Py_None);
    } else {
        key_text = Py_NewRef(Py_None);
    }
    if (key_text == Py_None)
        key = Py_NewRef(Py_None);
    else if ((key = PyUnicode_AsUTF8String(key_text)) == NULL)
        goto done;
    if ((served = PyObject_IsTrue(f[F_SERVED])) < 0)
        goto done;
    if ((wire = wire_body(f[F_REQUEST_JSON], &request_length)) < 0)
        goto done;
    graphpipe = f[F_RAW_REQUEST] != Py_None;
    if (mode == MODE_JSONL) {
        PyObject *request = graphpipe ? f[F_RAW_REQUEST] : f[F_REQUEST_JSON];
        PyObject *answer = graphpipe ? f[F_RAW_RESPONSE] : f[F_RESPONSE_JSON];
        long kind = graphpipe ? 2 : wire ? 1 : 0;
        if ((truth = pipeline_extras(f[F_RESPONSE])) != 0)
            goto unusual_or_error;
        if (request == Py_None || answer == Py_None)
            goto unusual;
        if (kind == 1) {
            int v2 = PyUnicode_Compare(f[F_PROTOCOL], s_v2);
            if (v2 == -1 && PyErr_Occurred())
                goto done;
            if (v2 != 0 || request_length != Py_None)
                goto unusual;
            if ((truth = wire_body(answer, &response_length)) < 0)
                goto done;
            if (truth && response_length != Py_None)
                goto unusual;
        }
        PyObject *latency = call(dumps, &f[F_LATENCY], 1), *kind_obj = latency ? PyLong_FromLong(kind) : NULL;
        if (kind_obj != NULL) {
            PyObject *line_args[12] = {
                kind_obj, key_text, request, answer, f[F_SERVED], svf[SV_LOGGING_JSON], f[F_TIME],
                f[F_REQUEST_ID], svf[SV_FQRV_JSON], latency, f[F_STATUS], f[F_PROTOCOL],
            };
            value = call(usual_line, line_args, 12);
        }
        Py_XDECREF(kind_obj);
        Py_XDECREF(latency);
        if (value == NULL)
            goto done;
        if (value == Py_None)
            goto unusual;
        headers = Py_NewRef(no_headers);
    } else {
        PyObject *tail = PyDict_GetItemWithError(protocol_fields, f[F_PROTOCOL]);
        PyObject *head = svf[served ? SV_SERVED_HEAD : SV_SHADOW_HEAD];
        if (tail == NULL) {
            if (PyErr_Occurred())
                goto done;
            goto unusual; /* a protocol not seen yet: Python writes its field and caches it */
        }
        if (wire) {
            int answer_wire = wire_body(f[F_RESPONSE_JSON], &response_length);
            if (answer_wire < 0)
                goto done;
            PyObject *event_args[11] = {
                head, f[F_TIME], f[F_REQUEST_ID], svf[SV_FQRV_FIELD], f[F_LATENCY], f[F_STATUS], tail,
                f[F_REQUEST_JSON], f[F_RESPONSE_JSON], request_length, answer_wire ? response_length : Py_None,
            };
            value = call(wire_event, event_args, 11);
        } else if (graphpipe) {
            PyObject *event_args[10] = {
                head, f[F_TIME], f[F_REQUEST_ID], svf[SV_FQRV_FIELD], f[F_LATENCY], f[F_STATUS], tail,
                f[F_RAW_REQUEST], f[F_RAW_RESPONSE], svf[SV_GRAPHPIPE_FQRV],
            };
            value = call(graphpipe_event, event_args, 10);
        } else if (f[F_RESPONSE] != Py_None) {
            value = score_event(f, svf, head, tail);
        } else {
            goto unusual; /* no answer: its event is written in Python */
        }
        if (value == NULL)
            goto done;
        if (value == Py_None)
            goto unusual;
        if (mode == MODE_KAFKA) {
            PyObject *ce_args[3] = {svf[served ? SV_CE_SERVED : SV_CE_SHADOW], f[F_REQUEST_ID], f[F_TIME]};
            if ((headers = ce_headers(NULL, ce_args, 3)) == NULL)
                goto done;
            if (headers == Py_None)
                goto unusual; /* a time written in Python */
        } else {
            headers = Py_NewRef(no_headers);
        }
    }
    result = entry_make(&EntryType, graphpipe ? Py_True : Py_False, key, value, headers);
    goto done;
unusual_or_error:
    if (PyErr_Occurred())
        goto done;
unusual:
    result = Py_NewRef(Py_None);
done:
    for (int u = 0; u < USED_FIELDS; u++)
        Py_DECREF(f[u]);
    Py_XDECREF(key_text);
    Py_XDECREF(key);
    Py_XDECREF(value);
    Py_XDECREF(headers);
    Py_XDECREF(request_length);
    Py_XDECREF(response_length);
    for (int i = 0; i < SV_FIELDS; i++)
        Py_XDECREF(svf[i]);
    return result;
}

PyDoc_STRVAR(set_usual_doc,
"set_usual(fields_of, protocol_fields, wire_event, graphpipe_event, usual_line, dumps, wire_body_type, message)\n\n"
"What usual_entry() uses: ``fields_of(logging, fqrv)`` a servable's cached fields (bytes attributes\n"
"named as in predlog/encode.py), ``protocol_fields`` the dict of protocol name -> written field, the\n"
"C encoders, orjson's ``dumps`` (a latency's shortest form), the WireBody class and _ffwire.message.");

static PyObject *set_usual(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8 || !PyDict_Check(args[1]) || !PyType_Check(args[6])) {
        PyErr_SetString(PyExc_TypeError,
                        "set_usual() takes (fields_of, dict, wire_event, graphpipe_event, usual_line, dumps, type, message)");
        return NULL;
    }
    for (int i = 0; i < 8; i++)
        if (i != 1 && i != 6 && !PyCallable_Check(args[i])) {
            PyErr_Format(PyExc_TypeError, "set_usual(): argument %d is not callable", i + 1);
            return NULL;
        }
    for (int i = 0; i < SERVABLES; i++)
        servable_clear(&servables[i]);
    Py_XSETREF(fields_of, Py_NewRef(args[0]));
    Py_XSETREF(protocol_fields, Py_NewRef(args[1]));
    Py_XSETREF(wire_event, Py_NewRef(args[2]));
    Py_XSETREF(graphpipe_event, Py_NewRef(args[3]));
    Py_XSETREF(usual_line, Py_NewRef(args[4]));
    Py_XSETREF(dumps, Py_NewRef(args[5]));
    Py_XSETREF(wire_body_type, Py_NewRef(args[6]));
    Py_XSETREF(message, Py_NewRef(args[7]));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"set_record_type", (PyCFunction)(void (*)(void))set_record_type, METH_FASTCALL, set_record_type_doc},
    {"new_record", (PyCFunction)(void (*)(void))new_record, METH_FASTCALL, new_record_doc},
    {"records", records, METH_O, records_doc},
    {"ce_headers", (PyCFunction)(void (*)(void))ce_headers, METH_FASTCALL, ce_headers_doc},
    {"usual_entry", (PyCFunction)(void (*)(void))usual_entry, METH_FASTCALL, usual_entry_doc},
    {"set_usual", (PyCFunction)(void (*)(void))set_usual, METH_FASTCALL, set_usual_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_kafka_records", "The records of a Kafka record batch, written in C.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__kafka_records(void) {
    PyObject *m;
    if (PyType_Ready(&EntryType) < 0 || (no_headers = PyBytes_FromStringAndSize("\x00", 1)) == NULL)
        return NULL;
    if ((s_json_length = PyUnicode_InternFromString("json_length")) == NULL ||
        (s_parameters = PyUnicode_InternFromString("parameters")) == NULL ||
        (s_metadata = PyUnicode_InternFromString("metadata")) == NULL ||
        (s_intermediate = PyUnicode_InternFromString("intermediate")) == NULL ||
        (s_key_features = PyUnicode_InternFromString("key_features")) == NULL ||
        (s_v2 = PyUnicode_InternFromString("v2")) == NULL ||
        (s_columns = PyUnicode_InternFromString("columns")) == NULL ||
        (prediction_key = PyBytes_FromStringAndSize("\x0a", 1)) == NULL ||
        (request_key = PyBytes_FromStringAndSize("\x1a", 1)) == NULL ||
        (empty_bytes = PyBytes_FromStringAndSize("", 0)) == NULL || (tag_0a = PyLong_FromLong(0x0A)) == NULL ||
        (tag_12 = PyLong_FromLong(0x12)) == NULL || (tag_1a = PyLong_FromLong(0x1A)) == NULL ||
        (minus_one = PyLong_FromLong(-1)) == NULL)
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
