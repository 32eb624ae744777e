/*
 * numpy arrays made and read without numpy's headers, so that building forestflow needs no numpy: the
 * isolated build environment pip makes for a source install is then setuptools alone.
 *
 * Arrays are made by numpy's own PyArray_New, found at run time in the function table numpy publishes
 * for compiled extensions (the ``_ARRAY_API`` capsule, what numpy's import_array reads), and read
 * through the leading fields of numpy's array and dtype objects. Both are numpy's ABI: table slots keep
 * their numbers, and those fields their places, from numpy 1.7 through 2.x (2.0 kept dtypes' type_num
 * where it was on purpose). nd_init accepts the two ABI versions this was written for (1.x's and 2.x's)
 * and checks the layout and the type numbers against numpy's own answers (the buffer protocol,
 * dtype.num) when the extension is imported: on a numpy that differs the import fails with a clear
 * ImportError, rather than memory being read wrongly.
 *
 * Calling numpy.empty instead would cost about 600 more instructions a column (callgrind), which is
 * 11% of reading a 3-row BASIC /score body.
 *
 * Each extension that includes this header has its own copy of the state below.
 */
#ifndef FORESTFLOW_NDARRAY_H
#define FORESTFLOW_NDARRAY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>

/* numpy's type numbers (its enum NPY_TYPES), those used here. */
enum {
    ND_BOOL = 0, ND_BYTE, ND_UBYTE, ND_SHORT, ND_USHORT, ND_INT, ND_UINT, ND_LONG, ND_ULONG, ND_LONGLONG, ND_ULONGLONG,
    ND_FLOAT, ND_DOUBLE, ND_OBJECT = 17, ND_HALF = 23, ND_NTYPES
};
#if LONG_MAX == INT64_MAX
#define ND_INT64 ND_LONG
#else
#define ND_INT64 ND_LONGLONG
#endif
#define ND_INT32 ND_INT
#define ND_INT16 ND_SHORT
#define ND_INT8 ND_BYTE
#define ND_FLOAT32 ND_FLOAT
#define ND_FLOAT64 ND_DOUBLE

/* The leading fields of a numpy dtype. */
typedef struct {
    PyObject_HEAD
    PyTypeObject *typeobj;
    char kind, type, byteorder, former_flags;
    int type_num;
} NdDescr;

/* The leading fields of a numpy array. */
typedef struct {
    PyObject_HEAD
    char *data;
    int nd;
    Py_ssize_t *dimensions;
    Py_ssize_t *strides;
    PyObject *base;
    NdDescr *descr;
} NdArray;

/* numpy's PyArray_New (table slot 93). */
typedef PyObject *(*NdNewFunc)(PyTypeObject *, int, const Py_ssize_t *, int, const Py_ssize_t *, void *, int, int, PyObject *);
/* The two ABI versions numpy's PyArray_GetNDArrayCVersion (table slot 0) answers, 1.x's and 2.x's. */
#define ND_ABI_1 0x01000009u
#define ND_ABI_2 0x02000000u

static PyTypeObject *nd_type;          /* numpy.ndarray (table slot 2) */
static NdNewFunc nd_array_new;
static PyObject *nd_dtypes[ND_NTYPES]; /* numpy.dtype of each type number below (NULL for the others) */
static Py_ssize_t nd_itemsizes[ND_NTYPES];
/* Type codes of the type numbers checked and used here, by type number. */
static const char ND_CODES[ND_NTYPES] = {
    [ND_BOOL] = '?', [ND_BYTE] = 'b', [ND_UBYTE] = 'B', [ND_SHORT] = 'h', [ND_USHORT] = 'H', [ND_INT] = 'i',
    [ND_UINT] = 'I', [ND_LONG] = 'l', [ND_ULONG] = 'L', [ND_LONGLONG] = 'q', [ND_ULONGLONG] = 'Q', [ND_FLOAT] = 'f',
    [ND_DOUBLE] = 'd', [ND_OBJECT] = 'O', [ND_HALF] = 'e',
};

static inline int nd_check(PyObject *o) { return Py_IS_TYPE(o, nd_type) || PyType_IsSubtype(Py_TYPE(o), nd_type); }
static inline char *nd_data(PyObject *array) { return ((NdArray *)array)->data; }
static inline int nd_type_num(PyObject *array) { return ((NdArray *)array)->descr->type_num; }
/* The number of elements of an array. */
static inline Py_ssize_t nd_size(PyObject *array) {
    const NdArray *a = (const NdArray *)array;
    Py_ssize_t n = 1;
    for (int k = 0; k < a->nd; k++)
        n *= a->dimensions[k];
    return n;
}

/* A new 1-D C-contiguous array of ``n`` elements of a type number above (object arrays hold NULLs, which
 * numpy reads as None). */
static inline PyObject *nd_new(int type_num, Py_ssize_t n) {
    return nd_array_new(nd_type, 1, &n, type_num, NULL, NULL, 0, 0, NULL);
}

/* numpy's function table, or NULL with an exception set. */
static void **nd_api_table(void) {
    PyObject *module = PyImport_ImportModule("numpy._core._multiarray_umath"), *capsule;
    void **table;
    if (module == NULL && PyErr_ExceptionMatches(PyExc_ModuleNotFoundError)) { /* numpy 1.x */
        PyErr_Clear();
        module = PyImport_ImportModule("numpy.core._multiarray_umath");
    }
    if (module == NULL)
        return NULL;
    capsule = PyObject_GetAttrString(module, "_ARRAY_API");
    Py_DECREF(module);
    if (capsule == NULL)
        return NULL;
    table = PyCapsule_CheckExact(capsule) ? (void **)PyCapsule_GetPointer(capsule, NULL) : NULL;
    Py_DECREF(capsule); /* the table is static in numpy's module, which stays imported */
    if (table == NULL && !PyErr_Occurred())
        PyErr_SetString(PyExc_ImportError, "numpy's _ARRAY_API is not a capsule");
    return table;
}

static long nd_int_attr(PyObject *o, const char *name) {
    PyObject *value = PyObject_GetAttrString(o, name);
    long n = value == NULL ? -1 : PyLong_AsLong(value);
    Py_XDECREF(value);
    return n;
}

/* 0 when ``view`` (a transposed array of numpy.empty((3, 2), dtype)) reads as its buffer says, -1 otherwise. */
static int nd_layout_matches(PyObject *view, int type_num, char byteorder) {
    Py_buffer buffer;
    const NdArray *a = (const NdArray *)view;
    int same;
    if (!nd_check(view) || PyObject_GetBuffer(view, &buffer, PyBUF_RECORDS_RO) < 0)
        return -1;
    same = a->data == buffer.buf && a->nd == 2 && buffer.ndim == 2 && a->dimensions[0] == buffer.shape[0] &&
           a->dimensions[1] == buffer.shape[1] && a->strides[0] == buffer.strides[0] && a->strides[1] == buffer.strides[1] &&
           a->descr->type_num == type_num && a->descr->byteorder == byteorder && buffer.itemsize == nd_itemsizes[type_num];
    PyBuffer_Release(&buffer);
    return same ? 0 : -1;
}

/* Imports numpy and checks its ABI and layout (above); -1 with ImportError set when it cannot be used. */
static int nd_init(void) {
    PyObject *numpy = PyImport_ImportModule("numpy"), *ndarray = NULL, *empty = NULL, *dtype = NULL, *check = NULL;
    void **table;
    unsigned int abi;
    int status = -1;
    if (numpy == NULL)
        return -1;
    table = nd_api_table();
    if (table == NULL)
        goto done;
    abi = ((unsigned int (*)(void))table[0])();
    if (abi != ND_ABI_1 && abi != ND_ABI_2)
        goto done;
    nd_type = (PyTypeObject *)table[2];
    nd_array_new = (NdNewFunc)table[93];
    ndarray = PyObject_GetAttrString(numpy, "ndarray");
    empty = PyObject_GetAttrString(numpy, "empty");
    dtype = PyObject_GetAttrString(numpy, "dtype");
    if (ndarray != (PyObject *)nd_type || empty == NULL || dtype == NULL)
        goto done;
    for (int t = 0; t < ND_NTYPES; t++) {
        if (ND_CODES[t] == 0)
            continue;
        nd_dtypes[t] = PyObject_CallFunction(dtype, "s#", &ND_CODES[t], (Py_ssize_t)1);
        if (nd_dtypes[t] == NULL || nd_int_attr(nd_dtypes[t], "num") != t)
            goto done;
        nd_itemsizes[t] = nd_int_attr(nd_dtypes[t], "itemsize");
        if (nd_itemsizes[t] <= 0)
            goto done;
    }
    /* A float64 array (native order: '=') and a big-endian int32 one, both transposed (strides not C order). */
    for (int k = 0; k < 2; k++) {
        PyObject *descr = k == 0 ? Py_NewRef(nd_dtypes[ND_DOUBLE]) : PyObject_CallFunction(dtype, "s", ">i4");
        PyObject *array = descr == NULL ? NULL : PyObject_CallFunction(empty, "(ii)O", 3, 2, descr);
        check = array == NULL ? NULL : PyObject_GetAttrString(array, "T");
        Py_XDECREF(array);
        Py_XDECREF(descr);
        if (check == NULL || nd_layout_matches(check, k == 0 ? ND_DOUBLE : ND_INT, k == 0 ? '=' : '>') < 0)
            goto done;
        Py_CLEAR(check);
    }
    /* PyArray_New: a 1-D int64 array of 5 elements, as its buffer and dtype say. */
    check = nd_new(ND_INT64, 5);
    if (check != NULL) {
        Py_buffer buffer;
        PyObject *descr = nd_check(check) ? PyObject_GetAttrString(check, "dtype") : NULL;
        int same = descr != NULL && nd_int_attr(descr, "num") == ND_INT64 && PyObject_GetBuffer(check, &buffer, PyBUF_RECORDS_RO) == 0;
        Py_XDECREF(descr);
        if (!same)
            goto done;
        same = buffer.ndim == 1 && buffer.shape[0] == 5 && buffer.strides[0] == 8 && buffer.buf == nd_data(check);
        PyBuffer_Release(&buffer);
        if (!same)
            goto done;
    }
    status = check != NULL ? 0 : -1;
done:
    Py_XDECREF(check);
    Py_XDECREF(dtype);
    Py_XDECREF(empty);
    Py_XDECREF(ndarray);
    if (status < 0) {
        PyObject *version = PyObject_GetAttrString(numpy, "__version__");
        PyErr_Clear();
        PyErr_Format(PyExc_ImportError, "forestflow's C extensions cannot read the arrays of numpy %S (their layout or type numbers differ)",
                     version != NULL ? version : Py_None);
        Py_XDECREF(version);
    }
    Py_DECREF(numpy);
    return status;
}

#endif
