/*
 * forestflow.api._ffhttp: the head of a plain HTTP/1.x scoring request, read in C (api/fast_http.py).
 *
 * The fast path parses every request with aiohttp's llhttp parser, whose callbacks build a Python
 * object per header, the message, the URL and a body stream: a tenth of a 1-row request's work.
 * Here one call reads the head of the usual request, and only of it:
 *
 *   POST <target> HTTP/1.1 (or 1.0) CRLF
 *   (<token>: <value> CRLF)*   values of HTAB and printable ASCII, at most MAX_HEADERS lines
 *   CRLF
 *
 * with a Content-Length of digits. Anything else is refused (None) and read by llhttp as before:
 * another method, a target or a value outside printable ASCII, a bare LF, an empty value, a name
 * given twice (in any case), a field longer than aiohttp's limit, and the headers that change how
 * the request is read (Transfer-Encoding, Content-Encoding, Expect, Upgrade, Proxy-Connection,
 * Sec-WebSocket-Key1, a Connection other than "close" or "keep-alive"), a HTTP/1.1 request without
 * Host. What it accepts, llhttp and aiohttp read alike: the same target, version, header names
 * and values (leading and trailing blanks of a value stripped), keep-alive and body length
 * (tests/test_c_fuzz.py compares the two on generated heads). The target is not checked here: the
 * caller takes a head only for a target llhttp has read before (its route is cached).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

/* aiohttp's limits (HttpRequestParser's defaults): a field's name and value together, the headers. */
#define MAX_FIELD 8190
#define MAX_HEADERS 64

static int is_tchar(unsigned char c) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
        return 1;
    return c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

/* Whether the name (n bytes) is `lower` (a lower-case string literal) in any case. */
#define NAME_IS(name, n, lower) ((n) == (Py_ssize_t)sizeof(lower) - 1 && name_is((name), (n), (lower)))
static int name_is(const unsigned char *name, Py_ssize_t n, const char *lower) {
    Py_ssize_t i;
    for (i = 0; i < n; i++) {
        unsigned char c = name[i];
        if (c >= 'A' && c <= 'Z')
            c = (unsigned char)(c - 'A' + 'a');
        if (c != (unsigned char)lower[i])
            return 0;
    }
    return 1;
}

static int same_name(const unsigned char *a, Py_ssize_t na, const unsigned char *b, Py_ssize_t nb) {
    Py_ssize_t i;
    if (na != nb)
        return 0;
    for (i = 0; i < na; i++) {
        unsigned char x = a[i], y = b[i];
        if (x >= 'A' && x <= 'Z')
            x = (unsigned char)(x - 'A' + 'a');
        if (y >= 'A' && y <= 'Z')
            y = (unsigned char)(y - 'A' + 'a');
        if (x != y)
            return 0;
    }
    return 1;
}

/* A str of n bytes checked to be ASCII (below 0x80): made without decoding them again. */
static PyObject *ascii_str(const void *bytes, Py_ssize_t n) {
    PyObject *text = PyUnicode_New(n, 127);
    if (text != NULL)
        memcpy(PyUnicode_1BYTE_DATA(text), bytes, (size_t)n);
    return text;
}

typedef struct {
    const unsigned char *name, *value;
    Py_ssize_t n_name, n_value;
} Field;

/* A header's name as aiohttp names it: the canonical name (`names`: lower case -> its istr) of a
 * known header, istr(name) of another, the name itself (a str) past 64 bytes. */
static PyObject *header_name(const unsigned char *name, Py_ssize_t n, PyObject *names, PyObject *istr) {
    char lower[64];
    PyObject *key, *known, *text;
    Py_ssize_t i;
    if (n > 64)
        return ascii_str(name, n);
    for (i = 0; i < n; i++)
        lower[i] = (char)(name[i] >= 'A' && name[i] <= 'Z' ? name[i] - 'A' + 'a' : name[i]);
    key = ascii_str(lower, n);
    if (key == NULL)
        return NULL;
    known = PyDict_GetItemWithError(names, key);
    Py_DECREF(key);
    if (known != NULL) {
        Py_INCREF(known);
        return known;
    }
    if (PyErr_Occurred())
        return NULL;
    text = ascii_str(name, n);
    if (text == NULL)
        return NULL;
    key = PyObject_CallOneArg(istr, text);
    Py_DECREF(text);
    return key;
}

PyDoc_STRVAR(request_head_doc,
"request_head(buf, end, names, istr) -> (target, minor, should_close, content_length, headers) or None\n\n"
"The head buf[:end] (ending with its blank line) of a plain POST request: its target (str), HTTP/1.minor,\n"
"whether the connection closes after it, its Content-Length (-1: none) and its headers as (name, value)\n"
"pairs in order, named as aiohttp names them (names: each known header's lower-case name -> its istr;\n"
"istr(name) for another); None for any other head (llhttp reads it).");

static PyObject *request_head(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    Py_buffer view;
    const unsigned char *p, *line, *stop;
    Py_ssize_t end, n_fields = 0, i, j, content_length = -1;
    Py_ssize_t target_start, target_len;
    Field fields[MAX_HEADERS];
    int minor, has_host = 0, connection = 0; /* connection: 0 none, 1 close, 2 keep-alive */
    int should_close;
    PyObject *result = NULL, *headers = NULL, *target = NULL;

    if (nargs != 4 || !PyDict_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "request_head() takes the buffer, the end of the head, the known names and istr");
        return NULL;
    }
    end = PyLong_AsSsize_t(args[1]);
    if (end == -1 && PyErr_Occurred())
        return NULL;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (end < 4 || end > view.len)
        goto refused;
    p = view.buf;
    stop = p + end; /* the head ends with CRLF CRLF */
    if (p[end - 4] != '\r' || p[end - 3] != '\n' || p[end - 2] != '\r' || p[end - 1] != '\n')
        goto refused;

    /* The request line: "POST " target " HTTP/1.x" CRLF. */
    if (end < 5 || memcmp(p, "POST ", 5) != 0)
        goto refused;
    target_start = 5;
    if (p[target_start] != '/') /* origin form only */
        goto refused;
    for (i = target_start; p + i < stop && p[i] > 0x20 && p[i] < 0x7f; i++)
        ;
    target_len = i - target_start;
    if (target_len == 0 || target_len > MAX_FIELD || stop - (p + i) < 11 || memcmp(p + i, " HTTP/1.", 8) != 0)
        goto refused;
    i += 8;
    if (p[i] != '0' && p[i] != '1')
        goto refused;
    minor = p[i] - '0';
    if (p[i + 1] != '\r' || p[i + 2] != '\n')
        goto refused;
    line = p + i + 3;

    /* The header lines, up to the blank line. */
    while (!(line[0] == '\r' && line[1] == '\n')) {
        const unsigned char *q = line, *value, *value_end;
        Field *f;
        while (q < stop && is_tchar(*q))
            q++;
        if (q == line || q >= stop || *q != ':')
            goto refused;
        if (n_fields == MAX_HEADERS)
            goto refused;
        f = &fields[n_fields];
        f->name = line;
        f->n_name = q - line;
        q++;
        while (q < stop && (*q == ' ' || *q == '\t'))
            q++;
        value = q;
        while (q < stop && (*q == '\t' || (*q >= 0x20 && *q < 0x7f)))
            q++;
        if (q + 1 >= stop || q[0] != '\r' || q[1] != '\n')
            goto refused; /* a control character, a byte past ASCII or a bare CR/LF */
        value_end = q;
        while (value_end > value && (value_end[-1] == ' ' || value_end[-1] == '\t'))
            value_end--;
        f->value = value;
        f->n_value = value_end - value;
        if (f->n_value == 0 || f->n_name + (q - value) > MAX_FIELD)
            goto refused;
        for (j = 0; j < n_fields; j++)
            if (same_name(fields[j].name, fields[j].n_name, f->name, f->n_name))
                goto refused;
        if (NAME_IS(f->name, f->n_name, "content-length")) {
            Py_ssize_t k;
            if (f->n_value > 15)
                goto refused;
            content_length = 0;
            for (k = 0; k < f->n_value; k++) {
                if (f->value[k] < '0' || f->value[k] > '9')
                    goto refused;
                content_length = content_length * 10 + (f->value[k] - '0');
            }
        } else if (NAME_IS(f->name, f->n_name, "connection")) {
            if (NAME_IS(f->value, f->n_value, "close"))
                connection = 1;
            else if (NAME_IS(f->value, f->n_value, "keep-alive"))
                connection = 2;
            else
                goto refused;
        } else if (NAME_IS(f->name, f->n_name, "host")) {
            has_host = 1;
        } else if (NAME_IS(f->name, f->n_name, "transfer-encoding") || NAME_IS(f->name, f->n_name, "content-encoding") ||
                   NAME_IS(f->name, f->n_name, "expect") || NAME_IS(f->name, f->n_name, "upgrade") ||
                   NAME_IS(f->name, f->n_name, "proxy-connection") || NAME_IS(f->name, f->n_name, "sec-websocket-key1")) {
            goto refused;
        }
        n_fields++;
        line = q + 2;
        if (line + 1 >= stop)
            goto refused;
    }
    if (line + 2 != stop || (minor == 1 && !has_host))
        goto refused;
    should_close = minor == 1 ? connection == 1 : connection != 2;

    target = ascii_str(p + target_start, target_len);
    headers = PyList_New(n_fields);
    if (target == NULL || headers == NULL)
        goto done;
    for (j = 0; j < n_fields; j++) {
        PyObject *pair = PyTuple_New(2), *item;
        if (pair == NULL)
            goto done;
        PyList_SET_ITEM(headers, j, pair);
        if ((item = header_name(fields[j].name, fields[j].n_name, args[2], args[3])) == NULL)
            goto done;
        PyTuple_SET_ITEM(pair, 0, item);
        if ((item = ascii_str(fields[j].value, fields[j].n_value)) == NULL)
            goto done;
        PyTuple_SET_ITEM(pair, 1, item);
    }
    {
        PyObject *minor_obj = PyLong_FromLong(minor), *length = PyLong_FromSsize_t(content_length);
        if (minor_obj != NULL && length != NULL)
            result = PyTuple_Pack(5, target, minor_obj, should_close ? Py_True : Py_False, length, headers);
        Py_XDECREF(minor_obj);
        Py_XDECREF(length);
    }
    goto done;

refused:
    result = Py_None;
    Py_INCREF(result);
done:
    Py_XDECREF(target);
    Py_XDECREF(headers);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"request_head", (PyCFunction)(void (*)(void))request_head, METH_FASTCALL, request_head_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_ffhttp", "The head of a plain HTTP/1.x scoring request, read in C.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__ffhttp(void) { return PyModule_Create(&module); }
