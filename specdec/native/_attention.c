/* specdec._attention: the Python face of the batch-invariant attention (specdec/_attention_kernels.h);
 * specdec/attention.py checks every tensor before a call. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "_attention_kernels.h"

static int supported(void) { return specdec_avx2_supported(); }

/* attention(q, q_sh, q_sp, k, k_sh, k_sp, v, v_sh, v_sp, out, o_sh, o_sp, H, Hkv, M, L, D, scale, threads, bf16):
 * addresses and element strides (head, position; the head dimension is contiguous). specdec/attention.py checks
 * every tensor before the call; here only what C itself needs. */
static PyObject *py_attention(PyObject *self, PyObject *args) {
    unsigned long long q, k, v, out;
    long long q_sh, q_sp, k_sh, k_sp, v_sh, v_sp, o_sh, o_sp, H, Hkv, M, L, D;
    float scale;
    int threads, bf16;
    if (!PyArg_ParseTuple(args, "KLLKLLKLLKLLLLLLLfip", &q, &q_sh, &q_sp, &k, &k_sh, &k_sp, &v, &v_sh, &v_sp, &out,
                          &o_sh, &o_sp, &H, &Hkv, &M, &L, &D, &scale, &threads, &bf16))
        return NULL;
    if (!supported()) {
        PyErr_SetString(PyExc_RuntimeError, "specdec._attention needs an x86 CPU with AVX2 and FMA");
        return NULL;
    }
    if (H < 1 || Hkv < 1 || H % Hkv || M < 1 || L < M || D < 1 || D > MAX_HEAD_DIM || threads < 1) {
        PyErr_Format(PyExc_ValueError, "bad attention sizes: H %lld, H_kv %lld, m %lld, L %lld, D %lld (max %d), "
                     "threads %d", H, Hkv, M, L, D, MAX_HEAD_DIM, threads);
        return NULL;
    }
#ifdef SPECDEC_X86
    const int64_t per_thread = attend_scratch_floats(L);
    float *scratch = malloc(sizeof(float) * per_thread * threads);
    if (!scratch) return PyErr_NoMemory();
    Py_BEGIN_ALLOW_THREADS
    if (bf16)
        attend_bf16((const float *)(uintptr_t)q, q_sh, q_sp, (const uint16_t *)(uintptr_t)k, k_sh, k_sp,
                    (const uint16_t *)(uintptr_t)v, v_sh, v_sp, (float *)(uintptr_t)out, o_sh, o_sp, H, Hkv, M, L, D,
                    scale, threads, scratch, per_thread);
    else
        attend_f32((const float *)(uintptr_t)q, q_sh, q_sp, (const float *)(uintptr_t)k, k_sh, k_sp,
                   (const float *)(uintptr_t)v, v_sh, v_sp, (float *)(uintptr_t)out, o_sh, o_sp, H, Hkv, M, L, D,
                   scale, threads, scratch, per_thread);
    Py_END_ALLOW_THREADS
    free(scratch);
    Py_RETURN_NONE;
#else
    return NULL;
#endif
}

static PyObject *py_supported(PyObject *self, PyObject *args) { return PyBool_FromLong(supported()); }

static PyObject *py_build(PyObject *self, PyObject *args) { return PyUnicode_FromString(SPECDEC_BUILD); }

static PyMethodDef methods[] = {
    {"attention", py_attention, METH_VARARGS, "Causal attention of m query rows over L cached keys (see the source)."},
    {"supported", py_supported, METH_NOARGS, "Whether this CPU can run attention()."},
    {"build", py_build, METH_NOARGS, "The hash of the source and compile flags this module was built from."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_attention", NULL, -1, methods};

PyMODINIT_FUNC PyInit__attention(void) { return PyModule_Create(&module); }
