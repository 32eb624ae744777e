/*
 * forestflow.runtime._treeshap: exact path-dependent TreeSHAP (Lundberg, Erion & Lee 2018,
 * "Consistent Individualized Feature Attribution for Tree Ensembles", Algorithm 2) over a whole batch.
 *
 * treeshap.py holds the forest as one node table (ShapForest: children, the original input column a
 * split reads, covers, leaf values, roots, the output group of each tree). Which child a row takes at
 * each internal node is not decided here: the format's own scoring kernel wrote it into `decisions`
 * (uint8, rows x nodes, nonzero = right), so missing values and categorical sets follow the format.
 *
 * check() validates a node table once (every index in range, each tree a real tree: no node reached
 * twice, no cycle; covers and leaf values finite) and returns the deepest tree's depth; shap() trusts
 * a table that passed it and refuses arrays whose shapes do not fit one another. The GIL is released
 * while the rows are explained.
 *
 * Arithmetic is in doubles; the path is the paper's list of (feature, zero fraction, one fraction,
 * permutation weight) entries, one copy per tree level in a scratch buffer of (D+1)(D+2)/2 entries.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "arrays.h"

/* Deepest tree accepted: the recursion and the scratch path grow with depth. */
#define MAX_DEPTH 512

typedef struct {
    const int32_t *left, *right, *feature;
    const double *cover, *value;
    Py_ssize_t n_nodes;
} Forest;

typedef struct {
    int32_t d;   /* the input column (-1 for the path's first, empty entry) */
    double z;    /* fraction of the training weight that follows this path when the column is unknown */
    double o;    /* 1 if the row itself follows this path, else 0 */
    double w;    /* the permutation weight of subsets of this size */
} Elem;

/* Fraction of a node's cover that goes to `child` (an even split if the node has no cover at all). */
static double fraction(const Forest *f, int32_t child, int32_t parent) {
    double r = f->cover[parent];
    return r > 0 ? f->cover[child] / r : 0.5;
}

/* INV[k] = 1/k: the weights' divisions by small integers become multiplications (the walk's hot loops). */
static double INV[MAX_DEPTH + 3];

/* EXTEND: add (pi, pz, po) to the path m of length l; permutation weights updated in place. */
static void extend(Elem *m, int l, double pz, double po, int32_t pi) {
    double inv = INV[l + 1];
    int i;
    m[l].d = pi;
    m[l].z = pz;
    m[l].o = po;
    m[l].w = l == 0 ? 1.0 : 0.0;
    for (i = l - 1; i >= 0; i--) {
        m[i + 1].w += po * m[i].w * (double)(i + 1) * inv;
        m[i].w = pz * m[i].w * (double)(l - i) * inv;
    }
}

/* UNWIND: remove entry k from the path m of length n (the weights as if it had never been added). */
static void unwind(Elem *m, int n, int k) {
    double o = m[k].o, z = m[k].z, next = m[n - 1].w, t, inv_n = INV[n];
    int j;
    if (o != 0) {
        double scale = (double)n / o;
        for (j = n - 2; j >= 0; j--) {
            t = m[j].w;
            m[j].w = next * scale * INV[j + 1];
            next = t - m[j].w * z * (double)(n - 1 - j) * inv_n;
        }
    } else {
        double scale = (double)n / z;
        for (j = n - 2; j >= 0; j--)
            m[j].w = m[j].w * scale * INV[n - 1 - j];
    }
    for (j = k; j < n - 1; j++) {
        m[j].d = m[j + 1].d;
        m[j].z = m[j + 1].z;
        m[j].o = m[j + 1].o;
    }
}

/* The sum of the weights UNWIND(m, k) would leave, without changing m. */
static double unwound_sum(const Elem *m, int n, int k) {
    double o = m[k].o, z = m[k].z, next = m[n - 1].w, total = 0.0, t, inv_n = INV[n];
    int j;
    if (o != 0) {
        double scale = (double)n / o;
        for (j = n - 2; j >= 0; j--) {
            t = next * scale * INV[j + 1];
            total += t;
            next = m[j].w - t * z * (double)(n - 1 - j) * inv_n;
        }
    } else {
        double scale = (double)n / z;
        for (j = n - 2; j >= 0; j--)
            total += m[j].w * scale * INV[n - 1 - j];
    }
    return total;
}

/* RECURSE: node j reached with the parent's path (length l) plus the entry (pi, pz, po). */
static void recurse(const Forest *f, const uint8_t *dec, double *phi, int32_t j, Elem *parent, int l, double pz, double po, int32_t pi) {
    Elem *m = parent + l; /* this level's copy, right after the parent's live entries */
    int32_t hot, cold, d;
    double iz = 1.0, io = 1.0, zh, zc;
    int i, k;
    if (pz == 0 && po == 0) /* no subset of columns reaches this node: it adds nothing */
        return;
    memcpy(m, parent, (size_t)l * sizeof(Elem));
    extend(m, l, pz, po, pi);
    l += 1;
    if (f->left[j] < 0) {
        double v = f->value[j];
        for (i = 1; i < l; i++)
            phi[m[i].d] += unwound_sum(m, l, i) * (m[i].o - m[i].z) * v;
        return;
    }
    d = f->feature[j];
    hot = dec[j] ? f->right[j] : f->left[j];
    cold = dec[j] ? f->left[j] : f->right[j];
    zh = fraction(f, hot, j);
    zc = fraction(f, cold, j);
    for (k = 1; k < l; k++)
        if (m[k].d == d)
            break;
    if (k < l) { /* the column was split on above: undo that entry and fold it into this split */
        iz = m[k].z;
        io = m[k].o;
        unwind(m, l, k);
        l -= 1;
    }
    recurse(f, dec, phi, hot, m, l, iz * zh, io, d);
    recurse(f, dec, phi, cold, m, l, iz * zc, 0.0, d);
}

/* The tree's expected value under its own covers (the same fractions the path uses). */
static double expected(const Forest *f, int32_t j) {
    if (f->left[j] < 0)
        return f->value[j];
    return fraction(f, f->left[j], j) * expected(f, f->left[j]) + fraction(f, f->right[j], j) * expected(f, f->right[j]);
}

/* The node table's arrays, in the order both functions take them. */
enum { A_LEFT, A_RIGHT, A_FEATURE, A_COVER, A_VALUE, A_ROOTS, A_GROUP, A_TABLE };
static const struct {
    const char *name;
    char code;
    Py_ssize_t size;
} table_spec[A_TABLE] = {
    {"left", 'i', 4}, {"right", 'i', 4}, {"feature", 'i', 4}, {"cover", 'd', 8}, {"value", 'd', 8}, {"roots", 'i', 4}, {"group", 'i', 4},
};

static int get_table(PyObject *const *objs, Py_buffer *views, int *got) {
    for (*got = 0; *got < A_TABLE; (*got)++)
        if (get_array(objs[*got], &views[*got], table_spec[*got].name, table_spec[*got].code, table_spec[*got].size, 1, 0) < 0)
            return -1;
    return 0;
}

/* The forest behind the table's views; an error message when its arrays do not fit one another. */
static const char *forest_of(const Py_buffer *views, Forest *f) {
    f->left = views[A_LEFT].buf;
    f->right = views[A_RIGHT].buf;
    f->feature = views[A_FEATURE].buf;
    f->cover = views[A_COVER].buf;
    f->value = views[A_VALUE].buf;
    f->n_nodes = dim(&views[A_LEFT], 0);
    if (dim(&views[A_RIGHT], 0) != f->n_nodes || dim(&views[A_FEATURE], 0) != f->n_nodes || dim(&views[A_COVER], 0) != f->n_nodes ||
        dim(&views[A_VALUE], 0) != f->n_nodes || dim(&views[A_GROUP], 0) != dim(&views[A_ROOTS], 0))
        return "the node arrays (or roots and group) differ in length";
    if (f->n_nodes > INT32_MAX - 2)
        return "too many nodes";
    return NULL;
}

static void release(Py_buffer *views, int got) {
    while (got-- > 0)
        PyBuffer_Release(&views[got]);
}

/* The structural check; NULL when the table is sound (*depth = the deepest tree's depth), else why not. */
static const char *check_table(const Forest *f, const int32_t *roots, const int32_t *group, Py_ssize_t n_trees, Py_ssize_t n_features,
                               Py_ssize_t n_groups, int *depth) {
    uint8_t *seen;
    int32_t *stack, *level;
    Py_ssize_t t, top, n = f->n_nodes;
    const char *error = NULL;
    *depth = 0;
    seen = calloc((size_t)(n > 0 ? n : 1), 1);
    stack = malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    level = malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    if (seen == NULL || stack == NULL || level == NULL) {
        error = "out of memory";
        goto done;
    }
    for (t = 0; error == NULL && t < n_trees; t++) {
        if (roots[t] < 0 || roots[t] >= n) {
            error = "a tree's root is outside the node table";
            break;
        }
        if (group[t] < 0 || group[t] >= n_groups) {
            error = "a tree's output group is out of range";
            break;
        }
        top = 0;
        stack[top] = roots[t];
        level[top++] = 0;
        while (top > 0) {
            int32_t j = stack[--top], lv = level[top];
            if (seen[j]) {
                error = "a node is reached twice (the trees are not trees)";
                break;
            }
            seen[j] = 1;
            if (!isfinite(f->cover[j]) || f->cover[j] < 0) {
                error = "a cover is negative or not finite";
                break;
            }
            if (f->left[j] < 0) {
                if (f->left[j] != -1 || f->right[j] != -1) {
                    error = "a leaf's children must both be -1";
                    break;
                }
                if (!isfinite(f->value[j])) {
                    error = "a leaf value is not finite";
                    break;
                }
                if (lv > *depth)
                    *depth = lv;
                continue;
            }
            if (f->left[j] >= n || f->right[j] < 0 || f->right[j] >= n) {
                error = "a child is outside the node table";
                break;
            }
            if (f->feature[j] < 0 || f->feature[j] >= n_features) {
                error = "a split reads a column out of range";
                break;
            }
            if (lv + 1 > MAX_DEPTH) {
                error = "a tree is deeper than 512 levels";
                break;
            }
            /* The stack cannot overflow: every node is pushed at most once before `seen` stops it... */
            if (top + 2 > n) {
                error = "a node is reached twice (the trees are not trees)";
                break;
            }
            stack[top] = f->left[j];
            level[top++] = lv + 1;
            stack[top] = f->right[j];
            level[top++] = lv + 1;
        }
    }
done:
    free(seen);
    free(stack);
    free(level);
    return error;
}

PyDoc_STRVAR(check_doc, "check(left, right, feature, cover, value, roots, group, n_features, n_groups, expected) -> depth\n\n"
                        "Raises ValueError unless the node table is a forest shap() can walk: every index in range,\n"
                        "each tree a tree (no node reached twice), covers >= 0, covers and leaf values finite.\n"
                        "Returns the depth of the deepest tree (a single leaf has depth 0) and writes each tree's\n"
                        "expected value (under its covers) into expected (float64, one per tree).");

static PyObject *check(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *objs[A_TABLE], *o_expected;
    Py_buffer views[A_TABLE], expected_v;
    Py_ssize_t n_features, n_groups, t;
    int got = 0, depth = 0;
    const char *error = NULL;
    Forest f;
    if (!PyArg_ParseTuple(args, "OOOOOOOnnO:check", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &objs[5], &objs[6], &n_features,
                          &n_groups, &o_expected))
        return NULL;
    if (get_table(objs, views, &got) < 0) {
        release(views, got);
        return NULL;
    }
    if (get_array(o_expected, &expected_v, "expected", 'd', 8, 1, 1) < 0) {
        release(views, got);
        return NULL;
    }
    error = forest_of(views, &f);
    if (error == NULL && dim(&expected_v, 0) != dim(&views[A_ROOTS], 0))
        error = "expected must hold one value per tree";
    if (error == NULL && (n_features < 0 || n_groups < 1))
        error = "n_features must be >= 0 and n_groups >= 1";
    if (error == NULL) {
        Py_BEGIN_ALLOW_THREADS
        error = check_table(&f, views[A_ROOTS].buf, views[A_GROUP].buf, dim(&views[A_ROOTS], 0), n_features, n_groups, &depth);
        for (t = 0; error == NULL && t < dim(&views[A_ROOTS], 0); t++) /* only once the table is known sound */
            ((double *)expected_v.buf)[t] = expected(&f, ((const int32_t *)views[A_ROOTS].buf)[t]);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&expected_v);
    release(views, got);
    if (error != NULL) {
        PyErr_Format(PyExc_ValueError, "invalid tree table: %s", error);
        return NULL;
    }
    return PyLong_FromLong(depth);
}

PyDoc_STRVAR(shap_doc, "shap(left, right, feature, cover, value, roots, group, n_features, depth, decisions, out)\n\n"
                       "Adds every tree's TreeSHAP values into out (float64, rows x groups x (features + 1), the\n"
                       "last slot of each group, the bias, left as it is); decisions is uint8, rows x nodes\n"
                       "(nonzero: the row goes right). The table must have passed check() with the same n_features\n"
                       "(depth is what it returned).");

static PyObject *shap(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *objs[A_TABLE], *o_dec, *o_out;
    Py_buffer views[A_TABLE], dec_v, out_v;
    int got = 0, depth, have_dec = 0, have_out = 0;
    const char *error = NULL;
    Py_ssize_t n_features, n_trees, rows, groups, width, r, t;
    Forest f;
    Elem *scratch = NULL;
    if (!PyArg_ParseTuple(args, "OOOOOOOniOO:shap", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &objs[5], &objs[6], &n_features, &depth,
                          &o_dec, &o_out))
        return NULL;
    if (get_table(objs, views, &got) < 0)
        goto done;
    if (get_array(o_dec, &dec_v, "decisions", 'B', 1, 2, 0) < 0)
        goto done;
    have_dec = 1;
    if (get_array(o_out, &out_v, "out", 'd', 8, 3, 1) < 0)
        goto done;
    have_out = 1;
    n_trees = dim(&views[A_ROOTS], 0);
    rows = dim(&dec_v, 0);
    groups = dim(&out_v, 1);
    width = dim(&out_v, 2);
    if (forest_of(views, &f) != NULL || dim(&dec_v, 1) != f.n_nodes || dim(&out_v, 0) != rows || width != n_features + 1 || groups < 1 || depth < 0 || depth > MAX_DEPTH) {
        error = "array shapes do not fit one another";
        goto done;
    }
    for (t = 0; t < n_trees; t++)
        if (((const int32_t *)views[A_GROUP].buf)[t] < 0 || ((const int32_t *)views[A_GROUP].buf)[t] >= groups) {
            error = "a tree's output group is out of range";
            goto done;
        }
    scratch = PyMem_RawMalloc((size_t)(depth + 2) * (size_t)(depth + 3) / 2 * sizeof(Elem));
    if (scratch == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    {
        const int32_t *roots = views[A_ROOTS].buf, *group = views[A_GROUP].buf;
        const uint8_t *dec = dec_v.buf;
        double *out = out_v.buf;
        for (r = 0; r < rows; r++)
            for (t = 0; t < n_trees; t++)
                recurse(&f, dec + r * f.n_nodes, out + (r * groups + group[t]) * width, roots[t], scratch, 0, 1.0, 1.0, -1);
    }
    Py_END_ALLOW_THREADS

done:
    PyMem_RawFree(scratch);
    if (have_out)
        PyBuffer_Release(&out_v);
    if (have_dec)
        PyBuffer_Release(&dec_v);
    release(views, got);
    if (error != NULL)
        PyErr_Format(PyExc_ValueError, "shap(): %s", error);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"check", check, METH_VARARGS, check_doc},
    {"shap", shap, METH_VARARGS, shap_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_treeshap", "Exact path-dependent TreeSHAP over a forest's node table, in C.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__treeshap(void) {
    int k;
    for (k = 1; k < MAX_DEPTH + 3; k++)
        INV[k] = 1.0 / (double)k;
    return PyModule_Create(&module);
}
