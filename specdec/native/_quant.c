/* specdec._quant: the Python face of the quantized products and dequantisation (specdec/_quant_kernels.h says
 * how they work and why they are batch-invariant). specdec/quant.py checks every tensor before a call. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "_quant_kernels.h"

static int supported(void) { return specdec_avx2_supported(); }

static int parse_type(const char *name) {
    for (int t = 0; t < N_TYPES; t++)
        if (!strcmp(name, TYPE_NAMES[t])) return t;
    PyErr_Format(PyExc_ValueError, "unknown tensor type %s", name);
    return -1;
}

static int check_sizes(int type, long long K) {
    if (!supported()) {
        PyErr_SetString(PyExc_RuntimeError, "specdec._quant needs an x86 CPU with AVX2, FMA and F16C");
        return 0;
    }
    if (K < 1 || K % BLOCK_VALUES[type] || (type != F32 && type != F16 && K % 8)) {
        PyErr_Format(PyExc_ValueError, "%s rows hold a positive multiple of %d values, got %lld", TYPE_NAMES[type],
                     BLOCK_VALUES[type], K);
        return 0;
    }
    return 1;
}

/* dequantize(type, src, dst, rows, K): addresses of `rows` contiguous rows of blocks and of rows x K floats. */
static PyObject *py_dequantize(PyObject *self, PyObject *args) {
    const char *name;
    unsigned long long src, dst;
    long long rows, K;
    if (!PyArg_ParseTuple(args, "sKKLL", &name, &src, &dst, &rows, &K)) return NULL;
    const int type = parse_type(name);
    if (type < 0 || !check_sizes(type, K)) return NULL;
    if (is_grouped(type)) {
        PyErr_Format(PyExc_ValueError, "%s rows are dequantised after unpacking them (r16_unpack)", TYPE_NAMES[type]);
        return NULL;
    }
    if (rows < 0) {
        PyErr_SetString(PyExc_ValueError, "rows must not be negative");
        return NULL;
    }
#ifdef SPECDEC_X86
    const int64_t stride = K / BLOCK_VALUES[type] * BLOCK_BYTES[type];
    Py_BEGIN_ALLOW_THREADS
    for (int64_t r = 0; r < rows; r++)
        dequantize_row(type, (const uint8_t *)(uintptr_t)src + r * stride, (float *)(uintptr_t)dst + r * K, K);
    Py_END_ALLOW_THREADS
#endif
    Py_RETURN_NONE;
}

/* The kernel named `name` where this CPU runs it; else -1 with a ValueError naming the ones it does. */
static int parse_kernel(const char *name) {
    const int kernel = kernel_by_name(name);
    if (kernel < 0) {
        char names[128] = "";
        for (int k = 0; k < N_KERNELS; k++) {
            if (k) strncat(names, ", ", sizeof names - strlen(names) - 1);
            strncat(names, KERNEL_NAMES[k], sizeof names - strlen(names) - 1);
        }
        PyErr_Format(PyExc_ValueError, "unknown product kernel %s (kernels: %s)", name, names);
    }
    else if (!kernel_supported(kernel))
        PyErr_Format(PyExc_ValueError, "this CPU cannot run the %s product kernel", name);
    return kernel < 0 || !kernel_supported(kernel) ? -1 : kernel;
}

/* matmul(type, w, row_bytes, x, b or 0, y, N, K, M, threads, kernel); specdec/quant.py checks every tensor first. */
static PyObject *py_matmul(PyObject *self, PyObject *args) {
    const char *name, *kernel_name;
    unsigned long long w, x, b, y;
    long long stride, N, K, M;
    int threads;
    if (!PyArg_ParseTuple(args, "sKLKKKLLLis", &name, &w, &stride, &x, &b, &y, &N, &K, &M, &threads, &kernel_name))
        return NULL;
    const int type = parse_type(name);
    if (type < 0 || !check_sizes(type, K)) return NULL;
    const int kernel = parse_kernel(kernel_name);
    if (kernel < 0) return NULL;
    if (N < 1 || M < 1 || threads < 1 || stride != K / BLOCK_VALUES[type] * BLOCK_BYTES[type] ||
        (is_grouped(type) && N % R16)) {
        PyErr_Format(PyExc_ValueError, "bad product sizes: N %lld, M %lld, threads %d, %lld bytes per row", N, M,
                     threads, stride);
        return NULL;
    }
    int status = 0;
#ifdef SPECDEC_X86
    Py_BEGIN_ALLOW_THREADS
    status = matmul(type, (const uint8_t *)(uintptr_t)w, stride, (const float *)(uintptr_t)x,
                    (const float *)(uintptr_t)b, (float *)(uintptr_t)y, N, N, K, M, threads, kernel);
    Py_END_ALLOW_THREADS
#endif
    if (status) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* r16_pack(type, src, dst, N, K) / r16_unpack(type, src, dst, N, K): N rows (a multiple of 16) of K values (a multiple
 * of the type's block) of Q4_K, Q6_K, Q5_0 or Q8_0 between the file's rows (N x K/256 x 144 or 210 bytes, N x K/32 x
 * 22 or 34) and groups of 16 rows (148, 210, 22 and 34 bytes a row and block). */
static PyObject *repack(PyObject *args, int pack) {
    const char *name;
    unsigned long long src, dst;
    long long N, K;
    if (!PyArg_ParseTuple(args, "sKKLL", &name, &src, &dst, &N, &K)) return NULL;
    const int type = parse_type(name);
    if (type < 0) return NULL;
    if (type != Q4_K && type != Q6_K && type != Q5_0 && type != Q8_0) {
        PyErr_Format(PyExc_ValueError, "only Q4_K, Q6_K, Q5_0 and Q8_0 have groups of 16 rows, not %s", name);
        return NULL;
    }
    if (!supported()) {
        PyErr_SetString(PyExc_RuntimeError, "specdec._quant needs an x86 CPU with AVX2, FMA and F16C");
        return NULL;
    }
    if (N < 0 || N % R16 || K < 1 || K % BLOCK_VALUES[type] || !src || !dst) {
        PyErr_Format(PyExc_ValueError, "%s groups of 16 rows need rows a multiple of 16 and a positive multiple "
                     "of %d values a row, got %lld x %lld", name, BLOCK_VALUES[type], N, K);
        return NULL;
    }
#ifdef SPECDEC_X86
    Py_BEGIN_ALLOW_THREADS
    r16_convert(type, pack, (const uint8_t *)(uintptr_t)src, (uint8_t *)(uintptr_t)dst, N, K);
    Py_END_ALLOW_THREADS
#endif
    Py_RETURN_NONE;
}
static PyObject *py_r16_pack(PyObject *self, PyObject *args) { return repack(args, 1); }
static PyObject *py_r16_unpack(PyObject *self, PyObject *args) { return repack(args, 0); }

/* hi4_pack(src, dst, N, K): N Q6_K rows of K values (the file's rows) to Q6_K_HI4 rows (_quant_hi4.h). */
static PyObject *py_hi4_pack(PyObject *self, PyObject *args) {
    unsigned long long src, dst;
    long long N, K;
    if (!PyArg_ParseTuple(args, "KKLL", &src, &dst, &N, &K)) return NULL;
    if (!check_sizes(Q6_K, K)) return NULL;
    if (N < 0 || !src || !dst) {
        PyErr_Format(PyExc_ValueError, "hi4_pack needs a non-negative row count and two addresses, got %lld", N);
        return NULL;
    }
#ifdef SPECDEC_X86
    Py_BEGIN_ALLOW_THREADS
    for (int64_t n = 0; n < N; n++)
        hi4_pack_row((const uint8_t *)(uintptr_t)src + n * (K / QK) * 210,
                     (uint8_t *)(uintptr_t)dst + n * (K / QK) * HI4_BLOCK_BYTES, K / QK);
    Py_END_ALLOW_THREADS
#endif
    Py_RETURN_NONE;
}

/* hi4_matmul(w, x, approx, bound, N, K, M, threads, kernel): _quant_hi4.h's approximate outputs and their bounds
 * (M x N each) of the Q6_K_HI4 rows w against x (M x K floats); specdec/gguf/argmax_head.py checks the tensors. */
static PyObject *py_hi4_matmul(PyObject *self, PyObject *args) {
    const char *kernel_name;
    unsigned long long w, x, approx, bound;
    long long N, K, M;
    int threads;
    if (!PyArg_ParseTuple(args, "KKKKLLLis", &w, &x, &approx, &bound, &N, &K, &M, &threads, &kernel_name))
        return NULL;
    if (!check_sizes(Q6_K, K)) return NULL;
    const int kernel = parse_kernel(kernel_name);
    if (kernel < 0) return NULL;
    if (N < 1 || M < 1 || threads < 1 || !w || !x || !approx || !bound) {
        PyErr_Format(PyExc_ValueError, "bad hi4 product sizes: N %lld, M %lld, threads %d", N, M, threads);
        return NULL;
    }
    int status = 0;
#ifdef SPECDEC_X86
    Py_BEGIN_ALLOW_THREADS
    status = hi4_matmul((const uint8_t *)(uintptr_t)w, (const float *)(uintptr_t)x, (float *)(uintptr_t)approx,
                        (float *)(uintptr_t)bound, N, K, M, threads, kernel);
    Py_END_ALLOW_THREADS
#endif
    if (status) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* hi4_r16_pack(src, dst, N, K): N Q6_K rows of K values (the file's rows; N a multiple of 16) to Q6_K_HI4 groups of
 * 16 rows (_quant_hi4.h). */
static PyObject *py_hi4_r16_pack(PyObject *self, PyObject *args) {
    unsigned long long src, dst;
    long long N, K;
    if (!PyArg_ParseTuple(args, "KKLL", &src, &dst, &N, &K)) return NULL;
    if (!check_sizes(Q6_K, K)) return NULL;
    if (N < 0 || N % 16 || !src || !dst) {
        PyErr_Format(PyExc_ValueError, "hi4_r16_pack needs a row count that is a multiple of 16 and two addresses, "
                                       "got %lld rows", N);
        return NULL;
    }
#ifdef SPECDEC_X86
    Py_BEGIN_ALLOW_THREADS
    hi4_r16_pack((const uint8_t *)(uintptr_t)src, (uint8_t *)(uintptr_t)dst, N, K / QK);
    Py_END_ALLOW_THREADS
#endif
    Py_RETURN_NONE;
}

/* hi4_r16_matmul(w, x, approx, bound, N, K, M, threads, kernel): hi4_matmul's outputs and bounds from the groups
 * of 16 rows (kernel avx2: 256-bit registers without VNNI; every other: AVX512-VNNI, the same bits);
 * specdec/gguf/argmax_head.py checks the tensors. */
static PyObject *py_hi4_r16_matmul(PyObject *self, PyObject *args) {
    const char *kernel_name;
    unsigned long long w, x, approx, bound;
    long long N, K, M;
    int threads;
    if (!PyArg_ParseTuple(args, "KKKKLLLis", &w, &x, &approx, &bound, &N, &K, &M, &threads, &kernel_name))
        return NULL;
    if (!check_sizes(Q6_K, K)) return NULL;
    const int kernel = parse_kernel(kernel_name);
    if (kernel < 0) return NULL;
    if (N < 16 || N % 16 || M < 1 || threads < 1 || !w || !x || !approx || !bound) {
        PyErr_Format(PyExc_ValueError, "bad hi4 group product sizes: N %lld (a multiple of 16), M %lld, threads %d",
                     N, M, threads);
        return NULL;
    }
    int status = 0;
#ifdef SPECDEC_X86
    Py_BEGIN_ALLOW_THREADS
    status = hi4_r16_matmul((const uint8_t *)(uintptr_t)w, (const float *)(uintptr_t)x, (float *)(uintptr_t)approx,
                            (float *)(uintptr_t)bound, N, K, M, threads, kernel);
    Py_END_ALLOW_THREADS
#endif
    if (status) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* hi4_candidates(approx, bound, N, M, margin, index, member, counts) -> the union's count (_quant_hi4.h);
 * specdec/gguf/argmax_head.py makes every array. */
static PyObject *py_hi4_candidates(PyObject *self, PyObject *args) {
    unsigned long long approx, bound, index, member, counts;
    long long N, M;
    float margin;
    if (!PyArg_ParseTuple(args, "KKLLfKKK", &approx, &bound, &N, &M, &margin, &index, &member, &counts)) return NULL;
    if (N < 1 || M < 1 || !approx || !bound || !index || !member || !counts || !(margin >= 0.0f)) {
        PyErr_Format(PyExc_ValueError, "bad hi4 candidate sizes: N %lld, M %lld, margin %g", N, M, (double)margin);
        return NULL;
    }
    int64_t kept = 0;
#ifdef SPECDEC_X86
    Py_BEGIN_ALLOW_THREADS
    kept = hi4_candidates((const float *)(uintptr_t)approx, (const float *)(uintptr_t)bound, N, M, margin,
                          (int64_t *)(uintptr_t)index, (uint8_t *)(uintptr_t)member, (int64_t *)(uintptr_t)counts);
    Py_END_ALLOW_THREADS
#endif
    if (kept < 0) return PyErr_NoMemory();
    return PyLong_FromLongLong(kept);
}

/* hi4_exact_rows(w, stride, index, member, count, x, out, N, K, M, threads, kernel): _quant_hi4.h's second pass
 * into out (M x N); argmax_head.py makes every array, here the indices are checked against N before any is read. */
static PyObject *py_hi4_exact_rows(PyObject *self, PyObject *args) {
    const char *kernel_name;
    unsigned long long w, index, member, x, out;
    long long stride, count, N, K, M;
    int threads;
    if (!PyArg_ParseTuple(args, "KLKKLKKLLLis", &w, &stride, &index, &member, &count, &x, &out, &N, &K, &M, &threads,
                          &kernel_name))
        return NULL;
    if (!check_sizes(Q6_K, K)) return NULL;
    const int kernel = parse_kernel(kernel_name);
    if (kernel < 0) return NULL;
    if (count < 0 || count > N || N < 1 || M < 1 || M > 4096 || threads < 1 || stride != K / QK * 210 || !w ||
        !index || !member || !x || !out) {
        PyErr_Format(PyExc_ValueError, "bad hi4 exact-row sizes: %lld rows of %lld, M %lld, %lld bytes a row", count,
                     N, M, stride);
        return NULL;
    }
    const int64_t *rows = (const int64_t *)(uintptr_t)index;
    for (int64_t j = 0; j < count; j++)
        if (rows[j] < 0 || rows[j] >= N) {
            PyErr_Format(PyExc_IndexError, "row %lld is outside the matrix's %lld rows", (long long)rows[j], N);
            return NULL;
        }
    int status = 0;
#ifdef SPECDEC_X86
    Py_BEGIN_ALLOW_THREADS
    status = hi4_exact_rows((const uint8_t *)(uintptr_t)w, stride, rows, (const uint8_t *)(uintptr_t)member, count,
                            (const float *)(uintptr_t)x, (float *)(uintptr_t)out, N, K, M, threads, kernel);
    Py_END_ALLOW_THREADS
#endif
    if (status) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *py_supported(PyObject *self, PyObject *args) { return PyBool_FromLong(supported()); }

/* The product kernels this CPU runs, slowest first. */
static PyObject *py_kernels(PyObject *self, PyObject *args) {
    PyObject *names = PyList_New(0);
    for (int k = 0; names && k < N_KERNELS; k++) {
        if (!kernel_supported(k)) continue;
        PyObject *name = PyUnicode_FromString(KERNEL_NAMES[k]);
        if (!name || PyList_Append(names, name)) {
            Py_XDECREF(name);
            Py_CLEAR(names);
        } else {
            Py_DECREF(name);
        }
    }
    return names;
}

static PyObject *py_build(PyObject *self, PyObject *args) { return PyUnicode_FromString(SPECDEC_BUILD); }

static PyMethodDef methods[] = {
    {"dequantize", py_dequantize, METH_VARARGS, "Rows of ggml blocks to fp32, as the gguf package computes them."},
    {"matmul", py_matmul, METH_VARARGS, "y = x @ W.T (+ b) for a quantized W; batch-invariant (see the source)."},
    {"r16_pack", py_r16_pack, METH_VARARGS, "Q4_K / Q6_K / Q5_0 / Q8_0 rows -> groups of 16 rows (every byte kept)."},
    {"r16_unpack", py_r16_unpack, METH_VARARGS, "Groups of 16 rows -> the file's rows, byte for byte."},
    {"hi4_pack", py_hi4_pack, METH_VARARGS, "Q6_K rows -> Q6_K_HI4 rows (the top four bits of each quant)."},
    {"hi4_matmul", py_hi4_matmul, METH_VARARGS, "Q6_K_HI4 outputs and their bounds (an exact argmax's first pass)."},
    {"hi4_r16_pack", py_hi4_r16_pack, METH_VARARGS, "Q6_K rows -> Q6_K_HI4 groups of 16 rows."},
    {"hi4_r16_matmul", py_hi4_r16_matmul, METH_VARARGS, "hi4_matmul from the groups of 16 rows."},
    {"hi4_candidates", py_hi4_candidates, METH_VARARGS, "The rows that can be each input's argmax (hi4 bounds)."},
    {"hi4_exact_rows", py_hi4_exact_rows, METH_VARARGS, "The Q6_K product over chosen rows (the same bits)."},
    {"supported", py_supported, METH_NOARGS, "Whether this CPU can run the kernels (AVX2, FMA, F16C)."},
    {"kernels", py_kernels, METH_NOARGS, "The product kernels this CPU runs, slowest first (all give the same bits)."},
    {"build", py_build, METH_NOARGS, "The hash of the source and compile flags this module was built from."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_quant", NULL, -1, methods};

PyMODINIT_FUNC PyInit__quant(void) { return PyModule_Create(&module); }
