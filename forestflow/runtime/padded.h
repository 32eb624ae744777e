/*
 * The padded perfect trees both tree kernels walk (_forest.c for XGBoost, LightGBM and scikit-learn,
 * _h2o_trees.c for H2O): the layout's arrays read and range-checked, and the branch-free walk that
 * gives, for a block of rows and a run of trees, the node each row reaches in each padded tree.
 * Each kernel fills a row's slots (its features with missing values made values, and whatever else
 * its format needs) and walks the trees the layout leaves at depth -1 in its own node table.
 */
#ifndef FORESTFLOW_RUNTIME_PADDED_H
#define FORESTFLOW_RUNTIME_PADDED_H

#include <Python.h>
#include <stdint.h>

#include "arrays.h"

/* The layout (runtime/trees/perfect.py explains it): a tree of depth d is 2^d - 1 nodes in heap order,
 * each a row slot and a threshold T (go right when the slot's value > T), then 2^d leaves naming nodes
 * of the kernel's table. A row's slots come in families, one per missing rule (and for H2O, one of
 * decisions made ahead: runtime/h2o_padded.py). Rows are scored in blocks of BLOCK, trees in runs of
 * CHUNK, LANES walks at once. */
enum { L_TREES, L_SLOTS, L_THRESHOLDS, L_LEAVES, L_SOURCES, L_FAMILIES, L_COUNT };
enum { PT_DEPTH, PT_NODE, PT_LEAF, PT_WIDTH };
enum { FAM_NAN_LEFT, FAM_NAN_RIGHT, FAM_NAN_ZERO, FAM_ZERO_LEFT, FAM_ZERO_RIGHT, N_FAMILIES };
enum { MAX_DEPTH = 8, LANES = 16, CHUNK = 16, BLOCK = 64 };

typedef struct {
    const int32_t *trees, *slots, *leaves, *sources, *families;
    const void *thresholds; /* float or double, as the kernel compares */
    Py_ssize_t n_trees, n_nodes, n_leaves, n_slots;
} Layout;

static const struct {
    const char *name;
    char code;
    Py_ssize_t size;
    int ndim;
} layout_spec[L_COUNT] = {
    {"layout trees", 'i', 4, 2}, {"layout slots", 'i', 4, 1},   {"layout thresholds", 'd', 8, 1},
    {"layout leaves", 'i', 4, 1}, {"layout sources", 'i', 4, 1}, {"layout families", 'i', 4, 1},
};

/* The layout's arrays from a tuple (views to release in *got), their shapes checked against one another. */
static int get_layout(PyObject *tuple, Py_buffer *views, int *got, int f32_thresholds, Layout *L) {
    *got = 0;
    if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) != L_COUNT) {
        PyErr_SetString(PyExc_TypeError, "the layout must be a tuple of 6 arrays");
        return -1;
    }
    for (; *got < L_COUNT; (*got)++) {
        int f32 = *got == L_THRESHOLDS && f32_thresholds;
        if (get_array(PyTuple_GET_ITEM(tuple, *got), &views[*got], layout_spec[*got].name, f32 ? 'f' : layout_spec[*got].code,
                      f32 ? 4 : layout_spec[*got].size, layout_spec[*got].ndim, 0) < 0)
            return -1;
    }
    L->trees = views[L_TREES].buf;
    L->slots = views[L_SLOTS].buf;
    L->thresholds = views[L_THRESHOLDS].buf;
    L->leaves = views[L_LEAVES].buf;
    L->sources = views[L_SOURCES].buf;
    L->families = views[L_FAMILIES].buf;
    L->n_trees = dim(&views[L_TREES], 0);
    L->n_nodes = dim(&views[L_SLOTS], 0);
    L->n_leaves = dim(&views[L_LEAVES], 0);
    L->n_slots = dim(&views[L_SOURCES], 0);
    if (dim(&views[L_TREES], 1) != PT_WIDTH || dim(&views[L_THRESHOLDS], 0) != L->n_nodes ||
        dim(&views[L_FAMILIES], 0) != N_FAMILIES + 1) {
        PyErr_SetString(PyExc_ValueError, "the layout's arrays do not fit one another");
        return -1;
    }
    return 0;
}

/* NULL when every index of the layout is in range for a table of n_nodes nodes and slots computed from
 * n_sources sources (the features; for H2O also its decisions). */
static const char *check_layout_contents(const Layout *L, Py_ssize_t n_trees, Py_ssize_t n_nodes, Py_ssize_t n_sources) {
    Py_ssize_t k;
    if (L->n_trees != n_trees)
        return "the layout has another number of trees";
    for (k = 0; k < n_trees; k++) {
        const int32_t *tr = L->trees + k * PT_WIDTH;
        Py_ssize_t size;
        if (tr[PT_DEPTH] == -1)
            continue;
        if (tr[PT_DEPTH] < 0 || tr[PT_DEPTH] > MAX_DEPTH)
            return "a padded tree's depth is out of range";
        size = (Py_ssize_t)1 << tr[PT_DEPTH];
        if (tr[PT_NODE] < 0 || tr[PT_NODE] + size - 1 > L->n_nodes || tr[PT_LEAF] < 0 || tr[PT_LEAF] + size > L->n_leaves)
            return "a padded tree's nodes or leaves are out of range";
    }
    for (k = 0; k < L->n_nodes; k++)
        if (L->slots[k] < 0 || L->slots[k] >= L->n_slots)
            return "a padded node's slot is out of range";
    for (k = 0; k < L->n_leaves; k++)
        if (L->leaves[k] < 0 || L->leaves[k] >= n_nodes)
            return "a padded leaf's node is out of range";
    for (k = 0; k < L->n_slots; k++)
        if (L->sources[k] < 0 || L->sources[k] >= n_sources)
            return "a slot's source is out of range";
    if (L->families[0] != 0 || L->families[N_FAMILIES] != L->n_slots)
        return "the slot families do not cover the slots";
    for (k = 0; k < N_FAMILIES; k++)
        if (L->families[k + 1] < L->families[k])
            return "the slot families are not in order";
    return NULL;
}

/* LANES walks at once, each lane a tree (its first node off, its depth dep; 0 = an idle lane) and a row
 * (its slots at xs + xb): exactly dep steps, no branch on the data; at[k] gets the leaf's index in the tree.
 * Every lane reads at every step up to the deepest lane's depth (node 0 when past its own: there is one,
 * since some tree has depth >= 1), so that the step has no branch. */
#define DEFINE_WALK(NAME, T)                                                                                                    \
    static void NAME(const T *xs, const int32_t *slots, const T *thr, const int32_t *off, const int32_t *xb, const int32_t *dep, \
                     int32_t *at) {                                                                                             \
        uint32_t i[LANES];                                                                                                      \
        int32_t dmax = 0, l, k;                                                                                                 \
        for (k = 0; k < LANES; k++) {                                                                                           \
            i[k] = 0;                                                                                                           \
            dmax = dep[k] > dmax ? dep[k] : dmax;                                                                               \
        }                                                                                                                       \
        for (l = 0; l < dmax; l++) {                                                                                            \
            _Pragma("GCC unroll 16") for (k = 0; k < LANES; k++) {                                                               \
                int32_t on = -(int32_t)(l < dep[k]); /* a lane past its depth reads node 0 and stays */                   \
                int32_t g = (off[k] + (int32_t)i[k]) & on;                                                                      \
                uint32_t next = 2 * i[k] + 1 + (xs[xb[k] + slots[g]] > thr[g]);                                                 \
                i[k] = on ? next : i[k];                                                                                        \
            }                                                                                                                   \
        }                                                                                                                       \
        for (k = 0; k < LANES; k++)                                                                                             \
            at[k] = (int32_t)i[k] - ((1 << dep[k]) - 1);                                                                        \
    }

/* The same for LANES consecutive rows of one tree (its nodes at slots and thr, depth d): fewer loads per step. */
#define DEFINE_WALK_ROWS(NAME, T)                                                                                               \
    static void NAME(const T *xs, Py_ssize_t ns, const int32_t *slots, const T *thr, int32_t d, int32_t *at) {                  \
        uint32_t i[LANES];                                                                                                      \
        int32_t l, k;                                                                                                           \
        for (k = 0; k < LANES; k++)                                                                                             \
            i[k] = 0;                                                                                                           \
        for (l = 0; l < d; l++) {                                                                                               \
            _Pragma("GCC unroll 16") for (k = 0; k < LANES; k++) i[k] = 2 * i[k] + 1 + (xs[k * ns + slots[i[k]]] > thr[i[k]]);  \
        }                                                                                                                       \
        for (k = 0; k < LANES; k++)                                                                                             \
            at[k] = (int32_t)i[k] - ((1 << d) - 1);                                                                             \
    }

DEFINE_WALK(walk_f, float)
DEFINE_WALK(walk_d, double)
DEFINE_WALK_ROWS(walk_rows_f, float)
DEFINE_WALK_ROWS(walk_rows_d, double)

typedef struct {
    int32_t off[LANES], xb[LANES], dep[LANES], at[LANES], tree[LANES], row[LANES];
    int n;
} Lanes;

/* Walks the lanes gathered so far; each one's leaf goes to leafs[tree - t0][row]. */
static void lanes_run(const Layout *L, Lanes *ln, const void *xs, int f32, int32_t (*leafs)[BLOCK], Py_ssize_t t0) {
    int k;
    if (ln->n == 0)
        return;
    for (k = ln->n; k < LANES; k++)
        ln->off[k] = ln->xb[k] = ln->dep[k] = 0;
    if (f32)
        walk_f(xs, L->slots, L->thresholds, ln->off, ln->xb, ln->dep, ln->at);
    else
        walk_d(xs, L->slots, L->thresholds, ln->off, ln->xb, ln->dep, ln->at);
    for (k = 0; k < ln->n; k++)
        leafs[ln->tree[k] - t0][ln->row[k]] = L->leaves[L->trees[ln->tree[k] * PT_WIDTH + PT_LEAF] + ln->at[k]];
    ln->n = 0;
}

/* The node each of the block's `rows` rows (their slots at xs, n_slots per row) reaches in each padded
 * tree t0 <= t < t1 (t1 - t0 <= CHUNK), into leafs[t - t0][row]; trees of depth -1 are left to the caller. */
static void padded_leaves(const Layout *L, const void *xs, int f32, Py_ssize_t rows, Py_ssize_t t0, Py_ssize_t t1, int32_t (*leafs)[BLOCK]) {
    Py_ssize_t i, t, ns = L->n_slots;
    Lanes ln;
    ln.n = 0;
    for (t = t0; t < t1; t++) {
        const int32_t *tr = L->trees + t * PT_WIDTH;
        if (tr[PT_DEPTH] < 0)
            continue;
        for (i = 0; i + LANES <= rows; i += LANES) { /* whole groups of rows: one tree for all lanes */
            int32_t at[LANES], k;
            if (f32)
                walk_rows_f((const float *)xs + i * ns, ns, L->slots + tr[PT_NODE], (const float *)L->thresholds + tr[PT_NODE], tr[PT_DEPTH],
                            at);
            else
                walk_rows_d((const double *)xs + i * ns, ns, L->slots + tr[PT_NODE], (const double *)L->thresholds + tr[PT_NODE],
                            tr[PT_DEPTH], at);
            for (k = 0; k < LANES; k++)
                leafs[t - t0][i + k] = L->leaves[tr[PT_LEAF] + at[k]];
        }
        for (; i < rows; i++) { /* the rest, with other trees' rests or a small batch's trees */
            ln.off[ln.n] = tr[PT_NODE];
            ln.xb[ln.n] = (int32_t)(i * ns);
            ln.dep[ln.n] = tr[PT_DEPTH];
            ln.tree[ln.n] = (int32_t)t;
            ln.row[ln.n] = (int32_t)i;
            if (++ln.n == LANES)
                lanes_run(L, &ln, xs, f32, leafs, t0);
        }
    }
    lanes_run(L, &ln, xs, f32, leafs, t0);
}

#endif
