/* specdec._layers: every decoder layer of the lean forward (specdec/lean.py) over the few rows of a decoding step or a
 * verify pass, in one native call.
 *
 * Why: with quantized weights a target step is ~90 ms, and the ~17 Python-level calls per layer around the products
 * (checks, views, rotary, cache writes, adds) cost ~0.5 ms a layer: 15% of the step (docs/quantized.md). Here a
 * layer is the same sequence of the same kernels (_quant_kernels.h, _rowops_kernels.h, _attention_kernels.h) on
 * buffers allocated once per call, so a row's result is the bits the Python forward gives it (tests/test_layers.py
 * compares them bit for bit) and stays batch-invariant: every operation is per row or per (head, row), in an order
 * fixed by the layer's sizes.
 *
 * The layers are described by a plan (specdec/fused_layers.py builds it from checked tensors): one row of int64
 * fields per layer, the addresses and sizes of its weights and of its KV cache. Everything C relies on that the
 * plan's numbers can say is checked here again before any pointer is followed.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <time.h>

#include "_attention_kernels.h"
#include "_quant_kernels.h"
#include "_rowops_kernels.h"

/* Wall seconds on a clock that never steps (a layer's time, for the cost model's profiles). */
static double monotonic_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* A plan row: the fields of one layer. A product run is (type, address, bytes per row, output rows[, bias]). */
enum {
    F_ATTN_NORM,
    F_FFN_NORM,
    F_N_QKV, /* 1..3 runs of q|k|v outputs (adjacent outputs of one type share a run) */
    F_QKV,   /* 3 x (type, address, row bytes, rows, bias address) */
    F_O = F_QKV + 3 * 5, /* type, address, row bytes */
    F_N_GATE_UP = F_O + 3, /* 1..2 runs of gate|up outputs */
    F_GATE_UP,             /* 2 x (type, address, row bytes, rows) */
    F_DOWN = F_GATE_UP + 2 * 4, /* type, address, row bytes */
    F_KEYS = F_DOWN + 3,        /* this layer's cache: (kv_heads, max_length, head_dim) fp32 */
    F_VALUES,
    N_FIELDS
};

typedef struct {
    int64_t hidden, heads, kv_heads, head_dim, ffn, max_length;
    float eps, scale;
    int threads, kernel; /* kernel: the product kernel (_quant_kernels.h), one this CPU supports */
    const float *cos, *sin; /* (max_length, head_dim): rotary_tables' cos and signed sin */
} dims_t;

#ifdef SPECDEC_X86
/* x * cos + roll(x, head_dim / 2) * sin for each head of one row, three roundings per value as torch's three ops. */
static void rotate(const float *x, float *out, int64_t heads, int64_t hd, const float *cos, const float *sin) {
    const int64_t half = hd / 2;
    for (int64_t h = 0; h < heads; h++, x += hd, out += hd)
        for (int64_t j = 0; j < hd; j++) {
            const float a = x[j] * cos[j];
            const float b = x[j < half ? j + half : j - half] * sin[j];
            out[j] = a + b;
        }
}

static void add_rows(float *h, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) h[i] = h[i] + y[i];
}

#define PTR(field) ((const void *)(uintptr_t)(field))

/* One layer over rows at positions start..start+rows-1; h (rows x hidden) is updated in place. work: the buffers
 * layer_work() sizes. Returns 0, or -1 when a product could not allocate its activations. */
static int layer(const int64_t *f, const dims_t *c, float *h, int64_t rows, int64_t start, float *work) {
    const int64_t H = c->heads, Hkv = c->kv_heads, hd = c->head_dim, hidden = c->hidden, ffn = c->ffn;
    const int64_t qkv_w = (H + 2 * Hkv) * hd, end = start + rows;
    float *x = work, *qkv = x + rows * hidden, *rot = qkv + rows * qkv_w, *att = rot + rows * (H + Hkv) * hd;
    float *gu = att + rows * hidden, *act = gu + rows * 2 * ffn, *tmp = act + rows * ffn, *scratch = tmp + rows * hidden;
    float *keys = (float *)PTR(f[F_KEYS]), *values = (float *)PTR(f[F_VALUES]);

    rms_norm(h, PTR(f[F_ATTN_NORM]), x, rows, hidden, c->eps);
    for (int64_t r = 0, offset = 0; r < f[F_N_QKV]; r++) {
        const int64_t *run = f + F_QKV + 5 * r;
        if (matmul((int)run[0], PTR(run[1]), run[2], x, PTR(run[4]), qkv + offset, qkv_w, run[3], hidden, rows,
                   c->threads, c->kernel))
            return -1;
        offset += run[3];
    }
    for (int64_t i = 0; i < rows; i++) {
        const int64_t pos = start + i;
        rotate(qkv + i * qkv_w, rot + i * (H + Hkv) * hd, H + Hkv, hd, c->cos + pos * hd, c->sin + pos * hd);
        for (int64_t g = 0; g < Hkv; g++) {
            memcpy(keys + (g * c->max_length + pos) * hd, rot + (i * (H + Hkv) + H + g) * hd, sizeof(float) * hd);
            memcpy(values + (g * c->max_length + pos) * hd, qkv + i * qkv_w + (H + Hkv + g) * hd, sizeof(float) * hd);
        }
    }
    const int64_t per_thread = attend_scratch_floats(end);
    attend_f32(rot, hd, (H + Hkv) * hd, keys, c->max_length * hd, hd, values, c->max_length * hd, hd, att, hd, hidden,
               H, Hkv, rows, end, hd, c->scale, c->threads, scratch, per_thread);
    if (matmul((int)f[F_O], PTR(f[F_O + 1]), f[F_O + 2], att, NULL, tmp, hidden, hidden, hidden, rows, c->threads,
               c->kernel))
        return -1;
    add_rows(h, tmp, rows * hidden);

    rms_norm(h, PTR(f[F_FFN_NORM]), x, rows, hidden, c->eps);
    for (int64_t r = 0, offset = 0; r < f[F_N_GATE_UP]; r++) {
        const int64_t *run = f + F_GATE_UP + 4 * r;
        if (matmul((int)run[0], PTR(run[1]), run[2], x, NULL, gu + offset, 2 * ffn, run[3], hidden, rows, c->threads,
                   c->kernel))
            return -1;
        offset += run[3];
    }
    silu_mul(gu, gu + ffn, 2 * ffn, act, rows, ffn);
    if (matmul((int)f[F_DOWN], PTR(f[F_DOWN + 1]), f[F_DOWN + 2], act, NULL, tmp, hidden, hidden, ffn, rows,
               c->threads, c->kernel))
        return -1;
    add_rows(h, tmp, rows * hidden);
    return 0;
}
#endif

/* Floats of work space a call needs: layer()'s buffers plus the attention's scratch per thread. */
static int64_t layer_work(const dims_t *c, int64_t rows, int64_t end) {
    const int64_t H = c->heads, Hkv = c->kv_heads, hd = c->head_dim;
    return rows * (3 * c->hidden + (H + 2 * Hkv) * hd + (H + Hkv) * hd + 3 * c->ffn) +
           (int64_t)c->threads * attend_scratch_floats(end);
}

static int fail(const char *message, long long layer_index) {
    PyErr_Format(PyExc_ValueError, "layer plan row %lld: %s", layer_index, message);
    return 0;
}

/* A product run's fields as C will use them: a known quantized or float type, rows of in_features values whose byte
 * count matches, a non-null address; a grouped type (16 rows a group): a whole number of groups of `outputs` rows. */
static int check_run(const int64_t *run, int64_t in_features, int64_t outputs, long long index) {
    if (run[0] < 0 || run[0] >= N_TYPES) return fail("unknown weight type code", index);
    const int type = (int)run[0];
    if (in_features % BLOCK_VALUES[type] || (type != F32 && type != F16 && in_features % 8))
        return fail("a product's input width is not a whole number of its type's blocks", index);
    if (run[2] != in_features / BLOCK_VALUES[type] * BLOCK_BYTES[type])
        return fail("a product's bytes per row do not match its type and input width", index);
    if (!run[1]) return fail("a product's weight address is null", index);
    if (is_grouped(type) && outputs % R16)
        return fail("a grouped product's outputs are not whole groups of 16 rows", index);
    return 1;
}

static int check_plan(const int64_t *plan, int64_t n_layers, const dims_t *c) {
    for (int64_t l = 0; l < n_layers; l++) {
        const int64_t *f = plan + l * N_FIELDS;
        if (!f[F_ATTN_NORM] || !f[F_FFN_NORM] || !f[F_KEYS] || !f[F_VALUES]) return fail("a null address", l);
        if (f[F_N_QKV] < 1 || f[F_N_QKV] > 3 || f[F_N_GATE_UP] < 1 || f[F_N_GATE_UP] > 2)
            return fail("q|k|v must come in 1..3 runs and gate|up in 1..2", l);
        int64_t outputs = 0;
        for (int64_t r = 0; r < f[F_N_QKV]; r++) {
            const int64_t *run = f + F_QKV + 5 * r;
            if (!check_run(run, c->hidden, run[3], l)) return 0;
            if (run[3] < 1 || !run[4]) return fail("a q|k|v run needs outputs and a bias", l);
            outputs += run[3];
        }
        if (outputs != (c->heads + 2 * c->kv_heads) * c->head_dim)
            return fail("the q|k|v runs' outputs do not add up to (heads + 2 kv_heads) x head_dim", l);
        outputs = 0;
        for (int64_t r = 0; r < f[F_N_GATE_UP]; r++) {
            const int64_t *run = f + F_GATE_UP + 4 * r;
            if (!check_run(run, c->hidden, run[3], l)) return 0;
            if (run[3] < 1) return fail("a gate|up run needs outputs", l);
            outputs += run[3];
        }
        if (outputs != 2 * c->ffn) return fail("the gate|up runs' outputs do not add up to 2 x ffn", l);
        if (f[F_N_GATE_UP] == 2 && f[F_GATE_UP + 3] != c->ffn) return fail("gate and up must have ffn rows each", l);
        if (!check_run(f + F_O, c->hidden, c->hidden, l) || !check_run(f + F_DOWN, c->ffn, c->hidden, l)) return 0;
    }
    return 1;
}

/* forward(plan, n_layers, n_fields, h, rows, start, hidden, heads, kv_heads, head_dim, ffn, max_length, cos, sin,
 * eps, scale, threads, seconds, kernel): run the plan's layers over h (rows x hidden fp32, in place) at positions
 * start..; writes their keys and values into each layer's cache. seconds: 0, or n_layers doubles that get each
 * layer's wall time (every thread of a layer's products has joined when it returns). kernel: a product kernel's name
 * (_quant_kernels.h). specdec/fused_layers.py checks every tensor first. */
static PyObject *py_forward(PyObject *self, PyObject *args) {
    unsigned long long plan_addr, h_addr, cos_addr, sin_addr, seconds_addr;
    long long n_layers, n_fields, rows, start;
    dims_t c;
    long long hidden, heads, kv_heads, head_dim, ffn, max_length;
    const char *kernel_name;
    if (!PyArg_ParseTuple(args, "KLLKLLLLLLLLKKffiKs", &plan_addr, &n_layers, &n_fields, &h_addr, &rows, &start,
                          &hidden, &heads, &kv_heads, &head_dim, &ffn, &max_length, &cos_addr, &sin_addr, &c.eps,
                          &c.scale, &c.threads, &seconds_addr, &kernel_name))
        return NULL;
    c.kernel = kernel_by_name(kernel_name);
    if (c.kernel < 0 || !kernel_supported(c.kernel)) {
        PyErr_Format(PyExc_ValueError, "%s is not a product kernel this CPU runs", kernel_name);
        return NULL;
    }
    if (!specdec_avx2_supported()) {
        PyErr_SetString(PyExc_RuntimeError, "specdec._layers needs an x86 CPU with AVX2, FMA and F16C");
        return NULL;
    }
    if (n_fields != N_FIELDS) {
        PyErr_Format(PyExc_ValueError, "a layer plan row holds %d fields, got %lld", N_FIELDS, n_fields);
        return NULL;
    }
    if (n_layers < 0 || rows < 1 || start < 0 || max_length < 1 || start + rows > max_length || hidden < 8 ||
        hidden % 8 || heads < 1 || kv_heads < 1 || heads % kv_heads || head_dim < 2 || head_dim % 2 ||
        head_dim > MAX_HEAD_DIM || heads * head_dim != hidden || ffn < 8 || ffn % 8 || c.threads < 1) {
        PyErr_Format(PyExc_ValueError, "bad layer sizes: %lld layers, %lld rows at %lld (cache %lld), hidden %lld, "
                     "heads %lld / %lld of %lld, ffn %lld, threads %d", n_layers, rows, start, max_length, hidden,
                     heads, kv_heads, head_dim, ffn, c.threads);
        return NULL;
    }
    if (!plan_addr || !h_addr || !cos_addr || !sin_addr) {
        PyErr_SetString(PyExc_ValueError, "null address for the plan, the rows or the rotary tables");
        return NULL;
    }
    c.hidden = hidden, c.heads = heads, c.kv_heads = kv_heads, c.head_dim = head_dim, c.ffn = ffn;
    c.max_length = max_length;
    c.cos = (const float *)(uintptr_t)cos_addr, c.sin = (const float *)(uintptr_t)sin_addr;
    const int64_t *plan = (const int64_t *)(uintptr_t)plan_addr;
    if (!check_plan(plan, n_layers, &c)) return NULL;
    int status = 0;
#ifdef SPECDEC_X86
    float *work = malloc(sizeof(float) * layer_work(&c, rows, start + rows));
    if (!work) return PyErr_NoMemory();
    double *seconds = (double *)(uintptr_t)seconds_addr;
    Py_BEGIN_ALLOW_THREADS
    for (int64_t l = 0; l < n_layers && !status; l++) {
        const double begin = seconds ? monotonic_seconds() : 0.0;
        status = layer(plan + l * N_FIELDS, &c, (float *)(uintptr_t)h_addr, rows, start, work);
        if (seconds) seconds[l] = monotonic_seconds() - begin;
    }
    Py_END_ALLOW_THREADS
    free(work);
#endif
    if (status) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *py_type_codes(PyObject *self, PyObject *args) {
    PyObject *codes = PyDict_New();
    for (int t = 0; codes && t < N_TYPES; t++) {
        PyObject *code = PyLong_FromLong(t);
        if (!code || PyDict_SetItemString(codes, TYPE_NAMES[t], code)) {
            Py_XDECREF(code);
            Py_DECREF(codes);
            return NULL;
        }
        Py_DECREF(code);
    }
    return codes;
}

static PyObject *py_n_fields(PyObject *self, PyObject *args) { return PyLong_FromLong(N_FIELDS); }

static PyObject *py_supported(PyObject *self, PyObject *args) { return PyBool_FromLong(specdec_avx2_supported()); }

static PyObject *py_build(PyObject *self, PyObject *args) { return PyUnicode_FromString(SPECDEC_BUILD); }

static PyMethodDef methods[] = {
    {"forward", py_forward, METH_VARARGS, "Run a plan's decoder layers over a few rows (see the source)."},
    {"type_codes", py_type_codes, METH_NOARGS, "Weight type name -> the code a plan row holds."},
    {"n_fields", py_n_fields, METH_NOARGS, "int64 fields per plan row."},
    {"supported", py_supported, METH_NOARGS, "Whether this CPU can run the kernels (AVX2, FMA, F16C)."},
    {"build", py_build, METH_NOARGS, "The hash of the sources and compile flags this module was built from."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_layers", NULL, -1, methods};

PyMODINIT_FUNC PyInit__layers(void) { return PyModule_Create(&module); }
