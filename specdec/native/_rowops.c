/* specdec._rowops: the Python face of the per-row operations (specdec/_rowops_kernels.h); specdec/rowops.py
 * checks every tensor before a call. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "_rowops_kernels.h"

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
