/* The timeline graph's sequential loops over its arrays (analyzer/graph.py: CSR by node
 * position), compiled: each follows edges one at a time, which nothing vectorises.
 *
 * Fast paths, not second definitions: each has the same loop in Python beside its caller (used
 * when this module is not built), and tests check both give equal results
 * (tests/test_graph_arrays.py).
 *
 * acyclic(ptr, succ): Kahn's algorithm over a CSR of successors (ptr int64, n + 1; succ int64
 *   local positions 0..n-1) → True when every node is ordered. Python: graph._acyclic.
 *
 * The critical-path walk of one step window (analyzer/critical_path.py `_walk_py`): it visits
 * every op on the path and every edge into it. Segments are built from its records in Python.
 *
 * walk(ts, en, rank, in_ptr, in_src, in_kind, in_via, sink, rank_id, start_ns, end_ns)
 *   ts, en, rank: int64 per node position; in_ptr: int64, n + 1; in_src, in_via: int64 per
 *   in-edge (via -1 = none); in_kind: int8 per in-edge, index into graph.EDGE_KINDS.
 * → (records, hi, cut): records a list of (v, lo_v, hi, best, best_rel, best_kind, best_via),
 *   best = -1 when v has no predecessor on this rank (the walk ended there); hi the path's lower
 *   end when the loop stopped on its own condition, cut = 1 then (0 when it ended at a source).
 * walk_into(..., out) → (count, hi, cut): the same records written row by row to `out` (int64,
 *   room for 7 × n), which critical_path.py reads as a (count, 7) array.
 *
 * replay(ts, te, is_gpu, dur, gap, no_launch, pred_ptr, pred_src, pred_kind, start_ns, lat,
 *   host_scale) → float: the what-if replay of one step (analyzer/replay.py `_replay_py`, the
 *   same loop and the same double arithmetic in the same order, so both give equal floats).
 *   ts, te: int64 per episode position (topological order); is_gpu, no_launch: uint8 (a GPU op
 *   that no longer waits for its launch, a host call that no longer waits on its sync); dur, gap:
 *   float64; pred_ptr: int64, n + 1; pred_src: int64 earlier positions; pred_kind: int8 codes as
 *   graph.EDGE_KINDS.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* graph.EDGE_KINDS order: launch, stream, host, sync, event_wait, collective */
enum { K_LAUNCH = 0, K_STREAM = 1, K_HOST = 2, K_SYNC = 3, K_EVENT_WAIT = 4, K_COLLECTIVE = 5 };
/* critical_path._PRIORITY by kind code: equal releases prefer the stronger dependency */
static const int PRIORITY[6] = {4, 3, 5, 0, 1, 2};

static int get_buf(PyObject *o, Py_buffer *b, Py_ssize_t itemsize, const char *what) {
    if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    if (b->itemsize != itemsize) {
        PyErr_Format(PyExc_TypeError, "%s: expected items of %zd bytes", what, itemsize);
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

/* The walk's loop: writes one record of 7 int64 per op on the path to `rec` (room for n, the
 * walk visits a node at most once) and returns their count; `*hi_out`, `*cut_out` as in `walk`. */
static Py_ssize_t walk_loop(const int64_t *ts, const int64_t *en, const int64_t *rank,
                            const int64_t *in_ptr, const int64_t *in_src, const int8_t *in_kind,
                            const int64_t *in_via, Py_ssize_t n, Py_ssize_t m, int64_t sink,
                            int64_t rank_id, int64_t start_ns, int64_t end_ns,
                            unsigned char *seen, int64_t *rec, int64_t *hi_out, int *cut_out) {
    Py_ssize_t count = 0;
    int64_t hi = en[sink] < end_ns ? en[sink] : end_ns;
    int64_t v = sink;
    int cut = 1;
    while (v >= 0 && hi > start_ns && !seen[v]) {
        seen[v] = 1;
        int64_t best = -1, best_rel = 0, best_via = -1;
        int best_kind = -1, best_pri = 0;
        const int64_t ts_v = ts[v], en_v = en[v];
        for (int64_t j = in_ptr[v]; j < in_ptr[v + 1]; j++) {
            if (j < 0 || j >= m) continue;
            int64_t u = in_src[j];
            if (u < 0 || u >= n || rank[u] != rank_id) continue;  /* another rank */
            int k = in_kind[j];
            if (k < 0 || k > 5) continue;
            int64_t rel;
            if (k == K_COLLECTIVE) {
                rel = ts[u];
            } else {
                rel = en[u];
                if (k == K_LAUNCH && rel > ts_v) rel = ts_v > ts[u] ? ts_v : ts[u];
            }
            int64_t con = (k == K_SYNC || k == K_COLLECTIVE) ? en_v : ts_v;
            if (rel > con) rel = con;
            if (rel > hi) rel = hi;
            int pri = PRIORITY[k];
            if (best < 0 || rel > best_rel || (rel == best_rel && pri < best_pri)) {
                best = u; best_rel = rel; best_kind = k; best_via = in_via[j]; best_pri = pri;
            }
        }
        int64_t lo_v = ts_v;
        if (best >= 0 && best_rel > lo_v) lo_v = best_rel;
        if (start_ns > lo_v) lo_v = start_ns;
        if (hi < lo_v) lo_v = hi;
        int64_t *r = rec + 7 * count++;
        r[0] = v; r[1] = lo_v; r[2] = hi; r[3] = best; r[4] = best_rel; r[5] = best_kind;
        r[6] = best_via;
        if (best < 0) {
            cut = 0;
            break;
        }
        hi = best_rel < lo_v ? best_rel : lo_v;
        v = best;
    }
    *hi_out = hi;
    *cut_out = cut;
    return count;
}

/* walk(...) → (records, hi, cut); walk_into(..., out) writes the records to `out` (writable
 * int64, at least 7 × n items, row-major (count, 7)) → (count, hi, cut): no Python object per
 * record, the caller reads them as one array. */
static PyObject *walk_impl(PyObject *args, int into) {
    PyObject *o[8];
    long long sink, rank_id, start_ns, end_ns;
    if (into) {
        if (!PyArg_ParseTuple(args, "OOOOOOOLLLLO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5],
                              &o[6], &sink, &rank_id, &start_ns, &end_ns, &o[7]))
            return NULL;
    } else if (!PyArg_ParseTuple(args, "OOOOOOOLLLL", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5],
                                 &o[6], &sink, &rank_id, &start_ns, &end_ns)) {
        return NULL;
    }
    Py_buffer b[7], ob;
    const Py_ssize_t size[7] = {8, 8, 8, 8, 8, 1, 8};
    static const char *names[7] = {"ts", "en", "rank", "in_ptr", "in_src", "in_kind", "in_via"};
    int got = 0, got_out = 0;
    PyObject *records = NULL, *out = NULL;
    unsigned char *seen = NULL;
    int64_t *rec = NULL;
    for (; got < 7; got++)
        if (get_buf(o[got], &b[got], size[got], names[got]) < 0) goto done;
    const int64_t *ts = b[0].buf, *en = b[1].buf, *rank = b[2].buf, *in_ptr = b[3].buf,
                  *in_src = b[4].buf, *in_via = b[6].buf;
    const int8_t *in_kind = b[5].buf;
    Py_ssize_t n = b[0].len / 8, m = b[4].len / 8;
    if (b[1].len / 8 != n || b[2].len / 8 != n || b[3].len / 8 != n + 1 || b[5].len != m ||
        b[6].len / 8 != m || sink < 0 || sink >= n) {
        PyErr_SetString(PyExc_ValueError, "walk: array lengths or sink out of range");
        goto done;
    }
    if (into) {
        if (PyObject_GetBuffer(o[7], &ob, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0)
            goto done;
        got_out = 1;
        if (ob.itemsize != 8 || ob.len / 8 < 7 * n) {
            PyErr_SetString(PyExc_ValueError, "walk_into: out needs 7 × n int64 items");
            goto done;
        }
        rec = ob.buf;
    } else {
        rec = malloc((n ? n : 1) * 7 * sizeof(int64_t));
    }
    seen = calloc(n ? n : 1, 1);
    if (!seen || !rec) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t hi;
    int cut;
    Py_ssize_t count = walk_loop(ts, en, rank, in_ptr, in_src, in_kind, in_via, n, m, sink,
                                 rank_id, start_ns, end_ns, seen, rec, &hi, &cut);
    if (into) {
        out = Py_BuildValue("(nLi)", count, (long long)hi, cut);
        goto done;
    }
    records = PyList_New(count);
    if (!records) goto done;
    for (Py_ssize_t i = 0; i < count; i++) {
        const int64_t *r = rec + 7 * i;
        PyObject *t = Py_BuildValue("(LLLLLiL)", (long long)r[0], (long long)r[1],
                                    (long long)r[2], (long long)r[3], (long long)r[4], (int)r[5],
                                    (long long)r[6]);
        if (!t) goto done;
        PyList_SET_ITEM(records, i, t);
    }
    out = Py_BuildValue("(OLi)", records, (long long)hi, cut);
done:
    Py_XDECREF(records);
    free(seen);
    if (!into) free(rec);
    if (got_out) PyBuffer_Release(&ob);
    for (int i = 0; i < got; i++) PyBuffer_Release(&b[i]);
    return out;
}

static PyObject *walk(PyObject *self, PyObject *args) { return walk_impl(args, 0); }

static PyObject *walk_into(PyObject *self, PyObject *args) { return walk_impl(args, 1); }

static PyObject *acyclic(PyObject *self, PyObject *args) {
    PyObject *po, *so;
    if (!PyArg_ParseTuple(args, "OO", &po, &so)) return NULL;
    Py_buffer pb, sb;
    if (get_buf(po, &pb, 8, "ptr") < 0) return NULL;
    if (get_buf(so, &sb, 8, "succ") < 0) {
        PyBuffer_Release(&pb);
        return NULL;
    }
    const int64_t *ptr = pb.buf, *succ = sb.buf;
    Py_ssize_t n = pb.len / 8 - 1, m = sb.len / 8;
    PyObject *out = NULL;
    int64_t *indeg = NULL, *ready = NULL;
    if (n < 0 || (n >= 0 && (ptr[0] != 0 || ptr[n] != m))) {
        PyErr_SetString(PyExc_ValueError, "acyclic: ptr does not index succ");
        goto done;
    }
    indeg = calloc(n ? n : 1, sizeof(int64_t));
    ready = malloc((n ? n : 1) * sizeof(int64_t));
    if (!indeg || !ready) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t j = 0; j < m; j++) {
        if (succ[j] < 0 || succ[j] >= n) {
            PyErr_SetString(PyExc_ValueError, "acyclic: successor out of range");
            goto done;
        }
        indeg[succ[j]]++;
    }
    Py_ssize_t top = 0, done_n = 0;
    for (Py_ssize_t u = 0; u < n; u++)
        if (indeg[u] == 0) ready[top++] = u;
    while (top) {
        int64_t u = ready[--top];
        done_n++;
        for (int64_t j = ptr[u]; j < ptr[u + 1]; j++)
            if (--indeg[succ[j]] == 0) ready[top++] = succ[j];
    }
    out = PyBool_FromLong(done_n == n);
done:
    free(indeg);
    free(ready);
    PyBuffer_Release(&pb);
    PyBuffer_Release(&sb);
    return out;
}

/* replay(...) → the step's length (ns) when its graph runs with the edited durations and gaps
 * (module doc; replay.py `_replay_py` is the loop, commented). */
static PyObject *replay(PyObject *self, PyObject *args) {
    PyObject *o[9];
    long long start_ns, lat;
    double host_scale;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOLLd", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6],
                          &o[7], &o[8], &start_ns, &lat, &host_scale))
        return NULL;
    static const Py_ssize_t size[9] = {8, 8, 1, 8, 8, 1, 8, 8, 1};
    static const char *what[9] = {"ts", "te", "is_gpu", "dur", "gap", "no_launch", "pred_ptr",
                                  "pred_src", "pred_kind"};
    Py_buffer b[9];
    int got = 0;
    PyObject *out = NULL;
    double *start = NULL, *end = NULL;
    for (; got < 9; got++)
        if (get_buf(o[got], &b[got], size[got], what[got]) < 0) goto done;
    const int64_t *ts = b[0].buf, *te = b[1].buf, *ptr = b[6].buf, *src = b[7].buf;
    const uint8_t *is_gpu = b[2].buf, *no_launch = b[5].buf;
    const double *dur = b[3].buf, *gapf = b[4].buf;
    const int8_t *kind = b[8].buf;
    Py_ssize_t n = b[0].len / 8, m = b[7].len / 8;
    if (b[1].len / 8 != n || b[2].len != n || b[3].len / 8 != n || b[4].len / 8 != n ||
        b[5].len != n || b[6].len / 8 != n + 1 || b[8].len != m || ptr[0] != 0 || ptr[n] != m) {
        PyErr_SetString(PyExc_ValueError, "replay: arrays of different lengths");
        goto done;
    }
    for (Py_ssize_t j = 0; j < m; j++)
        if (kind[j] < 0 || kind[j] > 5) {
            PyErr_SetString(PyExc_ValueError, "replay: edge kind out of range");
            goto done;
        }
    start = malloc((n ? n : 1) * sizeof(double));
    end = malloc((n ? n : 1) * sizeof(double));
    if (!start || !end) {
        PyErr_NoMemory();
        goto done;
    }
    double longest = 0.0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const int64_t lo = ptr[i], hi = ptr[i + 1];
        if (lo > hi || lo < 0 || hi > m) {
            PyErr_SetString(PyExc_ValueError, "replay: pred_ptr not increasing");
            goto done;
        }
        for (int64_t j = lo; j < hi; j++)
            if (src[j] < 0 || src[j] >= i) {
                PyErr_SetString(PyExc_ValueError, "replay: a predecessor not earlier in order");
                goto done;
            }
        double ready = lo == hi ? (double)(ts[i] - start_ns) : 0.0;
        if (is_gpu[i]) {
            for (int64_t j = lo; j < hi; j++) {
                const int64_t p = src[j];
                double r;
                if (kind[j] == K_LAUNCH) {
                    if (no_launch[i]) continue;
                    int64_t d = ts[i] - ts[p];
                    if (d < 0) d = 0;
                    if (d > lat) d = lat;
                    r = start[p] + (double)d;
                } else {
                    r = end[p];
                }
                if (r > ready) ready = r;
            }
            start[i] = ready;
            end[i] = ready + dur[i];
        } else {
            double waited = 0.0;
            int64_t blocked_until = ts[i];
            int64_t binding = -1, last = -1;
            for (int64_t j = lo; j < hi; j++)
                if (kind[j] == K_HOST && te[src[j]] > last) {
                    binding = src[j];
                    last = te[src[j]];
                }
            for (int64_t j = lo; j < hi; j++) {
                const int64_t p = src[j];
                if (kind[j] == K_SYNC) {
                    if (no_launch[i]) continue; /* removed: it no longer waits */
                    if (end[p] > waited) waited = end[p];
                    if (te[p] > blocked_until) blocked_until = te[p];
                } else {
                    double gap = 0.0;
                    if (p == binding) {
                        int64_t g = ts[i] - te[p];
                        gap = (double)(g > 0 ? g : 0) * gapf[i] * host_scale;
                    }
                    if (end[p] + gap > ready) ready = end[p] + gap;
                }
            }
            start[i] = ready;
            const double own = dur[i] * host_scale;
            if (blocked_until > ts[i]) {
                int64_t t = te[i] - blocked_until, span = te[i] - ts[i];
                const double tail = (double)(t > 0 ? t : 0) * (own / (double)(span > 1 ? span : 1));
                end[i] = (ready > waited ? ready : waited) + tail;
            } else {
                end[i] = ready + own > waited ? ready + own : waited;
            }
        }
        if (i == 0 || end[i] > longest) longest = end[i];
    }
    out = PyFloat_FromDouble(longest);
done:
    free(start);
    free(end);
    for (int k = 0; k < got; k++) PyBuffer_Release(&b[k]);
    return out;
}

static PyMethodDef methods[] = {
    {"acyclic", acyclic, METH_VARARGS, "Kahn's check over a CSR of successors (module doc)."},
    {"walk", walk, METH_VARARGS, "Critical-path walk of one step window (see the module doc)."},
    {"walk_into", walk_into, METH_VARARGS, "The walk, its records written to an int64 array."},
    {"replay", replay, METH_VARARGS, "What-if replay of one step (see the module doc)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_graph_loops",
    "The timeline graph's sequential loops, compiled (see the source's head comment).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__graph_loops(void) { return PyModule_Create(&module); }
