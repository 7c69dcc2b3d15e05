/* A batch-1 decoding linear layer for x86 CPUs with AVX2 + FMA: y[m][n] = sum_k x[m][k] * w[n][k] (+ b[n]) for
 * the few rows m a decoding step or a verify pass has (1 .. ~16), fp32, row-major, weights as stored (no copy).
 *
 * Why: at batch 1 a linear layer is memory-bound; BLAS libraries read the weights near bandwidth for one row but fall
 * to a third of it for 2-9 rows (they tile for large matrices), so a verify pass over k + 1 positions costs several
 * one-token steps. Here every weight is read from memory once whatever m is: output rows are taken four at a time,
 * and the inputs three at a time (12 accumulators in registers); the 4 x K weight block read by the first input
 * chunk is still in L2 for the next ones. Threads split the output rows (OpenMP, the runtime torch uses).
 *
 * Exactness is not at stake: this computes the same product as torch in another summation order (differences in
 * the last bits; the study's greedy check diagnoses near-ties, see docs/method.md).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define SPECDEC_X86 1
#endif

#define ROWS 4   /* output rows per block */
#define INS 3    /* input rows per chunk: ROWS x INS accumulators */

#ifdef SPECDEC_X86
__attribute__((target("avx2,fma"))) static inline float hsum(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

/* One block: rows r0 .. r0 + nr - 1 (nr <= ROWS) against inputs i0 .. i0 + ni - 1 (ni <= INS). */
__attribute__((target("avx2,fma"))) static void block(const float *w, const float *x, float *y, int64_t K,
                                                     int64_t N, int64_t r0, int nr, int64_t i0, int ni) {
    __m256 acc[ROWS][INS];
    for (int r = 0; r < ROWS; r++)
        for (int i = 0; i < INS; i++) acc[r][i] = _mm256_setzero_ps();
    const float *wr[ROWS], *xi[INS];
    for (int r = 0; r < ROWS; r++) wr[r] = w + (r0 + (r < nr ? r : 0)) * K;
    for (int i = 0; i < INS; i++) xi[i] = x + (i0 + (i < ni ? i : 0)) * K;
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 xv[INS];
        for (int i = 0; i < INS; i++) xv[i] = _mm256_loadu_ps(xi[i] + k);
        for (int r = 0; r < ROWS; r++) {
            _mm_prefetch((const char *)(wr[r] + k + 128), _MM_HINT_T0);
            __m256 wv = _mm256_loadu_ps(wr[r] + k);
            for (int i = 0; i < INS; i++) acc[r][i] = _mm256_fmadd_ps(wv, xv[i], acc[r][i]);
        }
    }
    for (int r = 0; r < nr; r++)
        for (int i = 0; i < ni; i++) {
            float s = hsum(acc[r][i]);
            for (int64_t t = k; t < K; t++) s += wr[r][t] * xi[i][t];
            y[(i0 + i) * N + r0 + r] = s;
        }
}

static void linear_avx2(const float *w, const float *x, const float *b, float *y, int64_t N, int64_t K,
                        int64_t M, int threads) {
    int64_t blocks = (N + ROWS - 1) / ROWS;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t blk = 0; blk < blocks; blk++) {
        int64_t r0 = blk * ROWS;
        int nr = (int)(N - r0 < ROWS ? N - r0 : ROWS);
        /* inputs in ceil(M / INS) chunks of near-equal size: 4 = 2 + 2, not 3 + 1 */
        int64_t chunks = (M + INS - 1) / INS;
        for (int64_t c = 0, i0 = 0; c < chunks; c++) {
            int ni = (int)((M - i0 + (chunks - c) - 1) / (chunks - c));
            block(w, x, y, K, N, r0, nr, i0, ni);
            i0 += ni;
        }
        if (b)
            for (int64_t i = 0; i < M; i++)
                for (int r = 0; r < nr; r++) y[i * N + r0 + r] += b[r0 + r];
    }
}
#endif

static int supported(void) {
#ifdef SPECDEC_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

/* linear(w_ptr, x_ptr, b_ptr or 0, y_ptr, N, K, M, threads): addresses of contiguous fp32 buffers. */
static PyObject *py_linear(PyObject *self, PyObject *args) {
    unsigned long long w, x, b, y;
    long long N, K, M;
    int threads;
    if (!PyArg_ParseTuple(args, "KKKKLLLi", &w, &x, &b, &y, &N, &K, &M, &threads)) return NULL;
    if (!supported()) {
        PyErr_SetString(PyExc_RuntimeError, "specdec._linear needs an x86 CPU with AVX2 and FMA");
        return NULL;
    }
    if (N < 1 || K < 1 || M < 1 || threads < 1) {
        PyErr_SetString(PyExc_ValueError, "N, K, M and threads must be positive");
        return NULL;
    }
#ifdef SPECDEC_X86
    Py_BEGIN_ALLOW_THREADS
    linear_avx2((const float *)(uintptr_t)w, (const float *)(uintptr_t)x, (const float *)(uintptr_t)b,
                (float *)(uintptr_t)y, N, K, M, threads);
    Py_END_ALLOW_THREADS
#endif
    Py_RETURN_NONE;
}

static PyObject *py_supported(PyObject *self, PyObject *args) { return PyBool_FromLong(supported()); }

static PyMethodDef methods[] = {
    {"linear", py_linear, METH_VARARGS, "y = x @ w.T (+ b) for a few rows, fp32, AVX2 + FMA."},
    {"supported", py_supported, METH_NOARGS, "Whether this CPU can run linear()."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_linear", NULL, -1, methods};

PyMODINIT_FUNC PyInit__linear(void) { return PyModule_Create(&module); }
