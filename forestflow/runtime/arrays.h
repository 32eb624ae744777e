/*
 * Numpy arrays read through the buffer protocol (no numpy headers), for the runtime's C extensions
 * (_h2o_trees.c, _treeshap.c): an array is taken only when it is C-contiguous and has the expected
 * item type, item size and number of dimensions.
 */
#ifndef FORESTFLOW_RUNTIME_ARRAYS_H
#define FORESTFLOW_RUNTIME_ARRAYS_H

#include <Python.h>

/* A C-contiguous buffer of `ndim` dimensions whose items have this struct format letter and size
 * (int64 is 'l' on LP64 hosts and 'q' elsewhere: asking for 'q' accepts both). */
static int get_array(PyObject *obj, Py_buffer *view, const char *name, char code, Py_ssize_t itemsize, int ndim, int writable) {
    const char *fmt;
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0) {
        PyErr_Format(PyExc_TypeError, "%s must be a C-contiguous%s array", name, writable ? " writable" : "");
        return -1;
    }
    fmt = view->format ? view->format : "B";
    if (fmt[0] == '<' || fmt[0] == '=' || fmt[0] == '@' || fmt[0] == '|')
        fmt++;
    if (view->itemsize != itemsize || !(fmt[0] == code || (code == 'q' && fmt[0] == 'l')) || fmt[1] != '\0' || view->ndim != ndim) {
        PyErr_Format(PyExc_TypeError, "%s must be a %d-D array of '%c' items of %zd bytes, got %d-D '%s'", name, ndim, code, itemsize,
                     view->ndim, view->format ? view->format : "B");
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* The length of dimension `i` of a buffer. */
static Py_ssize_t dim(const Py_buffer *v, int i) { return v->shape ? v->shape[i] : v->len / v->itemsize; }

#endif
