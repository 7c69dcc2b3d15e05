/* The lean forward's per-row operations in one call each (x86, AVX2 + FMA): RMSNorm and the MLP's silu(gate) * up.
 *
 * Why: torch runs RMSNorm on the CPU as five small ops (pow, mean, add, rsqrt, two multiplies), about 0.1 ms for a
 * row of 1536 values against a few microseconds here, and a layer calls it twice; with quantized weights a step is
 * short enough for that to matter (docs/performance.md). Each row is computed on its own in one fixed order (its sum
 * of squares in 8-wide lanes, then one horizontal sum; silu lane by lane), so a row's result does not depend on the
 * other rows of the call: the batch invariance the lean forward needs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>

#include "_simd.h"

#ifdef SPECDEC_X86
/* out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight, for rows of n values (n a multiple of 8). */
AVX2 static void rms_norm(const float *x, const float *weight, float *out, int64_t rows, int64_t n, float eps) {
    for (int64_t r = 0; r < rows; r++, x += n, out += n) {
        __m256 squares = _mm256_setzero_ps();
        for (int64_t i = 0; i < n; i += 8) {
            const __m256 v = _mm256_loadu_ps(x + i);
            squares = _mm256_fmadd_ps(v, v, squares);
        }
        const float scale = 1.0f / sqrtf(hsum8(squares) / (float)n + eps);
        const __m256 s = _mm256_set1_ps(scale);
        for (int64_t i = 0; i < n; i += 8)
            _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), s), _mm256_loadu_ps(weight + i)));
    }
}

/* out = silu(gate) * up = gate / (1 + exp(-gate)) * up, lane by lane over rows x n values (n a multiple of 8);
 * gate and up are row-strided (a gate|up product's two halves). */
AVX2 static void silu_mul(const float *gate, const float *up, int64_t stride, float *out, int64_t rows, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    for (int64_t r = 0; r < rows; r++, gate += stride, up += stride, out += n)
        for (int64_t i = 0; i < n; i += 8) {
            const __m256 g = _mm256_loadu_ps(gate + i);
            const __m256 sig = _mm256_div_ps(g, _mm256_add_ps(one, exp8(_mm256_sub_ps(zero, g))));
            _mm256_storeu_ps(out + i, _mm256_mul_ps(sig, _mm256_loadu_ps(up + i)));
        }
}
#endif

static int check(long long rows, long long n) {
    if (!specdec_avx2_supported()) {
        PyErr_SetString(PyExc_RuntimeError, "specdec._rowops needs an x86 CPU with AVX2, FMA and F16C");
        return 0;
    }
    if (rows < 0 || n < 8 || n % 8) {
        PyErr_Format(PyExc_ValueError, "rows must be >= 0 and the row width a positive multiple of 8, got %lld x %lld",
                     rows, n);
        return 0;
    }
    return 1;
}

/* rms_norm(x, weight, out, rows, n, eps): addresses of contiguous fp32 buffers; specdec/rowops.py checks them. */
static PyObject *py_rms_norm(PyObject *self, PyObject *args) {
    unsigned long long x, weight, out;
    long long rows, n;
    float eps;
    if (!PyArg_ParseTuple(args, "KKKLLf", &x, &weight, &out, &rows, &n, &eps) || !check(rows, n)) return NULL;
#ifdef SPECDEC_X86
    rms_norm((const float *)(uintptr_t)x, (const float *)(uintptr_t)weight, (float *)(uintptr_t)out, rows, n, eps);
#endif
    Py_RETURN_NONE;
}

/* silu_mul(gate, up, stride, out, rows, n): gate and up rows `stride` floats apart, out contiguous. */
static PyObject *py_silu_mul(PyObject *self, PyObject *args) {
    unsigned long long gate, up, out;
    long long stride, rows, n;
    if (!PyArg_ParseTuple(args, "KKLKLL", &gate, &up, &stride, &out, &rows, &n) || !check(rows, n)) return NULL;
    if (stride < n) {
        PyErr_Format(PyExc_ValueError, "a row stride of %lld floats is shorter than a row of %lld", stride, n);
        return NULL;
    }
#ifdef SPECDEC_X86
    silu_mul((const float *)(uintptr_t)gate, (const float *)(uintptr_t)up, stride, (float *)(uintptr_t)out, rows, n);
#endif
    Py_RETURN_NONE;
}

static PyObject *py_supported(PyObject *self, PyObject *args) { return PyBool_FromLong(specdec_avx2_supported()); }

static PyObject *py_build(PyObject *self, PyObject *args) { return PyUnicode_FromString(SPECDEC_BUILD); }

static PyMethodDef methods[] = {
    {"rms_norm", py_rms_norm, METH_VARARGS, "Per-row RMSNorm, batch-invariant (see the source)."},
    {"silu_mul", py_silu_mul, METH_VARARGS, "silu(gate) * up, lane by lane."},
    {"supported", py_supported, METH_NOARGS, "Whether this CPU can run the kernels (AVX2, FMA, F16C)."},
    {"build", py_build, METH_NOARGS, "The hash of the sources and compile flags this module was built from."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_rowops", NULL, -1, methods};

PyMODINIT_FUNC PyInit__rowops(void) { return PyModule_Create(&module); }
