/*
 * forestflow.runtime._forest: one tree-ensemble kernel for XGBoost, LightGBM and scikit-learn models.
 *
 * runtime/trees/forest.py flattens a model into one node table for all its trees and calls
 * score() once per batch: every tree walked for every row, leaves summed per output group in
 * tree order (in float32 where the library sums in float32), averaged or weighted as the format
 * needs, then the link (identity, sigmoid, softmax, exp). decisions() gives the direction taken
 * at every internal node for every row (what exact TreeSHAP reads), by the same walk rules.
 *
 * The walk rules each format needs are flags of the node and parameters of the model:
 *  - a numeric node sends a row left when x < t (XGBoost, both in float32), x <= t (LightGBM,
 *    scikit-learn's histogram GBMs, in double) or (float)x <= t (scikit-learn's trees);
 *  - a missing value (NaN; LightGBM's "zero" missing type also |x| <= 1e-35, its "none" type
 *    reads NaN as 0) follows the node's default direction;
 *  - a categorical node looks the integer value up in its bitset: in the set goes left
 *    (LightGBM, scikit-learn) or right (XGBoost); a negative, huge or out-of-set value is "not in
 *    the set".
 *
 * Arrays come in through the buffer protocol (no numpy headers); their types and shapes are
 * checked before anything is read, and check() walks the tables once (every reference in range,
 * every node reached once: no cycle, no shared subtree) so score() need not check bounds.
 * The GIL is released while rows are scored.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "arrays.h"
#include "padded.h"

/* Columns of the int32 node table. */
enum { N_FEATURE, N_LEFT, N_RIGHT, N_FLAGS, N_CAT_START, N_CAT_WORDS, N_WIDTH };
/* Node flags. */
enum { F_DEFAULT_LEFT = 1, F_CATEGORICAL = 2, F_IN_SET_LEFT = 4, F_MISSING_SHIFT = 3 };
/* Missing kinds (flags >> F_MISSING_SHIFT & 3): NaN is missing; LightGBM's none (NaN read as 0) and zero. */
enum { MISSING_NAN = 0, MISSING_NONE = 1, MISSING_ZERO = 2 };
/* Slots of the float64 parameters. */
enum { P_COMPARE, P_FLOAT32_SUM, P_LINK, P_SCALE, P_DIVISOR, P_WEIGHTED, P_FEATURES, P_GROUPS, P_COUNT };
/* Numeric comparisons: left when ... */
enum { CMP_LT_F32 = 0, CMP_LE = 1, CMP_LE_X_F32 = 2 };
enum { LINK_IDENTITY = 0, LINK_SIGMOID = 1, LINK_SOFTMAX = 2, LINK_EXP = 3 };

typedef struct {
    const double *X;
    Py_ssize_t n_rows, n_features;
    const int32_t *nodes;
    Py_ssize_t n_nodes;
    const double *thresholds;
    const double *leaves;
    Py_ssize_t leaf_width;
    const uint32_t *cats;
    const int32_t *roots, *groups;
    const double *weights;
    Py_ssize_t n_trees;
    int compare;
} Forest;

/* 1 when the row goes right at this internal node. */
static int goes_right(const Forest *f, const int32_t *nd, Py_ssize_t node, const double *x) {
    int flags = nd[N_FLAGS];
    double v = x[nd[N_FEATURE]];
    int missing_kind = (flags >> F_MISSING_SHIFT) & 3;
    if (flags & F_CATEGORICAL) {
        int in_set = 0;
        if (isnan(v))
            return (flags & F_DEFAULT_LEFT) == 0;
        if (v >= 0 && v < 2147483648.0) {
            uint32_t c = (uint32_t)v, word = c >> 5;
            if ((Py_ssize_t)word < nd[N_CAT_WORDS])
                in_set = (f->cats[nd[N_CAT_START] + word] >> (c & 31)) & 1u;
        }
        return (flags & F_IN_SET_LEFT) ? !in_set : in_set;
    }
    if (missing_kind != MISSING_NAN && isnan(v))
        v = 0.0;
    if (isnan(v) || (missing_kind == MISSING_ZERO && v >= -1e-35f && v <= 1e-35f))
        return (flags & F_DEFAULT_LEFT) == 0;
    switch (f->compare) {
    case CMP_LT_F32:
        return !((float)v < (float)f->thresholds[node]);
    case CMP_LE_X_F32:
        return !((double)(float)v <= f->thresholds[node]);
    default:
        return !(v <= f->thresholds[node]);
    }
}

/* The leaf a row reaches from ``node``: plain numeric nodes (NaN missing) decided inline, the rest
 * by goes_right(); inlined once per comparison so the common case has no switch per node. */
static inline __attribute__((always_inline)) Py_ssize_t walk(const Forest *f, Py_ssize_t node, const double *x, int compare) {
    for (;;) {
        const int32_t *nd = f->nodes + node * N_WIDTH;
        int right;
        double v;
        if (nd[N_LEFT] < 0)
            return node;
        v = x[nd[N_FEATURE]];
        if ((nd[N_FLAGS] & ~F_DEFAULT_LEFT) == 0 && !isnan(v)) {
            double t = f->thresholds[node]; /* XGBoost's thresholds are float32 values: exact as doubles */
            right = compare == CMP_LE ? !(v <= t) : compare == CMP_LT_F32 ? !((double)(float)v < t) : !((double)(float)v <= t);
        } else {
            right = goes_right(f, nd, node, x);
        }
        node = right ? nd[N_RIGHT] : nd[N_LEFT];
    }
}

static Py_ssize_t leaf_of(const Forest *f, Py_ssize_t node, const double *x) {
    switch (f->compare) {
    case CMP_LT_F32:
        return walk(f, node, x, CMP_LT_F32);
    case CMP_LE_X_F32:
        return walk(f, node, x, CMP_LE_X_F32);
    default:
        return walk(f, node, x, CMP_LE);
    }
}

static void link_row(int link, double *p, Py_ssize_t g, int f32) {
    Py_ssize_t k;
    if (link == LINK_SIGMOID) {
        for (k = 0; k < g; k++) {
            if (f32) { /* XGBoost's common::Sigmoid */
                float xf = (float)p[k];
                float e = -xf < 88.7f ? -xf : 88.7f;
                p[k] = (double)(1.0f / (expf(e) + 1.0f + 1e-16f));
            } else {
                p[k] = 1.0 / (1.0 + exp(-p[k]));
            }
        }
    } else if (link == LINK_EXP) {
        for (k = 0; k < g; k++)
            p[k] = f32 ? (double)expf((float)p[k]) : exp(p[k]);
    } else if (link == LINK_SOFTMAX) {
        if (f32) { /* XGBoost's common::Softmax: float exponentials, a double sum */
            float wmax = (float)p[0];
            double wsum = 0.0;
            for (k = 1; k < g; k++)
                wmax = (float)p[k] > wmax ? (float)p[k] : wmax;
            for (k = 0; k < g; k++) {
                float e = expf((float)p[k] - wmax);
                p[k] = e;
                wsum += e;
            }
            for (k = 0; k < g; k++)
                p[k] = (double)((float)p[k] / (float)wsum);
        } else {
            double wmax = p[0], wsum = 0.0;
            for (k = 1; k < g; k++)
                wmax = p[k] > wmax ? p[k] : wmax;
            for (k = 0; k < g; k++) {
                p[k] = exp(p[k] - wmax);
                wsum += p[k];
            }
            for (k = 0; k < g; k++)
                p[k] /= wsum;
        }
    }
}

typedef struct {
    Forest f;
    const double *params, *base;
    double *out;
    Py_ssize_t n_groups;
} ScoreJob;

/* Rows are scored in blocks of BLOCK (padded.h): every tree walked for the block's rows before the next
 * tree, so a tree's nodes stay in cache; each row still sums its trees in tree order (the libraries' order). */

typedef struct {
    int f32, weighted, link;
    double scale, divisor;
    Py_ssize_t g, w;
    float acc32[BLOCK * 64]; /* n_groups <= 64, checked by score() */
} Sums;

static void sums_start(const ScoreJob *job, Sums *s, Py_ssize_t start, Py_ssize_t end) {
    Py_ssize_t i, k;
    for (i = start; i < end; i++)
        for (k = 0; k < s->g; k++) {
            if (s->f32)
                s->acc32[(i - start) * s->g + k] = (float)job->base[k];
            else
                job->out[i * s->g + k] = job->base[k];
        }
}

/* Row i (of the block from start) adds the leaf its tree t reached. */
static inline __attribute__((always_inline)) void sums_add(const ScoreJob *job, Sums *s, Py_ssize_t start, Py_ssize_t i, Py_ssize_t t,
                                                           Py_ssize_t leaf) {
    const Forest *f = &job->f;
    Py_ssize_t k, g = s->g, w = s->w;
    int32_t group = f->groups[t];
    if (s->f32) {
        float v = (float)f->leaves[leaf * w], *a = s->acc32 + (i - start) * g + group;
        if (s->weighted) { /* DART (XGBoost's Dart::InplacePredict): (base + leaf - base) * weight */
            float b = (float)job->base[group], shifted = b + v, d = (shifted - b) * (float)f->weights[t];
            *a += d;
        } else {
            *a += v;
        }
    } else {
        const double *v = f->leaves + leaf * w;
        double *o = job->out + i * g + group;
        if (w == 1)
            o[0] += s->weighted ? f->weights[t] * v[0] : v[0];
        else
            for (k = 0; k < w; k++)
                o[k] += v[k];
    }
}

static void sums_finish(const ScoreJob *job, Sums *s, Py_ssize_t start, Py_ssize_t end) {
    Py_ssize_t i, k, g = s->g;
    for (i = start; i < end; i++) {
        double *p = job->out + i * g;
        if (s->f32)
            for (k = 0; k < g; k++)
                p[k] = s->acc32[(i - start) * g + k];
        if (s->divisor != 1.0)
            for (k = 0; k < g; k++)
                p[k] /= s->divisor;
        if (s->scale != 1.0)
            for (k = 0; k < g; k++)
                p[k] *= s->scale;
        link_row(s->link, p, g, s->f32);
    }
}

static void sums_init(const ScoreJob *job, Sums *s) {
    s->f32 = job->params[P_FLOAT32_SUM] != 0;
    s->weighted = job->params[P_WEIGHTED] != 0;
    s->link = (int)job->params[P_LINK];
    s->scale = job->params[P_SCALE];
    s->divisor = job->params[P_DIVISOR];
    s->g = job->n_groups;
    s->w = job->f.leaf_width;
}

/* Every tree walked in the node table. */
static void score_rows(const ScoreJob *job, Sums *s) {
    const Forest *f = &job->f;
    Py_ssize_t start, end, i, t;
    for (start = 0; start < f->n_rows; start = end) {
        end = start + BLOCK < f->n_rows ? start + BLOCK : f->n_rows;
        sums_start(job, s, start, end);
        for (t = 0; t < f->n_trees; t++) {
            int32_t root = f->roots[t];
            for (i = start; i < end; i++)
                sums_add(job, s, start, i, t, leaf_of(f, root, f->X + i * f->n_features));
        }
        sums_finish(job, s, start, end);
    }
}

/* One row's slots: its features with missing values made values, as each family's rule says. */
#define DEFINE_EXPAND(NAME, T)                                                                                                  \
    static void NAME(const Layout *L, const double *x, T *out) {                                                                \
        const int32_t *src = L->sources, *fam = L->families;                                                                    \
        int32_t k;                                                                                                              \
        for (k = fam[FAM_NAN_LEFT]; k < fam[FAM_NAN_LEFT + 1]; k++)                                                             \
            out[k] = (T)(isnan(x[src[k]]) ? -INFINITY : x[src[k]]);                                                             \
        for (k = fam[FAM_NAN_RIGHT]; k < fam[FAM_NAN_RIGHT + 1]; k++)                                                           \
            out[k] = (T)(isnan(x[src[k]]) ? INFINITY : x[src[k]]);                                                              \
        for (k = fam[FAM_NAN_ZERO]; k < fam[FAM_NAN_ZERO + 1]; k++)                                                             \
            out[k] = (T)(isnan(x[src[k]]) ? 0.0 : x[src[k]]);                                                                   \
        for (k = fam[FAM_ZERO_LEFT]; k < fam[FAM_ZERO_RIGHT + 1]; k++) {                                                        \
            double v = x[src[k]];                                                                                               \
            if (isnan(v) || (v >= -1e-35f && v <= 1e-35f)) /* goes_right()'s zero test, with a float bound */                  \
                v = k < fam[FAM_ZERO_RIGHT] ? -INFINITY : INFINITY;                                                            \
            out[k] = (T)v;                                                                                                      \
        }                                                                                                                       \
    }

DEFINE_EXPAND(expand_f, float)
DEFINE_EXPAND(expand_d, double)

/* Trees of depth >= 0 walked in the layout, the others in the node table; xs holds BLOCK rows of n_slots slots. */
static void score_rows_padded(const ScoreJob *job, Sums *s, const Layout *L, void *xs) {
    const Forest *f = &job->f;
    int f32 = f->compare != CMP_LE;
    Py_ssize_t start, end, i, t, t0, t1, ns = L->n_slots;
    int32_t leafs[CHUNK][BLOCK];
    for (start = 0; start < f->n_rows; start = end) {
        end = start + BLOCK < f->n_rows ? start + BLOCK : f->n_rows;
        for (i = start; i < end; i++) {
            if (f32)
                expand_f(L, f->X + i * f->n_features, (float *)xs + (i - start) * ns);
            else
                expand_d(L, f->X + i * f->n_features, (double *)xs + (i - start) * ns);
        }
        sums_start(job, s, start, end);
        for (t0 = 0; t0 < f->n_trees; t0 = t1) {
            t1 = t0 + CHUNK < f->n_trees ? t0 + CHUNK : f->n_trees;
            padded_leaves(L, xs, f32, end - start, t0, t1, leafs);
            for (t = t0; t < t1; t++)
                if (L->trees[t * PT_WIDTH + PT_DEPTH] < 0)
                    for (i = start; i < end; i++)
                        leafs[t - t0][i - start] = (int32_t)leaf_of(f, f->roots[t], f->X + i * f->n_features);
            for (t = t0; t < t1; t++)
                for (i = start; i < end; i++)
                    sums_add(job, s, start, i, t, leafs[t - t0][i - start]);
        }
        sums_finish(job, s, start, end);
    }
}

/* The model's tables, in this order in every call. */
enum { T_NODES, T_THRESHOLDS, T_LEAVES, T_CATS, T_ROOTS, T_GROUPS, T_WEIGHTS, T_COUNT };
static const struct {
    const char *name;
    char code;
    Py_ssize_t size;
    int ndim;
} table_spec[T_COUNT] = {
    {"nodes", 'i', 4, 2}, {"thresholds", 'd', 8, 1}, {"leaves", 'd', 8, 2}, {"cats", 'I', 4, 1},
    {"roots", 'i', 4, 1}, {"groups", 'i', 4, 1},     {"weights", 'd', 8, 1},
};

static int get_tables(PyObject *const *objs, Py_buffer *views, int *got) {
    for (*got = 0; *got < T_COUNT; (*got)++)
        if (get_array(objs[*got], &views[*got], table_spec[*got].name, table_spec[*got].code, table_spec[*got].size,
                      table_spec[*got].ndim, 0) < 0)
            return -1;
    if (dim(&views[T_NODES], 1) != N_WIDTH || dim(&views[T_THRESHOLDS], 0) != dim(&views[T_NODES], 0) ||
        dim(&views[T_LEAVES], 0) != dim(&views[T_NODES], 0) || dim(&views[T_LEAVES], 1) < 1 ||
        dim(&views[T_GROUPS], 0) != dim(&views[T_ROOTS], 0) || dim(&views[T_WEIGHTS], 0) != dim(&views[T_ROOTS], 0)) {
        PyErr_SetString(PyExc_ValueError, "the node, threshold, leaf, root, group and weight tables do not fit one another");
        return -1;
    }
    return 0;
}

static void fill_forest(Forest *f, Py_buffer *views) {
    f->nodes = views[T_NODES].buf;
    f->n_nodes = dim(&views[T_NODES], 0);
    f->thresholds = views[T_THRESHOLDS].buf;
    f->leaves = views[T_LEAVES].buf;
    f->leaf_width = dim(&views[T_LEAVES], 1);
    f->cats = views[T_CATS].buf;
    f->roots = views[T_ROOTS].buf;
    f->groups = views[T_GROUPS].buf;
    f->weights = views[T_WEIGHTS].buf;
    f->n_trees = dim(&views[T_ROOTS], 0);
}

/* NULL when the tables are safe to walk for inputs of n_features columns and n_groups outputs. */
static const char *check_forest(const Forest *f, Py_ssize_t n_cat_words, Py_ssize_t n_features, Py_ssize_t n_groups) {
    Py_ssize_t t, k, top, n = f->n_nodes;
    const char *error = NULL;
    uint8_t *seen;
    int32_t *stack;
    if (n_groups < 1 || n_groups > 64 || f->leaf_width > n_groups)
        return "the number of output groups is out of range";
    for (k = 0; k < n; k++) {
        const int32_t *nd = f->nodes + k * N_WIDTH;
        if (nd[N_LEFT] < 0)
            continue;
        if (nd[N_FEATURE] < 0 || nd[N_FEATURE] >= n_features || nd[N_LEFT] >= n || nd[N_RIGHT] < 0 || nd[N_RIGHT] >= n)
            return "a node refers to a feature or child out of range";
        if ((nd[N_FLAGS] & F_CATEGORICAL) && (nd[N_CAT_START] < 0 || nd[N_CAT_WORDS] < 0 ||
                                              (Py_ssize_t)nd[N_CAT_START] + nd[N_CAT_WORDS] > n_cat_words))
            return "a categorical node's bitset is out of range";
    }
    seen = calloc((size_t)n + 1, 1);
    stack = malloc(((size_t)n + 1) * sizeof(int32_t));
    if (seen == NULL || stack == NULL) {
        free(seen);
        free(stack);
        return "out of memory";
    }
    for (t = 0; error == NULL && t < f->n_trees; t++) {
        if (f->roots[t] < 0 || f->roots[t] >= n || f->groups[t] < 0 || f->groups[t] + f->leaf_width > n_groups) {
            error = "a tree's root or output group is out of range";
            break;
        }
        top = 0;
        stack[top++] = f->roots[t];
        while (top > 0 && error == NULL) {
            int32_t node = stack[--top];
            const int32_t *nd = f->nodes + (Py_ssize_t)node * N_WIDTH;
            if (seen[node]) {
                error = "a node is reached twice (a cycle or a shared subtree)";
                break;
            }
            seen[node] = 1;
            if (nd[N_LEFT] >= 0) { /* at most n nodes are ever pushed: each is seen once */
                stack[top++] = nd[N_LEFT];
                if (top > n) {
                    error = "a node is reached twice (a cycle or a shared subtree)";
                    break;
                }
                stack[top++] = nd[N_RIGHT];
                if (top > n)
                    error = "a node is reached twice (a cycle or a shared subtree)";
            }
        }
    }
    free(seen);
    free(stack);
    return error;
}

PyDoc_STRVAR(check_doc, "check(nodes, thresholds, leaves, cats, roots, groups, weights, n_features, n_groups)\n\n"
                        "Raises ValueError unless the tables are safe to walk: every reference in range, every node\n"
                        "reached once from the roots (no cycle, no shared subtree). score() and decisions() do not\n"
                        "check bounds: a forest is checked once, when it is built.");

static PyObject *check(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *objs[T_COUNT];
    Py_buffer views[T_COUNT];
    Py_ssize_t n_features, n_groups;
    int got = 0;
    const char *error = NULL;
    Forest f;
    if (!PyArg_ParseTuple(args, "OOOOOOOnn:check", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &objs[5], &objs[6],
                          &n_features, &n_groups))
        return NULL;
    if (get_tables(objs, views, &got) == 0) {
        memset(&f, 0, sizeof f);
        fill_forest(&f, views);
        error = check_forest(&f, dim(&views[T_CATS], 0), n_features, n_groups);
        if (error != NULL)
            PyErr_Format(PyExc_ValueError, "check(): %s", error);
    }
    while (got-- > 0)
        PyBuffer_Release(&views[got]);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

/* X and the tables for score() and decisions(): 0 on success (views to release in *got). */
static int prepare(PyObject *x_obj, PyObject *const *tables, Py_buffer *x_view, Py_buffer *views, int *got, Forest *f, int compare) {
    *got = 0;
    if (get_array(x_obj, x_view, "X", 'd', 8, 2, 0) < 0)
        return -1;
    if (get_tables(tables, views, got) < 0) {
        PyBuffer_Release(x_view);
        return -1;
    }
    memset(f, 0, sizeof *f);
    fill_forest(f, views);
    f->X = x_view->buf;
    f->n_rows = dim(x_view, 0);
    f->n_features = dim(x_view, 1);
    f->compare = compare;
    return 0;
}

static void release(Py_buffer *x_view, Py_buffer *views, int got) {
    while (got-- > 0)
        PyBuffer_Release(&views[got]);
    PyBuffer_Release(x_view);
}

PyDoc_STRVAR(score_doc,
             "score(X, nodes, thresholds, leaves, cats, roots, groups, weights, params, base, out[, layout])\n\n"
             "Scores every row of X (float64, rows x features, NaN = missing) into out (float64, rows x groups):\n"
             "base + the trees' leaves per group (float32 sums if params says so), divided, scaled, linked.\n"
             "The tables must have passed check() for X's width and out's (the walk does not check bounds).\n"
             "params is float64: compare, float32 sums, link, scale, divisor, weighted, features, groups.\n"
             "layout (a tuple of 6 arrays, runtime/trees/perfect.py) must have passed check_layout() with the\n"
             "same tables: its trees are walked padded, the same leaves as in the node table.");

static PyObject *score(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *x_obj, *tables[T_COUNT], *o_params, *o_base, *o_out, *o_layout = NULL;
    Py_buffer x_view, views[T_COUNT], params_v, base_v, out_v, layout_v[L_COUNT];
    int got = 0, layout_got = 0, ok = 0;
    ScoreJob job;
    Layout layout;
    Sums *sums = NULL;
    void *xs = NULL;
    if (!PyArg_UnpackTuple(args, "score", 11, 12, &x_obj, &tables[0], &tables[1], &tables[2], &tables[3], &tables[4], &tables[5],
                           &tables[6], &o_params, &o_base, &o_out, &o_layout))
        return NULL;
    if (get_array(o_params, &params_v, "params", 'd', 8, 1, 0) < 0)
        return NULL;
    if (dim(&params_v, 0) != P_COUNT) {
        PyErr_SetString(PyExc_ValueError, "score(): params has the wrong length");
        PyBuffer_Release(&params_v);
        return NULL;
    }
    if (prepare(x_obj, tables, &x_view, views, &got, &job.f, (int)((const double *)params_v.buf)[P_COMPARE]) < 0) {
        PyBuffer_Release(&params_v);
        return NULL;
    }
    if (get_array(o_base, &base_v, "base", 'd', 8, 1, 0) < 0)
        goto release_tables;
    if (get_array(o_out, &out_v, "out", 'd', 8, 2, 1) < 0)
        goto release_base;
    if (o_layout != NULL && get_layout(o_layout, layout_v, &layout_got, job.f.compare != CMP_LE, &layout) < 0)
        goto release_out;
    job.params = params_v.buf;
    job.base = base_v.buf;
    job.out = out_v.buf;
    job.n_groups = dim(&out_v, 1);
    /* The shapes the walk relies on; the tables' contents were checked by check() and check_layout(). */
    if (dim(&out_v, 0) != job.f.n_rows || dim(&base_v, 0) != job.n_groups || job.n_groups != (Py_ssize_t)job.params[P_GROUPS] ||
        job.f.n_features != (Py_ssize_t)job.params[P_FEATURES] || job.n_groups < 1 || job.n_groups > 64 ||
        job.f.leaf_width > job.n_groups || (o_layout != NULL && layout.n_trees != job.f.n_trees)) {
        PyErr_SetString(PyExc_ValueError, "score(): array shapes do not fit one another");
        goto release_layout;
    }
    sums = malloc(sizeof *sums);
    if (o_layout != NULL && layout.n_slots >= (1 << 24)) /* slot offsets are int32: walk the node table */
        o_layout = NULL;
    if (o_layout != NULL)
        xs = malloc((size_t)BLOCK * (size_t)(layout.n_slots + 1) * sizeof(double));
    if (sums == NULL || (o_layout != NULL && xs == NULL)) {
        PyErr_NoMemory();
        goto release_layout;
    }
    sums_init(&job, sums);
    Py_BEGIN_ALLOW_THREADS if (o_layout != NULL) score_rows_padded(&job, sums, &layout, xs);
    else score_rows(&job, sums);
    Py_END_ALLOW_THREADS ok = 1;
release_layout:
    free(xs);
    free(sums);
    while (layout_got-- > 0)
        PyBuffer_Release(&layout_v[layout_got]);
release_out:
    PyBuffer_Release(&out_v);
release_base:
    PyBuffer_Release(&base_v);
release_tables:
    release(&x_view, views, got);
    PyBuffer_Release(&params_v);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(check_layout_doc,
             "check_layout(nodes, thresholds, leaves, cats, roots, groups, weights, trees, slots, layout_thresholds,\n"
             "             layout_leaves, sources, families, n_features, compare)\n\n"
             "Raises ValueError unless the padded layout (runtime/trees/perfect.py) is safe to walk for these\n"
             "tables (which must have passed check()): every depth, node, leaf, slot and feature in range.");

static PyObject *check_layout(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *objs[T_COUNT], *lobjs[L_COUNT], *tuple;
    Py_buffer views[T_COUNT], lviews[L_COUNT];
    Py_ssize_t n_features;
    int got = 0, lgot = 0, compare;
    const char *error = NULL;
    Forest f;
    Layout L;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOOOni:check_layout", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &objs[5], &objs[6],
                          &lobjs[0], &lobjs[1], &lobjs[2], &lobjs[3], &lobjs[4], &lobjs[5], &n_features, &compare))
        return NULL;
    if (compare < CMP_LT_F32 || compare > CMP_LE_X_F32) {
        PyErr_SetString(PyExc_ValueError, "check_layout(): unknown comparison");
        return NULL;
    }
    tuple = PyTuple_New(L_COUNT);
    if (tuple == NULL)
        return NULL;
    for (int k = 0; k < L_COUNT; k++) {
        Py_INCREF(lobjs[k]);
        PyTuple_SET_ITEM(tuple, k, lobjs[k]);
    }
    if (get_tables(objs, views, &got) == 0 && get_layout(tuple, lviews, &lgot, compare != CMP_LE, &L) == 0) {
        memset(&f, 0, sizeof f);
        fill_forest(&f, views);
        error = check_layout_contents(&L, f.n_trees, f.n_nodes, n_features);
        if (error != NULL)
            PyErr_Format(PyExc_ValueError, "check_layout(): %s", error);
    }
    Py_DECREF(tuple);
    while (lgot-- > 0)
        PyBuffer_Release(&lviews[lgot]);
    while (got-- > 0)
        PyBuffer_Release(&views[got]);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(decisions_doc, "decisions(X, nodes, thresholds, leaves, cats, roots, groups, weights, params, out)\n\n"
                            "out (uint8, rows x nodes) gets 1 where the row goes right at an internal node, 0 where it\n"
                            "goes left (leaves: 0), by the same rules as score(). The tables must have passed check().");

static PyObject *decisions(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *x_obj, *tables[T_COUNT], *o_params, *o_out;
    Py_buffer x_view, views[T_COUNT], params_v, out_v;
    int got = 0, ok = 0;
    const double *params;
    Forest f;
    if (!PyArg_UnpackTuple(args, "decisions", 10, 10, &x_obj, &tables[0], &tables[1], &tables[2], &tables[3], &tables[4], &tables[5],
                           &tables[6], &o_params, &o_out))
        return NULL;
    if (get_array(o_params, &params_v, "params", 'd', 8, 1, 0) < 0)
        return NULL;
    params = params_v.buf;
    if (dim(&params_v, 0) != P_COUNT || prepare(x_obj, tables, &x_view, views, &got, &f, (int)params[P_COMPARE]) < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "decisions(): params has the wrong length");
        PyBuffer_Release(&params_v);
        return NULL;
    }
    if (get_array(o_out, &out_v, "out", 'B', 1, 2, 1) == 0) {
        if (dim(&out_v, 0) != f.n_rows || dim(&out_v, 1) != f.n_nodes || f.n_features != (Py_ssize_t)params[P_FEATURES]) {
            PyErr_SetString(PyExc_ValueError, "decisions(): out must be rows x nodes");
        } else {
            uint8_t *out = out_v.buf;
            Py_BEGIN_ALLOW_THREADS Py_ssize_t i, k;
            for (i = 0; i < f.n_rows; i++) {
                const double *x = f.X + i * f.n_features;
                uint8_t *o = out + i * f.n_nodes;
                for (k = 0; k < f.n_nodes; k++) {
                    const int32_t *nd = f.nodes + k * N_WIDTH;
                    o[k] = nd[N_LEFT] < 0 ? 0 : (uint8_t)goes_right(&f, nd, k, x);
                }
            }
            Py_END_ALLOW_THREADS ok = 1;
        }
        PyBuffer_Release(&out_v);
    }
    release(&x_view, views, got);
    PyBuffer_Release(&params_v);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"score", score, METH_VARARGS, score_doc},
    {"decisions", decisions, METH_VARARGS, decisions_doc},
    {"check", check, METH_VARARGS, check_doc},
    {"check_layout", check_layout, METH_VARARGS, check_layout_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_forest", "One tree-ensemble kernel (XGBoost, LightGBM, scikit-learn), in C.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__forest(void) { return PyModule_Create(&module); }
