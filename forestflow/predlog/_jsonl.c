/*
 * forestflow.predlog._jsonl: the file log's JSON line of the usual event, in one call.
 *
 * Nearly every logged request is a /score answer with its JSON bodies, or a V2 REST one with its wire
 * bodies. Their line is a fixed frame around the bodies as they were on the wire; orjson built it
 * from a dict display of Fragments, growing its buffer while copying each body (kilobytes at 100
 * rows) more than once. Here every piece is sized first and copied once into the line's bytes:
 *
 *   score: {"topic":"basic","key":K,"event":{"prediction":RESPONSE,"servedRequest":B,
 *           "inferenceRequest":REQUEST,"loggingSettings":L,"eventTimeMS":"T","requestId":R,
 *           "fqrv":F,"latencyMs":X,"status":S,"protocol":P}}
 *   v2:    {"topic":"basic","key":K,"event":{"servedRequest":B,"loggingSettings":L,"eventTimeMS":"T",
 *           "requestId":R,"fqrv":F,"latencyMs":X,"status":S,"protocol":"v2","wireRequest":REQUEST,
 *           "wireResponse":RESPONSE}}
 *
 * exactly the bytes orjson writes for the same dict (tests/predlog compares them). The bodies have CR
 * and LF turned into spaces (encode.one_line_json); the latency comes written by orjson (its shortest
 * float form: Python's repr() costs 5-7k instructions for a 17-digit latency). None, so the caller
 * builds the line with orjson, whenever this writer could differ from orjson: a text that needs
 * escaping (a quote, a backslash, a control character) or is not valid UTF-8.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

/* A str that JSON needs no escape for, as its UTF-8; NULL (no exception set) otherwise. */
static const char *plain_text(PyObject *text, Py_ssize_t *len) {
    const char *data;
    if (!PyUnicode_Check(text))
        return NULL;
    if (PyUnicode_IS_COMPACT_ASCII(text)) {
        *len = PyUnicode_GET_LENGTH(text);
        data = (const char *)PyUnicode_DATA(text);
    } else if ((data = PyUnicode_AsUTF8AndSize(text, len)) == NULL) { /* lone surrogates: orjson refuses them */
        PyErr_Clear();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < *len; i++) {
        unsigned char c = (unsigned char)data[i];
        if (c < 0x20 || c == '"' || c == '\\')
            return NULL;
    }
    return data;
}

/* A body's bytes (a bytes object or a subclass: WireBody); NULL (no exception set) for anything else. */
static const char *body_of(PyObject *body, Py_ssize_t *len) {
    if (!PyBytes_Check(body))
        return NULL;
    *len = PyBytes_GET_SIZE(body);
    return PyBytes_AS_STRING(body);
}

/* Copies a body with CR and LF as spaces (in valid JSON they can only be whitespace between tokens). */
static char *put_body(char *out, const char *body, Py_ssize_t len) {
    memcpy(out, body, (size_t)len);
    if (memchr(body, '\n', (size_t)len) != NULL || memchr(body, '\r', (size_t)len) != NULL)
        for (Py_ssize_t i = 0; i < len; i++)
            if (out[i] == '\n' || out[i] == '\r')
                out[i] = ' ';
    return out + len;
}

static char *put(char *out, const char *text, Py_ssize_t len) {
    memcpy(out, text, (size_t)len);
    return out + len;
}

/* A 64-bit integer in decimal (snprintf costs more than the rest of a 1-row line); returns its length. */
static Py_ssize_t decimal(char *buf, long long value) {
    char digits[24];
    unsigned long long v = value < 0 ? 0ULL - (unsigned long long)value : (unsigned long long)value;
    Py_ssize_t n = 0, len = 0;
    do {
        digits[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    if (value < 0)
        buf[len++] = '-';
    while (n > 0)
        buf[len++] = digits[--n];
    return len;
}

#define PUT_LITERAL(out, literal) put((out), (literal), (Py_ssize_t)(sizeof(literal) - 1))

PyDoc_STRVAR(usual_line_doc,
"usual_line(wire, key, request, response, served, logging_json, event_time_ms, request_id, fqrv_json,\n"
"           latency_ms, status, protocol) -> bytes or None\n\n"
"The JSON line (no newline) of a /score event (``wire`` false: ``request`` and ``response`` are the\n"
"request body and the Prediction JSON) or of a V2 REST event (``wire`` true: the wire bodies, and\n"
"``protocol`` is written as \"v2\"). ``key`` is a str or None; ``logging_json`` and ``fqrv_json`` are\n"
"JSON bytes written as they are, and so is ``latency_ms``, the latency as orjson.dumps() writes it.\n"
"None when orjson could write the line otherwise (see the module).");

static PyObject *usual_line(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    const char *key = NULL, *request, *response, *logging, *request_id, *fqrv, *protocol;
    Py_ssize_t key_len = 0, request_len, response_len, logging_len, request_id_len, fqrv_len, protocol_len;
    const char *latency;
    Py_ssize_t latency_len, time_len, status_len, total;
    char time_text[32], status_text[32];
    long long event_time, status;
    int wire, served;
    PyObject *result;
    char *out;

    if (nargs != 12) {
        PyErr_Format(PyExc_TypeError, "usual_line() takes exactly 12 arguments (%zd given)", nargs);
        return NULL;
    }
    if ((wire = PyObject_IsTrue(args[0])) < 0)
        return NULL;
    if (!PyBool_Check(args[4])) /* orjson writes other objects otherwise */
        Py_RETURN_NONE;
    served = args[4] == Py_True;
    if (!PyBytes_Check(args[5]) || !PyBytes_Check(args[8]) || !PyBytes_Check(args[9])) {
        PyErr_SetString(PyExc_TypeError, "usual_line(): logging_json, fqrv_json and latency_ms must be bytes");
        return NULL;
    }
    latency = PyBytes_AS_STRING(args[9]);
    latency_len = PyBytes_GET_SIZE(args[9]);
    logging = PyBytes_AS_STRING(args[5]);
    logging_len = PyBytes_GET_SIZE(args[5]);
    fqrv = PyBytes_AS_STRING(args[8]);
    fqrv_len = PyBytes_GET_SIZE(args[8]);
    if ((args[1] != Py_None && (key = plain_text(args[1], &key_len)) == NULL) ||
        (request = body_of(args[2], &request_len)) == NULL || (response = body_of(args[3], &response_len)) == NULL ||
        (request_id = plain_text(args[7], &request_id_len)) == NULL || (protocol = plain_text(args[11], &protocol_len)) == NULL ||
        !PyLong_CheckExact(args[6]) || !PyLong_CheckExact(args[10]))
        Py_RETURN_NONE;
    event_time = PyLong_AsLongLong(args[6]);
    status = PyLong_AsLongLong(args[10]);
    if (PyErr_Occurred()) { /* beyond 64 bits: orjson's business */
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    time_len = decimal(time_text, event_time);
    status_len = decimal(status_text, status);
    if (wire) {
        protocol = "v2";
        protocol_len = 2;
    }

    total = 250 + (key != NULL ? key_len + 2 : 4) + request_len + response_len + logging_len + time_len + request_id_len +
            fqrv_len + latency_len + status_len + protocol_len;
    result = PyBytes_FromStringAndSize(NULL, total);
    if (result == NULL)
        return NULL;
    out = PyBytes_AS_STRING(result);
    out = PUT_LITERAL(out, "{\"topic\":\"basic\",\"key\":");
    if (key != NULL) {
        *out++ = '"';
        out = put(out, key, key_len);
        *out++ = '"';
    } else {
        out = PUT_LITERAL(out, "null");
    }
    out = PUT_LITERAL(out, ",\"event\":{");
    if (!wire) {
        out = PUT_LITERAL(out, "\"prediction\":");
        out = put_body(out, response, response_len);
        out = served ? PUT_LITERAL(out, ",\"servedRequest\":true") : PUT_LITERAL(out, ",\"servedRequest\":false");
        out = PUT_LITERAL(out, ",\"inferenceRequest\":");
        out = put_body(out, request, request_len);
        *out++ = ',';
    } else {
        out = served ? PUT_LITERAL(out, "\"servedRequest\":true,") : PUT_LITERAL(out, "\"servedRequest\":false,");
    }
    out = PUT_LITERAL(out, "\"loggingSettings\":");
    out = put(out, logging, logging_len);
    out = PUT_LITERAL(out, ",\"eventTimeMS\":\"");
    out = put(out, time_text, time_len);
    out = PUT_LITERAL(out, "\",\"requestId\":\"");
    out = put(out, request_id, request_id_len);
    out = PUT_LITERAL(out, "\",\"fqrv\":");
    out = put(out, fqrv, fqrv_len);
    out = PUT_LITERAL(out, ",\"latencyMs\":");
    out = put(out, latency, latency_len);
    out = PUT_LITERAL(out, ",\"status\":");
    out = put(out, status_text, status_len);
    out = PUT_LITERAL(out, ",\"protocol\":\"");
    out = put(out, protocol, protocol_len);
    *out++ = '"';
    if (wire) {
        out = PUT_LITERAL(out, ",\"wireRequest\":");
        out = put_body(out, request, request_len);
        out = PUT_LITERAL(out, ",\"wireResponse\":");
        out = put_body(out, response, response_len);
    }
    out = PUT_LITERAL(out, "}}");
    if (_PyBytes_Resize(&result, out - PyBytes_AS_STRING(result)) < 0)
        return NULL;
    return result;
}

static PyMethodDef methods[] = {
    {"usual_line", (PyCFunction)(void (*)(void))usual_line, METH_FASTCALL, usual_line_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_jsonl", "The file log's JSON line of the usual event.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__jsonl(void) { return PyModule_Create(&module); }
