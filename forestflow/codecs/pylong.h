/* Python ints read as C integers the cheap way: shared by the C extensions that read times and counts. */
#ifndef FORESTFLOW_PYLONG_H
#define FORESTFLOW_PYLONG_H

#include <Python.h>
#include <limits.h>

/* An int as a long long: through PyLong_AsLong where long is as wide (CPython 3.11's PyLong_AsLongLong
 * converts every int past 30 bits, e.g. a time in ms, through _PyLong_AsByteArray, several times the cost). */
static inline long long as_long_long(PyObject *o) {
#if LONG_MAX == LLONG_MAX
    return PyLong_AsLong(o);
#else
    return PyLong_AsLongLong(o);
#endif
}

#endif
