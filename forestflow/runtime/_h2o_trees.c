/*
 * forestflow.runtime._h2o_trees: genmodel's score0 for H2O GBM and DRF MOJOs, over a whole batch.
 *
 * h2o_native.py flattens the trees h2o_tree_reader.py parsed into arrays and calls score() once
 * per batch: every tree walked for every row (SharedTreeMojoModel.scoreTree's decisions), then
 * genmodel's unifyPreds (link functions, DRF averaging, class rescaling, balance-classes
 * correction, the label). Trees are summed in genmodel's order and leaves are doubles (the
 * float32 leaves widened at load, as Java widens them), so the sums match genmodel's bit for bit;
 * exp is the C library's where Java has Math.exp (within an ulp). The GIL is released while the
 * rows are scored, so two scoring threads run at once.
 *
 * Trees of depth <= 8 can also be walked padded (padded.h; runtime/h2o_padded.py builds the
 * layout): branch-free, 16 walks at once, reaching the same leaves, summed in the same order.
 *
 * Arrays come in through the buffer protocol (no numpy headers); their types and shapes are
 * checked against the layout below before anything is read.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "arrays.h"
#include "padded.h"

/* Node kinds (h2o_tree_reader: LEAF, NUMERIC, BITSET, NA_VS_REST). */
enum { LEAF = 0, NUMERIC = 1, BITSET = 2, NA_VS_REST = 3 };
/* Columns of the int32 node table. */
enum { N_KIND, N_COL, N_NA_LEFT, N_LEFT, N_RIGHT, N_BSTART, N_BOFF, N_BCOUNT, N_WIDTH };
/* Slots of the float64 parameters. */
enum { P_ALGO, P_FAMILY, P_LINK, P_INIT_F, P_NCLASSES, P_GROUPS, P_BDT, P_BALANCE, P_THRESHOLD, P_VERSION, P_COUNT };
enum { ALGO_GBM = 0, ALGO_DRF = 1 };
enum { FAMILY_BINOMIAL = 0, FAMILY_MULTINOMIAL = 1, FAMILY_REGRESSION = 2 };
enum { LINK_IDENTITY = 0, LINK_LOG = 1, LINK_LOGIT = 2, LINK_INVERSE = 3 };

typedef struct {
    const double *X;
    Py_ssize_t n_rows, n_features;
    const double *offsets;
    const int32_t *nodes;
    Py_ssize_t n_nodes;
    const double *values;
    const uint8_t *bits;
    Py_ssize_t n_bits;
    const int32_t *roots, *target;
    Py_ssize_t n_trees;
    const int64_t *dom_len;
    const double *params, *prior, *model_distrib;
    Py_ssize_t n_prior;
    double *preds;
    Py_ssize_t width;
    uint8_t *ties;
} Model;

/* Java's (int) d for a non-NaN double: truncation, saturated to the int range. */
static int32_t java_int(double d) {
    if (d >= 2147483647.0)
        return 2147483647;
    if (d <= -2147483648.0)
        return -2147483647 - 1;
    return (int32_t)d;
}

/* Whether a row goes right at internal node `node`: genmodel's scoreTree decision. */
static inline int goes_right(const Model *m, const double *x, int32_t node, int version) {
    const int32_t *nd = m->nodes + (Py_ssize_t)node * N_WIDTH;
    int kind = nd[N_KIND], right;
    double d;
    int64_t n_levels;
    d = x[nd[N_COL]];
    n_levels = m->dom_len[nd[N_COL]];
    if (isnan(d)) {
        right = nd[N_NA_LEFT] == 0;
    } else if (kind == NUMERIC && (n_levels < 0 || version < 2)) { /* the common case: a number against a threshold */
        right = d >= m->values[node];
    } else {
        int32_t di = java_int(d), start = nd[N_BSTART];
        int64_t rel; /* in 64 bits: a level near INT_MIN minus the offset must not wrap */
        int outside = 0;
        if (version >= 1 && start >= 0) { /* a level outside the bitset in effect counts as NA */
            rel = (int64_t)di - nd[N_BOFF];
            outside = rel < 0 || rel >= nd[N_BCOUNT];
        }
        if (version >= 2 && n_levels >= 0 && n_levels <= di) /* so does a level past the column's domain */
            outside = 1;
        if (outside) {
            right = nd[N_NA_LEFT] == 0;
        } else if (kind == NA_VS_REST) {
            right = 0;
        } else if (kind == NUMERIC) {
            right = d >= m->values[node];
        } else { /* BITSET: levels in the set go right */
            rel = (int64_t)di - nd[N_BOFF];
            if (rel < 0 || rel >= nd[N_BCOUNT])
                right = 0; /* MOJO 1.00 (contains0): outside the set */
            else
                right = (m->bits[start + (rel >> 3)] & (1 << (rel & 7))) != 0;
        }
    }
    return right;
}

/* The leaf one row reaches in one tree, following genmodel's scoreTree decisions. */
static int32_t leaf_node(const Model *m, const double *x, int32_t node, int version) {
    for (;;) {
        const int32_t *nd = m->nodes + (Py_ssize_t)node * N_WIDTH;
        if (nd[N_KIND] == LEAF)
            return node;
        node = goes_right(m, x, node, version) ? nd[N_RIGHT] : nd[N_LEFT];
    }
}

/* genmodel's sanitized exp: capped at 1e19. */
static double sexp(double x) {
    double e = exp(x);
    return e < 1e19 ? e : 1e19;
}

static double link_inv(int link, double f) {
    switch (link) {
    case LINK_LOG:
        return sexp(f);
    case LINK_LOGIT:
        return 1.0 / (1.0 + sexp(-f));
    case LINK_INVERSE: { /* genmodel clamps with -1e-5 on both sides */
        double xx = f < 0 ? (f < -1e-5 ? f : -1e-5) : (f > -1e-5 ? f : -1e-5);
        return 1.0 / xx;
    }
    default:
        return f;
    }
}

/* Every row's trees summed into preds, each tree walked in the node table. */
static void sum_trees(const Model *m) {
    int version = (int)m->params[P_VERSION];
    Py_ssize_t i, t;
    for (i = 0; i < m->n_rows; i++) {
        const double *x = m->X + i * m->n_features;
        double *p = m->preds + i * m->width;
        for (t = 0; t < m->n_trees; t++) /* genmodel's order: class by class, groups in order */
            p[m->target[t]] += m->values[leaf_node(m, x, m->roots[t], version)];
    }
}

/* One row's slots (padded.h): features with NA made -inf or +inf, then the decisions made ahead
 * (1.0 right, 0.0 left) of the nodes the decision slots name. */
static void expand_row(const Model *m, const Layout *L, const double *x, double *out, int version) {
    const int32_t *src = L->sources, *fam = L->families;
    int32_t k;
    for (k = fam[FAM_NAN_LEFT]; k < fam[FAM_NAN_LEFT + 1]; k++)
        out[k] = isnan(x[src[k]]) ? -INFINITY : x[src[k]];
    for (k = fam[FAM_NAN_RIGHT]; k < fam[FAM_NAN_RIGHT + 1]; k++)
        out[k] = isnan(x[src[k]]) ? INFINITY : x[src[k]];
    for (k = fam[FAM_NAN_ZERO]; k < fam[FAM_NAN_ZERO + 1]; k++)
        out[k] = goes_right(m, x, (int32_t)(src[k] - m->n_features), version) ? 1.0 : 0.0;
}

/* sum_trees(), the trees of depth >= 0 walked in the layout (xs: BLOCK rows of n_slots slots each). */
static void sum_trees_padded(const Model *m, const Layout *L, double *xs) {
    int version = (int)m->params[P_VERSION];
    Py_ssize_t start, end, i, t, t0, t1, ns = L->n_slots;
    int32_t leafs[CHUNK][BLOCK];
    for (start = 0; start < m->n_rows; start = end) {
        end = start + BLOCK < m->n_rows ? start + BLOCK : m->n_rows;
        for (i = start; i < end; i++)
            expand_row(m, L, m->X + i * m->n_features, xs + (i - start) * ns, version);
        for (t0 = 0; t0 < m->n_trees; t0 = t1) {
            t1 = t0 + CHUNK < m->n_trees ? t0 + CHUNK : m->n_trees;
            padded_leaves(L, xs, 0, end - start, t0, t1, leafs);
            for (t = t0; t < t1; t++)
                if (L->trees[t * PT_WIDTH + PT_DEPTH] < 0)
                    for (i = start; i < end; i++)
                        leafs[t - t0][i - start] = leaf_node(m, m->X + i * m->n_features, m->roots[t], version);
            for (t = t0; t < t1; t++) /* each row's trees still added in genmodel's order */
                for (i = start; i < end; i++)
                    m->preds[i * m->width + m->target[t]] += m->values[leafs[t - t0][i - start]];
        }
    }
}

/* genmodel's unifyPreds on every row's tree sums: links, averaging, rescaling, the label. */
static void unify_rows(const Model *m) {
    const double *pr = m->params;
    int algo = (int)pr[P_ALGO], family = (int)pr[P_FAMILY], link = (int)pr[P_LINK];
    int nclasses = (int)pr[P_NCLASSES], bdt = pr[P_BDT] != 0, balance = pr[P_BALANCE] != 0;
    double init_f = pr[P_INIT_F], groups = pr[P_GROUPS], threshold = pr[P_THRESHOLD];
    Py_ssize_t width = m->width, i, k;
    for (i = 0; i < m->n_rows; i++) {
        double *p = m->preds + i * width, offset = m->offsets[i];
        if (algo == ALGO_GBM) {
            if (family == FAMILY_BINOMIAL) {
                p[2] = link_inv(link, p[1] + init_f + offset);
                p[1] = 1.0 - p[2];
            } else if (family == FAMILY_MULTINOMIAL) {
                double maxval = -INFINITY, dsum = 0.0;
                if (nclasses == 2) {
                    p[1] += init_f + offset;
                    p[2] = -p[1];
                }
                for (k = 1; k < width; k++)
                    maxval = p[k] > maxval ? p[k] : maxval;
                for (k = 1; k < width; k++) {
                    p[k] = exp(p[k] - maxval);
                    dsum += p[k];
                }
                for (k = 1; k < width; k++)
                    p[k] /= dsum;
            } else {
                p[0] = link_inv(link, p[0] + init_f + offset);
                continue;
            }
        } else {
            if (nclasses == 1) {
                p[0] /= groups;
                continue;
            }
            if (nclasses == 2 && !bdt) {
                p[1] /= groups;
                p[2] = 1.0 - p[1];
            } else {
                double total = 0.0;
                for (k = 1; k <= nclasses; k++)
                    total += p[k];
                if (total > 0)
                    for (k = 1; k <= nclasses; k++)
                        p[k] /= total;
            }
        }
        if (balance) {
            double probsum = 0.0;
            for (k = 1; k < width; k++) {
                if (m->prior[k - 1] != 0 && m->model_distrib[k - 1] != 0)
                    p[k] *= m->prior[k - 1] / m->model_distrib[k - 1];
                probsum += p[k];
            }
            if (probsum > 0)
                for (k = 1; k < width; k++)
                    p[k] /= probsum;
        }
        if (width == 3) {
            p[0] = p[2] >= threshold ? 1.0 : 0.0;
        } else {
            Py_ssize_t best = 1;
            int tied = 0;
            for (k = 2; k < width; k++) {
                if (p[best] < p[k]) {
                    best = k;
                    tied = 0;
                } else if (p[best] == p[k]) {
                    tied = 1;
                }
            }
            p[0] = (double)(best - 1);
            m->ties[i] = (uint8_t)tied;
        }
    }
}

/* NULL when every root, target, child, column and bitset of the tables is in range and every
 * child comes after its parent (so a walk always ends); else what is wrong. */
static const char *check_layout(const int32_t *nodes, Py_ssize_t n_nodes, Py_ssize_t n_bits, const int32_t *roots, const int32_t *target,
                                Py_ssize_t n_trees, Py_ssize_t n_features, Py_ssize_t width) {
    Py_ssize_t t, k;
    for (t = 0; t < n_trees; t++)
        if (roots[t] < 0 || roots[t] >= n_nodes || target[t] < 0 || target[t] >= width)
            return "a tree's root or target is out of range";
    for (k = 0; k < n_nodes; k++) {
        const int32_t *nd = nodes + k * N_WIDTH;
        if (nd[N_KIND] == LEAF)
            continue;
        if (nd[N_KIND] < LEAF || nd[N_KIND] > NA_VS_REST || nd[N_COL] < 0 || nd[N_COL] >= n_features || nd[N_LEFT] < 0 ||
            nd[N_LEFT] >= n_nodes || nd[N_RIGHT] < 0 || nd[N_RIGHT] >= n_nodes || nd[N_BCOUNT] < 0 ||
            (nd[N_KIND] == BITSET && nd[N_BSTART] < 0) ||
            (nd[N_BSTART] >= 0 && (Py_ssize_t)nd[N_BSTART] + ((Py_ssize_t)nd[N_BCOUNT] + 7) / 8 > n_bits))
            return "a node refers outside the tables";
        if (nd[N_LEFT] <= k || nd[N_RIGHT] <= k)
            return "a node's child does not come after it (a cycle)";
    }
    return NULL;
}

/* NULL when the parameters name a known algorithm, family, link and version, and the class count
 * fits the prediction width unify_rows writes (p[2] for binomial, p[1..nclasses] for classes). */
static const char *check_params(const double *pr, Py_ssize_t width) {
    double ncl = pr[P_NCLASSES];
    int classes;
    if (!(pr[P_ALGO] == ALGO_GBM || pr[P_ALGO] == ALGO_DRF) || !(pr[P_FAMILY] >= 0 && pr[P_FAMILY] <= FAMILY_REGRESSION) ||
        pr[P_FAMILY] != floor(pr[P_FAMILY]) || !(pr[P_LINK] >= 0 && pr[P_LINK] <= LINK_INVERSE) || pr[P_LINK] != floor(pr[P_LINK]) ||
        !(pr[P_VERSION] >= 0 && pr[P_VERSION] <= 2) || !(ncl >= 1 && ncl <= 65536) || ncl != floor(ncl))
        return "unknown algorithm, family, link, version or class count";
    classes = pr[P_ALGO] == ALGO_GBM ? pr[P_FAMILY] != FAMILY_REGRESSION : ncl > 1;
    if (classes && (ncl < 2 || width != (Py_ssize_t)ncl + 1 || (pr[P_ALGO] == ALGO_GBM && pr[P_FAMILY] == FAMILY_BINOMIAL && width != 3)))
        return "the prediction width does not fit the family and class count";
    return NULL;
}

/* NULL when the padded layout (h2o_padded.py) is safe to walk over these checked tables: every index
 * in range, feature slots reading features and decision slots naming inner nodes; else what is wrong. */
static const char *check_padded(const Model *m, const Layout *L) {
    const int32_t *fam = L->families;
    const char *error = check_layout_contents(L, m->n_trees, m->n_nodes, m->n_features + m->n_nodes);
    Py_ssize_t k;
    if (error != NULL)
        return error;
    if (fam[FAM_ZERO_LEFT] != L->n_slots)
        return "the layout has slots of a family H2O trees do not use";
    for (k = 0; k < fam[FAM_NAN_ZERO]; k++)
        if (L->sources[k] >= m->n_features)
            return "a feature slot's source is out of range";
    for (k = fam[FAM_NAN_ZERO]; k < fam[FAM_ZERO_LEFT]; k++)
        if (L->sources[k] < m->n_features || m->nodes[(L->sources[k] - m->n_features) * N_WIDTH + N_KIND] == LEAF)
            return "a decision slot does not name an inner node";
    return NULL;
}

PyDoc_STRVAR(score_doc,
"score(X, offsets, nodes, values, bits, roots, target, dom_len, params, prior, model_distrib, preds, ties[, layout])\n\n"
"score0 of every row of X (float64, rows x features, NaN = NA) into preds (float64, rows x width,\n"
"zeroed); ties[i] (uint8) is set to 1 where a multinomial label needs genmodel's tie-breaking.\n"
"The tables and parameters are checked first (as check_tables() does): a ValueError, never a walk out of bounds.\n"
"layout (a tuple of 6 arrays, runtime/h2o_padded.py) is checked too; its trees are walked padded, to the same leaves.\n"
"nodes is int32 (nodes x 8), values float64 (nodes), bits uint8, roots and target int32 (trees),\n"
"dom_len int64 (features), params float64 (10), prior and model_distrib float64 (classes).");

/* The rows' sums and unifyPreds, the trees walked padded in ``layout`` (NULL: the node table), the GIL
 * released; -1 with MemoryError set when the padded walk's scratch rows cannot be had. */
static int score_rows(Model *m, const Layout *layout) {
    double *xs = NULL;
    if (layout != NULL && (xs = malloc((size_t)BLOCK * (size_t)(layout->n_slots + 1) * sizeof(double))) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_BEGIN_ALLOW_THREADS
    if (layout != NULL)
        sum_trees_padded(m, layout, xs);
    else
        sum_trees(m);
    unify_rows(m);
    Py_END_ALLOW_THREADS
    free(xs);
    return 0;
}

static PyObject *score(PyObject *Py_UNUSED(self), PyObject *args) {
    enum { A_X, A_OFFSETS, A_NODES, A_VALUES, A_BITS, A_ROOTS, A_TARGET, A_DOM_LEN, A_PARAMS, A_PRIOR, A_DISTRIB, A_PREDS, A_TIES, A_COUNT };
    PyObject *o_layout = NULL;
    Py_buffer layout_v[L_COUNT];
    int layout_got = 0;
    Layout layout;
    static const struct { const char *name; char code; Py_ssize_t size; int ndim, writable; } spec[A_COUNT] = {
        {"X", 'd', 8, 2, 0},       {"offsets", 'd', 8, 1, 0}, {"nodes", 'i', 4, 2, 0},  {"values", 'd', 8, 1, 0},
        {"bits", 'B', 1, 1, 0},    {"roots", 'i', 4, 1, 0},   {"target", 'i', 4, 1, 0}, {"dom_len", 'q', 8, 1, 0},
        {"params", 'd', 8, 1, 0},  {"prior", 'd', 8, 1, 0},   {"model_distrib", 'd', 8, 1, 0},
        {"preds", 'd', 8, 2, 1},   {"ties", 'B', 1, 1, 1},
    };
    PyObject *objs[A_COUNT];
    Py_buffer views[A_COUNT];
    int got = 0, ok = 0;
    Model m;

    if (!PyArg_UnpackTuple(args, "score", A_COUNT, A_COUNT + 1, &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &objs[5], &objs[6],
                           &objs[7], &objs[8], &objs[9], &objs[10], &objs[11], &objs[12], &o_layout))
        return NULL;
    for (; got < A_COUNT; got++)
        if (get_array(objs[got], &views[got], spec[got].name, spec[got].code, spec[got].size, spec[got].ndim, spec[got].writable) < 0)
            goto done;

    m.X = views[A_X].buf;
    m.n_rows = dim(&views[A_X], 0);
    m.n_features = dim(&views[A_X], 1);
    m.offsets = views[A_OFFSETS].buf;
    m.nodes = views[A_NODES].buf;
    m.n_nodes = dim(&views[A_NODES], 0);
    m.values = views[A_VALUES].buf;
    m.bits = views[A_BITS].buf;
    m.n_bits = dim(&views[A_BITS], 0);
    m.roots = views[A_ROOTS].buf;
    m.target = views[A_TARGET].buf;
    m.n_trees = dim(&views[A_ROOTS], 0);
    m.dom_len = views[A_DOM_LEN].buf;
    m.params = views[A_PARAMS].buf;
    m.prior = views[A_PRIOR].buf;
    m.model_distrib = views[A_DISTRIB].buf;
    m.n_prior = dim(&views[A_PRIOR], 0);
    m.preds = views[A_PREDS].buf;
    m.width = dim(&views[A_PREDS], 1);
    m.ties = views[A_TIES].buf;

    /* Shapes that would let the walk read out of bounds are refused; the tables' contents were
     * checked once by check_tables(). */
    if (dim(&views[A_NODES], 1) != N_WIDTH || dim(&views[A_VALUES], 0) != m.n_nodes || dim(&views[A_TARGET], 0) != m.n_trees ||
        dim(&views[A_OFFSETS], 0) != m.n_rows || dim(&views[A_PREDS], 0) != m.n_rows || dim(&views[A_TIES], 0) != m.n_rows ||
        dim(&views[A_DOM_LEN], 0) != m.n_features || dim(&views[A_PARAMS], 0) != P_COUNT || m.width < 1 ||
        dim(&views[A_DISTRIB], 0) != m.n_prior || (m.params[P_BALANCE] != 0 && m.n_prior < m.width - 1)) {
        PyErr_SetString(PyExc_ValueError, "score(): array shapes do not fit one another");
        goto done;
    }
    {
        const char *error = check_params(m.params, m.width);
        if (error == NULL)
            error = check_layout(m.nodes, m.n_nodes, m.n_bits, m.roots, m.target, m.n_trees, m.n_features, m.width);
        if (error == NULL && o_layout != NULL) {
            if (get_layout(o_layout, layout_v, &layout_got, 0, &layout) < 0)
                goto done;
            error = check_padded(&m, &layout);
        }
        if (error != NULL) {
            PyErr_Format(PyExc_ValueError, "score(): %s", error);
            goto done;
        }
    }
    if (o_layout != NULL && layout.n_slots >= (1 << 24)) /* slot offsets are int32: walk the node table */
        o_layout = NULL;
    ok = score_rows(&m, o_layout != NULL ? &layout : NULL) == 0;

done:
    while (layout_got-- > 0)
        PyBuffer_Release(&layout_v[layout_got]);
    while (got-- > 0)
        PyBuffer_Release(&views[got]);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(check_tables_doc,
"check_tables(nodes, values, bits, roots, target, n_features, width)\n\n"
"Raises ValueError unless every root, child, column, target and bitset of the tables is in range and\n"
"every child comes after its parent: a scorer checks its tables when it is built (score() checks again).");

static PyObject *check_tables(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *o_nodes, *o_values, *o_bits, *o_roots, *o_target;
    Py_ssize_t n_features, width, n_nodes, n_bits, n_trees;
    Py_buffer nodes_v, values_v, bits_v, roots_v, target_v;
    const int32_t *nodes, *roots, *target;
    const char *error = NULL;
    if (!PyArg_ParseTuple(args, "OOOOOnn:check_tables", &o_nodes, &o_values, &o_bits, &o_roots, &o_target, &n_features, &width))
        return NULL;
    if (get_array(o_nodes, &nodes_v, "nodes", 'i', 4, 2, 0) < 0)
        return NULL;
    if (get_array(o_values, &values_v, "values", 'd', 8, 1, 0) < 0)
        goto release_nodes;
    if (get_array(o_bits, &bits_v, "bits", 'B', 1, 1, 0) < 0)
        goto release_values;
    if (get_array(o_roots, &roots_v, "roots", 'i', 4, 1, 0) < 0)
        goto release_bits;
    if (get_array(o_target, &target_v, "target", 'i', 4, 1, 0) < 0)
        goto release_roots;
    nodes = nodes_v.buf;
    roots = roots_v.buf;
    target = target_v.buf;
    n_nodes = dim(&nodes_v, 0);
    n_bits = dim(&bits_v, 0);
    n_trees = dim(&roots_v, 0);
    if (dim(&nodes_v, 1) != N_WIDTH || dim(&values_v, 0) != n_nodes || dim(&target_v, 0) != n_trees)
        error = "the node, value, root and target tables do not fit one another";
    else
        error = check_layout(nodes, n_nodes, n_bits, roots, target, n_trees, n_features, width);
    if (error != NULL)
        PyErr_Format(PyExc_ValueError, "check_tables(): %s", error);
    PyBuffer_Release(&target_v);
release_roots:
    PyBuffer_Release(&roots_v);
release_bits:
    PyBuffer_Release(&bits_v);
release_values:
    PyBuffer_Release(&values_v);
release_nodes:
    PyBuffer_Release(&nodes_v);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(decisions_doc,
"decisions(X, nodes, values, bits, dom_len, params, out)\n\n"
"For every row of X and every internal node of the tables, whether scoring sends the row right\n"
"(out: uint8, rows x nodes, 1 = right; leaves get 0), with exactly score()'s decisions: TreeSHAP\n"
"(runtime/treeshap.py) reads them. The tables are checked as check_tables() checks them.");

static PyObject *decisions(PyObject *Py_UNUSED(self), PyObject *args) {
    enum { D_X, D_NODES, D_VALUES, D_BITS, D_DOM_LEN, D_PARAMS, D_OUT, D_COUNT };
    static const struct { const char *name; char code; Py_ssize_t size; int ndim, writable; } spec[D_COUNT] = {
        {"X", 'd', 8, 2, 0},       {"nodes", 'i', 4, 2, 0},  {"values", 'd', 8, 1, 0}, {"bits", 'B', 1, 1, 0},
        {"dom_len", 'q', 8, 1, 0}, {"params", 'd', 8, 1, 0}, {"out", 'B', 1, 2, 1},
    };
    PyObject *objs[D_COUNT];
    Py_buffer views[D_COUNT];
    int got = 0, ok = 0;
    Py_ssize_t i, k;
    Model m;

    if (!PyArg_UnpackTuple(args, "decisions", D_COUNT, D_COUNT, &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &objs[5], &objs[6]))
        return NULL;
    for (; got < D_COUNT; got++)
        if (get_array(objs[got], &views[got], spec[got].name, spec[got].code, spec[got].size, spec[got].ndim, spec[got].writable) < 0)
            goto done;
    memset(&m, 0, sizeof m);
    m.X = views[D_X].buf;
    m.n_rows = dim(&views[D_X], 0);
    m.n_features = dim(&views[D_X], 1);
    m.nodes = views[D_NODES].buf;
    m.n_nodes = dim(&views[D_NODES], 0);
    m.values = views[D_VALUES].buf;
    m.bits = views[D_BITS].buf;
    m.n_bits = dim(&views[D_BITS], 0);
    m.dom_len = views[D_DOM_LEN].buf;
    m.params = views[D_PARAMS].buf;
    if (dim(&views[D_NODES], 1) != N_WIDTH || dim(&views[D_VALUES], 0) != m.n_nodes || dim(&views[D_DOM_LEN], 0) != m.n_features ||
        dim(&views[D_PARAMS], 0) != P_COUNT || dim(&views[D_OUT], 0) != m.n_rows || dim(&views[D_OUT], 1) != m.n_nodes) {
        PyErr_SetString(PyExc_ValueError, "decisions(): array shapes do not fit one another");
        goto done;
    }
    { /* the tables are checked here too: a walk out of bounds is never the answer */
        const char *error = check_layout(m.nodes, m.n_nodes, m.n_bits, NULL, NULL, 0, m.n_features, 1);
        if (error == NULL && !(m.params[P_VERSION] >= 0 && m.params[P_VERSION] <= 2))
            error = "unknown tree version";
        if (error != NULL) {
            PyErr_Format(PyExc_ValueError, "decisions(): %s", error);
            goto done;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    {
        int version = (int)m.params[P_VERSION];
        uint8_t *out = views[D_OUT].buf;
        for (i = 0; i < m.n_rows; i++) {
            const double *x = m.X + i * m.n_features;
            uint8_t *row = out + i * m.n_nodes;
            for (k = 0; k < m.n_nodes; k++)
                row[k] = m.nodes[k * N_WIDTH + N_KIND] == LEAF ? 0 : (uint8_t)goes_right(&m, x, (int32_t)k, version);
        }
    }
    Py_END_ALLOW_THREADS
    ok = 1;

done:
    while (got-- > 0)
        PyBuffer_Release(&views[got]);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(level_codes_doc,
"level_codes(values, lookup, X, j) -> list[int]\n\n"
"Categorical values to level indices in one pass: for every str in the list ``values`` that\n"
"``lookup`` (level -> index) holds, X[i, j] = float(index); X is a C-contiguous float64 matrix of\n"
"len(values) rows. Returns the positions left unwritten (values that are not str, or name no\n"
"level), for the caller to resolve one by one.");

static PyObject *level_codes(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    Py_buffer view;
    PyObject *values, *lookup, *misses = NULL;
    Py_ssize_t j, n, cols, i;
    double *X;
    if (nargs != 4 || !PyList_Check(args[0]) || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "level_codes() takes (list, dict, X, j)");
        return NULL;
    }
    values = args[0];
    lookup = args[1];
    j = PyLong_AsSsize_t(args[3]);
    if (j == -1 && PyErr_Occurred())
        return NULL;
    if (get_array(args[2], &view, "X", 'd', 8, 2, 1) < 0)
        return NULL;
    n = PyList_GET_SIZE(values);
    cols = dim(&view, 1);
    if (dim(&view, 0) != n || j < 0 || j >= cols) {
        PyErr_SetString(PyExc_ValueError, "level_codes(): X must have a row per value and a column j");
        goto fail;
    }
    X = view.buf;
    misses = PyList_New(0);
    if (misses == NULL)
        goto fail;
    /* The codes of the str objects met so far, by address: the request readers hand out one object
     * per repeated level, so most values are found here without a dict lookup. The list holds every
     * value until the end, so no address is reused meanwhile. */
    PyObject *seen[16] = {NULL};
    double seen_code[16];
    for (i = 0; i < PyList_GET_SIZE(values) && i < n; i++) {
        PyObject *v = PyList_GET_ITEM(values, i), *index = NULL;
        size_t slot = ((uintptr_t)v >> 4) % 16;
        if (seen[slot] == v) {
            X[i * cols + j] = seen_code[slot];
            continue;
        }
        if (PyUnicode_Check(v)) {
            Py_INCREF(v); /* a lookup may run Python code (a str subclass's __eq__) */
            index = PyDict_GetItemWithError(lookup, v);
            Py_DECREF(v);
            if (index == NULL && PyErr_Occurred())
                goto fail;
        }
        if (index != NULL) {
            double code = PyLong_CheckExact(index) ? PyLong_AsDouble(index) : PyFloat_AsDouble(index);
            if (code == -1.0 && PyErr_Occurred())
                goto fail;
            X[i * cols + j] = code;
            if (PyUnicode_CheckExact(v)) {
                seen[slot] = v;
                seen_code[slot] = code;
            }
        } else {
            PyObject *at = PyLong_FromSsize_t(i);
            if (at == NULL || PyList_Append(misses, at) < 0) {
                Py_XDECREF(at);
                goto fail;
            }
            Py_DECREF(at);
        }
    }
    PyBuffer_Release(&view);
    return misses;
fail:
    Py_XDECREF(misses);
    PyBuffer_Release(&view);
    return NULL;
}

PyDoc_STRVAR(encode_columns_doc,
"encode_columns(arrays, lookups, X) -> list[int]\n\n"
"The usual columns of a batch written into its model matrix in one call: X (a C-contiguous float64\n"
"matrix of n rows, one column per model column j, NaN already) gets X[:, j] = arrays[j] for a 1-D\n"
"float64 array of n values whose lookups[j] is None (a numeric column), and the level indices of a\n"
"1-D object array of n str that ``lookups[j]`` (level -> index) all holds (a categorical one).\n"
"arrays[j] None: nothing to write. Returns the j left for the caller (any other array: other\n"
"dtypes, shapes, values that are not str or name no level), whose column may be partly written.");

/* Whether a buffer's format is the one letter `code` (after a byte-order mark). */
static int format_is(const Py_buffer *view, char code) {
    const uint16_t one = 1;
    const char *fmt = view->format ? view->format : "B";
    char own = *(const unsigned char *)&one == 1 ? '<' : '>'; /* this machine's order, named */
    if (fmt[0] == own || fmt[0] == '=' || fmt[0] == '@' || fmt[0] == '|')
        fmt++;
    return fmt[0] == code && fmt[1] == '\0';
}

/* Column j of X from one array (see encode_columns): 1 when written, 0 when left to the caller, -1 on error. */
static int encode_column(PyObject *array, PyObject *lookup, double *X, Py_ssize_t n, Py_ssize_t cols, Py_ssize_t j) {
    Py_buffer view;
    int done = 0;
    if (PyObject_GetBuffer(array, &view, PyBUF_STRIDES | PyBUF_FORMAT) < 0) {
        PyErr_Clear(); /* not an array this reads: the caller's */
        return 0;
    }
    if (view.ndim != 1 || view.shape[0] != n || view.itemsize != (lookup == Py_None ? 8 : (Py_ssize_t)sizeof(PyObject *)))
        goto out;
    if (lookup == Py_None) {
        const char *p = view.buf;
        if (!format_is(&view, 'd'))
            goto out;
        for (Py_ssize_t i = 0; i < n; i++, p += view.strides[0])
            memcpy(&X[i * cols + j], p, sizeof(double));
        done = 1;
    } else if (format_is(&view, 'O') && PyDict_Check(lookup)) {
        /* As level_codes: the codes of the str objects met so far, by address (the array holds them). */
        PyObject *seen[16] = {NULL};
        double seen_code[16];
        const char *p = view.buf;
        done = 1;
        for (Py_ssize_t i = 0; i < n && done == 1; i++, p += view.strides[0]) {
            PyObject *v, *index;
            size_t slot;
            double code;
            memcpy(&v, p, sizeof(v));
            slot = ((uintptr_t)v >> 4) % 16;
            if (v != NULL && seen[slot] == v) {
                X[i * cols + j] = seen_code[slot];
                continue;
            }
            if (v == NULL || !PyUnicode_CheckExact(v)) {
                done = 0; /* None, numbers, bytes, str subclasses: the caller's */
                break;
            }
            index = PyDict_GetItemWithError(lookup, v); /* an exact str: no Python code runs */
            if (index == NULL) {
                done = PyErr_Occurred() ? -1 : 0;
                break;
            }
            code = PyLong_CheckExact(index) ? PyLong_AsDouble(index) : PyFloat_AsDouble(index);
            if (code == -1.0 && PyErr_Occurred()) {
                done = -1;
                break;
            }
            X[i * cols + j] = code;
            seen[slot] = v;
            seen_code[slot] = code;
        }
    }
out:
    PyBuffer_Release(&view);
    return done;
}

static PyObject *encode_columns(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    Py_buffer xv;
    PyObject *arrays, *lookups, *left = NULL;
    Py_ssize_t n, cols;
    if (nargs != 3 || !PyList_Check(args[0]) || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "encode_columns() takes (list, list, X)");
        return NULL;
    }
    arrays = args[0];
    lookups = args[1];
    if (get_array(args[2], &xv, "X", 'd', 8, 2, 1) < 0)
        return NULL;
    n = dim(&xv, 0);
    cols = dim(&xv, 1);
    if (PyList_GET_SIZE(arrays) != cols || PyList_GET_SIZE(lookups) != cols) {
        PyErr_SetString(PyExc_ValueError, "encode_columns(): one array and one lookup per column of X");
        goto done;
    }
    left = PyList_New(0);
    if (left == NULL)
        goto done;
    for (Py_ssize_t j = 0; j < cols && j < PyList_GET_SIZE(arrays) && j < PyList_GET_SIZE(lookups); j++) {
        PyObject *array = PyList_GET_ITEM(arrays, j), *lookup = PyList_GET_ITEM(lookups, j);
        int done;
        if (array == Py_None)
            continue;
        Py_INCREF(array);
        Py_INCREF(lookup);
        done = encode_column(array, lookup, (double *)xv.buf, n, cols, j);
        Py_DECREF(array);
        Py_DECREF(lookup);
        if (done < 0) {
            Py_CLEAR(left);
            goto done;
        }
        if (done == 0) {
            PyObject *at = PyLong_FromSsize_t(j);
            if (at == NULL || PyList_Append(left, at) < 0) {
                Py_XDECREF(at);
                Py_CLEAR(left);
                goto done;
            }
            Py_DECREF(at);
        }
    }
done:
    PyBuffer_Release(&xv);
    return left;
}

/* ---- tables checked once: Tables (tables()) and score_tables() ------------------------------------------ */

/* The arrays of tables(), in its argument order. */
enum { T_NODES, T_VALUES, T_BITS, T_ROOTS, T_TARGET, T_DOM_LEN, T_PARAMS, T_PRIOR, T_DISTRIB, T_COUNT };

/* One model's tables, held read-only and checked once: score() checks them on every call (a walk
 * over the whole node table and a buffer per array), score_tables() reads them from here. */
typedef struct {
    PyObject_HEAD
    Py_buffer views[T_COUNT];
    int got;
    Py_buffer layout_v[L_COUNT];
    int layout_got;
    int padded; /* the layout is there and usable (slot offsets fit int32) */
    Layout layout;
    Model m; /* the tables' fields; the rows' (X, offsets, preds, ties) are set per call */
} Tables;

static void tables_dealloc(Tables *self) {
    while (self->layout_got > 0)
        PyBuffer_Release(&self->layout_v[--self->layout_got]);
    while (self->got > 0)
        PyBuffer_Release(&self->views[--self->got]);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject TablesType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "forestflow.runtime._h2o_trees.Tables",
    .tp_basicsize = sizeof(Tables),
    .tp_dealloc = (destructor)tables_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = PyDoc_STR("One model's tables, checked once (made by tables(), read by score_tables())."),
};

/* get_array() of a read-only array: what is held must not change after it was checked. */
static int get_frozen(PyObject *obj, Py_buffer *view, const char *name, char code, Py_ssize_t itemsize, int ndim) {
    if (get_array(obj, view, name, code, itemsize, ndim, 0) < 0)
        return -1;
    if (!view->readonly) {
        PyErr_Format(PyExc_TypeError, "%s must be a read-only array (flags.writeable = False)", name);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(tables_doc,
"tables(nodes, values, bits, roots, target, dom_len, params, prior, model_distrib, width[, layout]) -> Tables\n\n"
"The tables score() takes, held and checked once as score() checks them (ValueError, TypeError): every\n"
"array read-only (flags.writeable = False); width is the prediction width (preds' columns), layout as score()'s.");

static PyObject *tables(PyObject *Py_UNUSED(self), PyObject *args) {
    static const struct { const char *name; char code; Py_ssize_t size; int ndim; } spec[T_COUNT] = {
        {"nodes", 'i', 4, 2}, {"values", 'd', 8, 1}, {"bits", 'B', 1, 1}, {"roots", 'i', 4, 1}, {"target", 'i', 4, 1},
        {"dom_len", 'q', 8, 1}, {"params", 'd', 8, 1}, {"prior", 'd', 8, 1}, {"model_distrib", 'd', 8, 1},
    };
    PyObject *objs[T_COUNT], *o_layout = NULL;
    Py_ssize_t width;
    Tables *t;
    Model *m;
    const char *error;

    if (!PyArg_ParseTuple(args, "OOOOOOOOOn|O:tables", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &objs[5], &objs[6],
                          &objs[7], &objs[8], &width, &o_layout))
        return NULL;
    t = PyObject_New(Tables, &TablesType);
    if (t == NULL)
        return NULL;
    t->got = t->layout_got = t->padded = 0;
    for (; t->got < T_COUNT; t->got++)
        if (get_frozen(objs[t->got], &t->views[t->got], spec[t->got].name, spec[t->got].code, spec[t->got].size, spec[t->got].ndim) < 0)
            goto fail;
    m = &t->m;
    memset(m, 0, sizeof(*m));
    m->nodes = t->views[T_NODES].buf;
    m->n_nodes = dim(&t->views[T_NODES], 0);
    m->values = t->views[T_VALUES].buf;
    m->bits = t->views[T_BITS].buf;
    m->n_bits = dim(&t->views[T_BITS], 0);
    m->roots = t->views[T_ROOTS].buf;
    m->target = t->views[T_TARGET].buf;
    m->n_trees = dim(&t->views[T_ROOTS], 0);
    m->dom_len = t->views[T_DOM_LEN].buf;
    m->n_features = dim(&t->views[T_DOM_LEN], 0);
    m->params = t->views[T_PARAMS].buf;
    m->prior = t->views[T_PRIOR].buf;
    m->model_distrib = t->views[T_DISTRIB].buf;
    m->n_prior = dim(&t->views[T_PRIOR], 0);
    m->width = width;
    /* score()'s checks of the tables' shapes, parameters and contents (its rows' shapes: score_tables()). */
    if (dim(&t->views[T_NODES], 1) != N_WIDTH || dim(&t->views[T_VALUES], 0) != m->n_nodes || dim(&t->views[T_TARGET], 0) != m->n_trees ||
        dim(&t->views[T_PARAMS], 0) != P_COUNT || m->width < 1 || dim(&t->views[T_DISTRIB], 0) != m->n_prior ||
        (m->params[P_BALANCE] != 0 && m->n_prior < m->width - 1)) {
        PyErr_SetString(PyExc_ValueError, "tables(): array shapes do not fit one another");
        goto fail;
    }
    error = check_params(m->params, m->width);
    if (error == NULL)
        error = check_layout(m->nodes, m->n_nodes, m->n_bits, m->roots, m->target, m->n_trees, m->n_features, m->width);
    if (error == NULL && o_layout != NULL && o_layout != Py_None) {
        if (get_layout(o_layout, t->layout_v, &t->layout_got, 0, &t->layout) < 0)
            goto fail;
        for (int k = 0; k < L_COUNT; k++)
            if (!t->layout_v[k].readonly) {
                PyErr_Format(PyExc_TypeError, "%s must be a read-only array (flags.writeable = False)", layout_spec[k].name);
                goto fail;
            }
        error = check_padded(m, &t->layout);
        t->padded = error == NULL && t->layout.n_slots < (1 << 24); /* slot offsets are int32: else the node table */
    }
    if (error != NULL) {
        PyErr_Format(PyExc_ValueError, "tables(): %s", error);
        goto fail;
    }
    return (PyObject *)t;

fail:
    Py_DECREF(t);
    return NULL;
}

PyDoc_STRVAR(score_tables_doc,
"score_tables(tables, X, offsets, preds, ties, padded)\n\n"
"score() of the rows X (float64, rows x features) against tables checked by tables(): the same sums and\n"
"unifyPreds into preds (float64, rows x width, zeroed), ties as score()'s; padded: the trees the layout\n"
"holds walked padded (when tables() was given one). Only the rows' shapes are checked here.");

static PyObject *score_tables(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    enum { S_X, S_OFFSETS, S_PREDS, S_TIES, S_COUNT };
    static const struct { const char *name; char code; Py_ssize_t size; int ndim, writable; } spec[S_COUNT] = {
        {"X", 'd', 8, 2, 0}, {"offsets", 'd', 8, 1, 0}, {"preds", 'd', 8, 2, 1}, {"ties", 'B', 1, 1, 1},
    };
    Py_buffer views[S_COUNT];
    int got = 0, ok = 0, padded;
    Tables *t;
    Model m;

    if (nargs != 6 || !PyObject_TypeCheck(args[0], &TablesType)) {
        PyErr_SetString(PyExc_TypeError, "score_tables() takes Tables, X, offsets, preds, ties and padded");
        return NULL;
    }
    t = (Tables *)args[0];
    padded = PyObject_IsTrue(args[5]);
    if (padded < 0)
        return NULL;
    for (; got < S_COUNT; got++)
        if (get_array(args[1 + got], &views[got], spec[got].name, spec[got].code, spec[got].size, spec[got].ndim, spec[got].writable) < 0)
            goto done;
    m = t->m;
    m.X = views[S_X].buf;
    m.n_rows = dim(&views[S_X], 0);
    m.offsets = views[S_OFFSETS].buf;
    m.preds = views[S_PREDS].buf;
    m.ties = views[S_TIES].buf;
    if (dim(&views[S_X], 1) != m.n_features || dim(&views[S_OFFSETS], 0) != m.n_rows || dim(&views[S_PREDS], 0) != m.n_rows ||
        dim(&views[S_PREDS], 1) != m.width || dim(&views[S_TIES], 0) != m.n_rows) {
        PyErr_SetString(PyExc_ValueError, "score_tables(): array shapes do not fit the tables");
        goto done;
    }
    ok = score_rows(&m, padded && t->padded ? &t->layout : NULL) == 0;

done:
    while (got-- > 0)
        PyBuffer_Release(&views[got]);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"score", score, METH_VARARGS, score_doc},
    {"tables", tables, METH_VARARGS, tables_doc},
    {"score_tables", (PyCFunction)(void (*)(void))score_tables, METH_FASTCALL, score_tables_doc},
    {"check_tables", check_tables, METH_VARARGS, check_tables_doc},
    {"decisions", decisions, METH_VARARGS, decisions_doc},
    {"level_codes", (PyCFunction)(void (*)(void))level_codes, METH_FASTCALL, level_codes_doc},
    {"encode_columns", (PyCFunction)(void (*)(void))encode_columns, METH_FASTCALL, encode_columns_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_h2o_trees", "genmodel's score0 for H2O GBM and DRF MOJOs, in C.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__h2o_trees(void) {
    PyObject *mod;
    if (PyType_Ready(&TablesType) < 0)
        return NULL;
    mod = PyModule_Create(&module);
    if (mod == NULL)
        return NULL;
    Py_INCREF(&TablesType);
    if (PyModule_AddObject(mod, "Tables", (PyObject *)&TablesType) < 0) {
        Py_DECREF(&TablesType);
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
