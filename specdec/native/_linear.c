/* Batch-1 decoding linear layers for x86 CPUs with AVX2 + FMA: y[m][n] = sum_k x[m][k] * w[n][k] (+ b[n]) for the
 * few rows m a decoding step or a verify pass has (1 .. ~16); x, b and y fp32, row-major; the weights as stored (no
 * copy), either fp32 (`linear`) or bfloat16 (`linear_bf16`: each weight widened to fp32 in registers, so a bf16
 * model reads half the bytes without a CPU that has bf16 arithmetic).
 *
 * Why: at batch 1 a linear layer is memory-bound; BLAS libraries read the weights near bandwidth for one row but fall
 * to a third of it for 2-9 rows (they tile for large matrices), so a verify pass over k + 1 positions costs several
 * one-token steps. Here every weight is read from memory once whatever m is: output rows are taken four at a time,
 * and the inputs three at a time (12 accumulators in registers). With more than three inputs the block is walked in
 * K tiles, every input chunk per tile, so that the tile is still in L1 for the second and third chunk and the memory
 * stream (prefetched a kilobyte ahead by the first chunk) never waits for a whole block's extra passes: 3-8% less
 * time than whole-block passes for 5-9 rows (docs/performance.md). Threads split the output rows (OpenMP, the
 * runtime torch uses).
 *
 * Batch invariance: each output y[m][n] is summed in one order that depends on K alone (8-wide lanes along K, tile
 * after tile, one horizontal sum, the scalar tail, then the bias), never on M, on how the inputs are chunked or on
 * which thread computes it. So a row's result is the same bits in a one-token step, in a verify pass of any size
 * and on any thread count (tests/test_native.py checks it bit for bit), and a bf16 weight gives the same bits as
 * its fp32 copy: the widening is exact, and the tail's multiply-adds are fused explicitly (fmaf) as the lanes'
 * are, so the compiler's contraction choices cannot differ between the two kernels. It differs from torch's own
 * product only in the last bits.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>

#include "_simd.h"

#define ROWS 4        /* output rows per block */
#define INS 3         /* input rows per chunk: ROWS x INS accumulators */
#define MAX_CHUNKS 6  /* inputs per pass over the weights: up to MAX_CHUNKS * INS; more take another pass */
#define TILE 128      /* K elements per tile when a block has several input chunks */

#ifdef SPECDEC_X86
/* One block: output rows r0 .. r0 + nr - 1 (nr <= ROWS) against inputs i0 .. i0 + m - 1 (m <= MAX_CHUNKS * INS),
 * split into near-equal chunks of at most INS (4 = 2 + 2, not 3 + 1). One chunk walks K once, prefetching 512
 * bytes ahead; several walk it tile by tile, the first chunk prefetching a kilobyte ahead. Near a row's end the
 * prefetch goes on into the same row of the next block (ROWS rows further), which is read next: without that the
 * start of every row missed (the LM head's product ran at 1.5x its floor instead of 1.0x). The last block's rows
 * prefetch their own row instead: no pointer is ever formed past the weight buffer, even for K < the distance. */
#define DEFINE_BLOCK(SUFFIX, WT)                                                                                     \
    AVX2 static void block_##SUFFIX(const WT *w, const float *x, float *y, int64_t K, int64_t N, int64_t r0, int nr, \
                                    int64_t i0, int m) {                                                             \
        int chunks = (m + INS - 1) / INS, first[MAX_CHUNKS], count[MAX_CHUNKS];                                      \
        for (int c = 0, at = 0; c < chunks; c++) {                                                                   \
            count[c] = (m - at + (chunks - c) - 1) / (chunks - c);                                                   \
            first[c] = at;                                                                                           \
            at += count[c];                                                                                          \
        }                                                                                                            \
        __m256 sums[MAX_CHUNKS][ROWS][INS];                                                                          \
        for (int c = 0; c < chunks; c++)                                                                             \
            for (int r = 0; r < ROWS; r++)                                                                           \
                for (int i = 0; i < INS; i++) sums[c][r][i] = _mm256_setzero_ps();                                   \
        const WT *wr[ROWS], *next[ROWS]; /* next: the row prefetched after wr's end (never past the buffer) */       \
        for (int r = 0; r < ROWS; r++) {                                                                             \
            wr[r] = w + (r0 + (r < nr ? r : 0)) * K;                                                                 \
            next[r] = r0 + ROWS + r < N ? w + (r0 + ROWS + r) * K : wr[r];                                           \
        }                                                                                                            \
        const int64_t K8 = K & ~(int64_t)7, span = chunks == 1 ? K8 : TILE;                                          \
        const int64_t ahead = (chunks == 1 ? 512 : 1024) / (int64_t)sizeof(WT);                                      \
        for (int64_t kt = 0; kt < K8; kt += span) {                                                                  \
            const int64_t ke = kt + span < K8 ? kt + span : K8;                                                      \
            for (int c = 0; c < chunks; c++) {                                                                       \
                const float *xi[INS];                                                                                \
                for (int i = 0; i < INS; i++) xi[i] = x + (i0 + first[c] + (i < count[c] ? i : 0)) * K;              \
                __m256 acc[ROWS][INS];                                                                               \
                for (int r = 0; r < ROWS; r++)                                                                       \
                    for (int i = 0; i < INS; i++) acc[r][i] = sums[c][r][i];                                         \
                for (int64_t k = kt; k < ke; k += 8) {                                                               \
                    __m256 xv[INS];                                                                                  \
                    for (int i = 0; i < INS; i++) xv[i] = _mm256_loadu_ps(xi[i] + k);                                \
                    for (int r = 0; r < ROWS; r++) {                                                                 \
                        if (c == 0) {                                                                                \
                            const int64_t p = k + ahead;                                                             \
                            const WT *at = p < K ? wr[r] + p : next[r] + (p - K < K ? p - K : K - 1);              \
                            _mm_prefetch((const char *)at, _MM_HINT_T0);                                             \
                        }                                                                                            \
                        __m256 wv = load8_##SUFFIX(wr[r] + k);                                                       \
                        for (int i = 0; i < INS; i++) acc[r][i] = _mm256_fmadd_ps(wv, xv[i], acc[r][i]);             \
                    }                                                                                                \
                }                                                                                                    \
                for (int r = 0; r < ROWS; r++)                                                                       \
                    for (int i = 0; i < INS; i++) sums[c][r][i] = acc[r][i];                                         \
            }                                                                                                        \
        }                                                                                                            \
        for (int c = 0; c < chunks; c++)                                                                             \
            for (int r = 0; r < nr; r++)                                                                             \
                for (int i = 0; i < count[c]; i++) {                                                                 \
                    const float *xr = x + (i0 + first[c] + i) * K;                                                   \
                    float s = hsum8(sums[c][r][i]);                                                                   \
                    for (int64_t t = K8; t < K; t++) s = fmaf(value_##SUFFIX(wr[r] + t), xr[t], s);                 \
                    y[(i0 + first[c] + i) * N + r0 + r] = s;                                                         \
                }                                                                                                    \
    }                                                                                                                \
                                                                                                                     \
    static void linear_##SUFFIX(const WT *w, const float *x, const float *b, float *y, int64_t N, int64_t K,         \
                                int64_t M, int threads) {                                                            \
        const int64_t blocks = (N + ROWS - 1) / ROWS, per_pass = MAX_CHUNKS * INS;                                   \
        _Pragma("omp parallel for num_threads(threads) schedule(static)")                                            \
        for (int64_t blk = 0; blk < blocks; blk++) {                                                                 \
            const int64_t r0 = blk * ROWS;                                                                           \
            const int nr = (int)(N - r0 < ROWS ? N - r0 : ROWS);                                                     \
            for (int64_t i0 = 0; i0 < M; i0 += per_pass)                                                             \
                block_##SUFFIX(w, x, y, K, N, r0, nr, i0, (int)(M - i0 < per_pass ? M - i0 : per_pass));             \
            if (b)                                                                                                   \
                for (int64_t i = 0; i < M; i++)                                                                      \
                    for (int r = 0; r < nr; r++) y[i * N + r0 + r] += b[r0 + r];                                     \
        }                                                                                                            \
    }

DEFINE_BLOCK(f32, float)
DEFINE_BLOCK(bf16, uint16_t)
#endif

static int supported(void) { return specdec_avx2_supported(); }

/* Both entry points: (w_ptr, x_ptr, b_ptr or 0, y_ptr, N, K, M, threads), addresses of contiguous buffers. */
static int parse(PyObject *args, unsigned long long *w, unsigned long long *x, unsigned long long *b,
                 unsigned long long *y, long long *N, long long *K, long long *M, int *threads) {
    if (!PyArg_ParseTuple(args, "KKKKLLLi", w, x, b, y, N, K, M, threads)) return 0;
    if (!supported()) {
        PyErr_SetString(PyExc_RuntimeError, "specdec._linear needs an x86 CPU with AVX2 and FMA");
        return 0;
    }
    if (*N < 1 || *K < 1 || *M < 1 || *threads < 1) {
        PyErr_SetString(PyExc_ValueError, "N, K, M and threads must be positive");
        return 0;
    }
    return 1;
}

#define DEFINE_ENTRY(NAME, WT, SUFFIX)                                                                               \
    static PyObject *py_##NAME(PyObject *self, PyObject *args) {                                                     \
        unsigned long long w, x, b, y;                                                                               \
        long long N, K, M;                                                                                           \
        int threads;                                                                                                 \
        if (!parse(args, &w, &x, &b, &y, &N, &K, &M, &threads)) return NULL;                                         \
        Py_BEGIN_ALLOW_THREADS linear_##SUFFIX((const WT *)(uintptr_t)w, (const float *)(uintptr_t)x,                \
                                               (const float *)(uintptr_t)b, (float *)(uintptr_t)y, N, K, M,          \
                                               threads);                                                             \
        Py_END_ALLOW_THREADS Py_RETURN_NONE;                                                                         \
    }

#ifdef SPECDEC_X86
DEFINE_ENTRY(linear, float, f32)
DEFINE_ENTRY(linear_bf16, uint16_t, bf16)
#else
static PyObject *unsupported(PyObject *self, PyObject *args) {
    PyErr_SetString(PyExc_RuntimeError, "specdec._linear needs an x86 CPU with AVX2 and FMA");
    return NULL;
}
#define py_linear unsupported
#define py_linear_bf16 unsupported
#endif

static PyObject *py_supported(PyObject *self, PyObject *args) { return PyBool_FromLong(supported()); }

static PyObject *py_build(PyObject *self, PyObject *args) { return PyUnicode_FromString(SPECDEC_BUILD); }

static PyMethodDef methods[] = {
    {"linear", py_linear, METH_VARARGS, "y = x @ w.T (+ b) for a few rows; w, x, b, y fp32; AVX2 + FMA."},
    {"linear_bf16", py_linear_bf16, METH_VARARGS,
     "y = x @ w.T (+ b) for a few rows; w bfloat16, x, b, y fp32; AVX2 + FMA."},
    {"supported", py_supported, METH_NOARGS, "Whether this CPU can run linear() and linear_bf16()."},
    {"build", py_build, METH_NOARGS, "The hash of the source and compile flags this module was built from."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_linear", NULL, -1, methods};

PyMODINIT_FUNC PyInit__linear(void) { return PyModule_Create(&module); }
