/* Batch-invariant causal attention for the few query rows of a decoding step or a verify pass (x86, AVX2 + FMA).
 *
 * out[i][h] = softmax(scale * q[h][i] . k[h'][0..n_i)) . v[h'][0..n_i), where query i of m sits at position
 * L - m + i of the L cached keys (n_i = L - m + i + 1 keys: causal) and h' = h / (H / H_kv) is its key/value head
 * (grouped-query attention).
 *
 * Why: BLAS and torch's attention kernels change their blocking with the number of query rows and keys, so the same
 * position computed in a one-token step and in a verify pass over m positions differs in the last bits (a tiny
 * model: 315 of 315 rows differ). Here every output is computed by one thread, over exactly its own n_i keys, in an
 * order that depends only on n_i and the head size: each dot product in 8-wide lanes along the head dimension then
 * one horizontal sum; the softmax's sum in 8-wide lanes along the keys; the weighted sum of values key by key. So a
 * row's result is the same bits whatever m is, whatever the thread count, and whichever other rows share the call.
 * The query heads that share a key/value head are computed together (up to ATTEND_GROUP_MAX), each key and value
 * loaded once for all of them; each output keeps its own order, so grouping changes no bit.
 * Keys and values may be fp32 or bfloat16 (widened in registers, as in _linear.c); queries and the output are fp32.
 */
#ifndef SPECDEC_ATTENTION_KERNELS_H
#define SPECDEC_ATTENTION_KERNELS_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#ifdef _OPENMP
#include <omp.h>
#endif
#include "_simd.h"

#define MAX_HEAD_DIM 512 /* the output accumulator lives on the stack */

/* Query heads of a group that share each key's and value's load: the scores of 2 keys for 6 heads take 12 of AVX2's
 * 16 registers. A key/value head's cache is read once per group and query row instead of once per query head. */
#define ATTEND_GROUP_MAX 6
/* Floats of scratch a thread needs for a call over L keys: the scores of a group's heads. */
static inline int64_t attend_scratch_floats(int64_t L) { return ATTEND_GROUP_MAX * ((L + 7) & ~(int64_t)7); }

#ifdef SPECDEC_X86
#define ATTEND_PREFETCH_KEYS 8 /* the keys' lines are asked for this many keys ahead (AMD EPYC Zen 4, twelfth run) */
#define ATTEND_ALWAYS_INLINE inline __attribute__((always_inline))

/* p[t] = exp(s[t] - max s) for t < n (zero in the padding lanes up to n rounded to 8), in place after s *= scale;
 * returns 1 / the sum of p in 8-wide lanes along the keys. */
AVX2 static float softmax_weights(float *s, int64_t n, float scale) {
    float mx = -INFINITY;
    for (int64_t t = 0; t < n; t++) {
        s[t] = scale * s[t];
        mx = s[t] > mx ? s[t] : mx;
    }
    const int64_t n8 = (n + 7) & ~(int64_t)7;
    for (int64_t t = n; t < n8; t++) s[t] = mx; /* padding lanes, zeroed below */
    const __m256 vmx = _mm256_set1_ps(mx);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256 total = _mm256_setzero_ps();
    for (int64_t t = 0; t < n8; t += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + t), vmx));
        __m256i live = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - t)), lane);
        e = _mm256_and_ps(e, _mm256_castsi256_ps(live));
        _mm256_storeu_ps(s + t, e);
        total = _mm256_add_ps(total, e);
    }
    return 1.0f / hsum8(total);
}

#define DEFINE_ATTEND(SUFFIX, KT)                                                                                    \
    /* s[j * s_sh + t] = q_j . k_t for the G heads q_j = q + j * q_sh and keys t < n, each dot in 8-wide lanes along  \
     * the head dimension from zero, one horizontal sum, then the tail: the same order whatever G is. Two keys at a  \
     * time share each query load; the keys' lines are asked for ahead, the values' as their keys are read (the      \
     * cache comes from memory: without the hints a thread read it at about 6 GB/s). */                             \
    AVX2 static ATTEND_ALWAYS_INLINE void scores_##SUFFIX(const float *q, int64_t q_sh, const int G, const KT *k,      \
                                                          int64_t k_sp, const KT *v, int64_t v_sp, int64_t n,        \
                                                          int64_t D, float *s, int64_t s_sh) {                       \
        const int64_t D8 = D & ~(int64_t)7, bytes = D * (int64_t)sizeof(KT);                                         \
        int64_t t = 0;                                                                                               \
        for (; t < n; t += 2) {                                                                                      \
            const int two = t + 1 < n;                                                                               \
            for (int j = 0; j <= two; j++) {                                                                         \
                if (t + j + ATTEND_PREFETCH_KEYS < n)                                                                \
                    for (int64_t b = 0; b < bytes; b += 64)                                                          \
                        _mm_prefetch((const char *)(k + (t + j + ATTEND_PREFETCH_KEYS) * k_sp) + b, _MM_HINT_T0);    \
                for (int64_t b = 0; b < bytes; b += 64)                                                              \
                    _mm_prefetch((const char *)(v + (t + j) * v_sp) + b, _MM_HINT_T1);                               \
            }                                                                                                        \
            const KT *k0 = k + t * k_sp, *k1 = two ? k0 + k_sp : k0; /* a lone last key is scored twice */          \
            __m256 a0[ATTEND_GROUP_MAX], a1[ATTEND_GROUP_MAX];                                                       \
            for (int j = 0; j < G; j++) a0[j] = a1[j] = _mm256_setzero_ps();                                         \
            for (int64_t d = 0; d < D8; d += 8) {                                                                    \
                const __m256 x0 = load8_##SUFFIX(k0 + d), x1 = load8_##SUFFIX(k1 + d);                               \
                for (int j = 0; j < G; j++) {                                                                        \
                    const __m256 qj = _mm256_loadu_ps(q + j * q_sh + d);                                             \
                    a0[j] = _mm256_fmadd_ps(qj, x0, a0[j]);                                                          \
                    a1[j] = _mm256_fmadd_ps(qj, x1, a1[j]);                                                          \
                }                                                                                                    \
            }                                                                                                        \
            for (int j = 0; j < G; j++) {                                                                            \
                float u = hsum8(a0[j]), w = hsum8(a1[j]);                                                            \
                for (int64_t d = D8; d < D; d++) {                                                                   \
                    u = fmaf(q[j * q_sh + d], value_##SUFFIX(k0 + d), u);                                            \
                    w = fmaf(q[j * q_sh + d], value_##SUFFIX(k1 + d), w);                                            \
                }                                                                                                    \
                s[j * s_sh + t] = u;                                                                                 \
                if (two) s[j * s_sh + t + 1] = w;                                                                    \
            }                                                                                                        \
        }                                                                                                            \
    }                                                                                                                \
    AVX2 static void scores_any_##SUFFIX(const float *q, int64_t q_sh, int G, const KT *k, int64_t k_sp, const KT *v, \
                                         int64_t v_sp, int64_t n, int64_t D, float *s, int64_t s_sh) {               \
        switch (G) { /* a constant G each: the accumulators stay in registers */                                     \
        case 1: scores_##SUFFIX(q, q_sh, 1, k, k_sp, v, v_sp, n, D, s, s_sh); break;                                 \
        case 2: scores_##SUFFIX(q, q_sh, 2, k, k_sp, v, v_sp, n, D, s, s_sh); break;                                 \
        case 3: scores_##SUFFIX(q, q_sh, 3, k, k_sp, v, v_sp, n, D, s, s_sh); break;                                 \
        case 4: scores_##SUFFIX(q, q_sh, 4, k, k_sp, v, v_sp, n, D, s, s_sh); break;                                 \
        case 5: scores_##SUFFIX(q, q_sh, 5, k, k_sp, v, v_sp, n, D, s, s_sh); break;                                 \
        default: scores_##SUFFIX(q, q_sh, ATTEND_GROUP_MAX, k, k_sp, v, v_sp, n, D, s, s_sh); break;                 \
        }                                                                                                            \
    }                                                                                                                \
                                                                                                                     \
    /* acc[j * a_sh + d] = sum over t < n of p[j * p_sh + t] v[t][d] for G <= 3 heads, key by key from zero (each     \
     * output's order is the same whatever G and D are); CH chunks of 8 values of d at a time share each value load.  \
     * Returns the first d not done. */                                                                              \
    AVX2 static ATTEND_ALWAYS_INLINE int64_t weigh_chunks_##SUFFIX(const float *p, int64_t p_sh, const int G,         \
                                                                   const KT *v, int64_t v_sp, int64_t n, int64_t d0, \
                                                                   int64_t D, const int CH, float *acc, int64_t a_sh) { \
        int64_t c = d0;                                                                                              \
        for (; c + 8 * CH <= D; c += 8 * CH) {                                                                       \
            __m256 r[3][4];                                                                                          \
            for (int j = 0; j < G; j++)                                                                              \
                for (int u = 0; u < CH; u++) r[j][u] = _mm256_setzero_ps();                                          \
            for (int64_t t = 0; t < n; t++) {                                                                        \
                const KT *vt = v + t * v_sp + c;                                                                     \
                __m256 x[4];                                                                                         \
                for (int u = 0; u < CH; u++) x[u] = load8_##SUFFIX(vt + 8 * u);                                      \
                for (int j = 0; j < G; j++) {                                                                        \
                    const __m256 pj = _mm256_set1_ps(p[j * p_sh + t]);                                               \
                    for (int u = 0; u < CH; u++) r[j][u] = _mm256_fmadd_ps(pj, x[u], r[j][u]);                       \
                }                                                                                                    \
            }                                                                                                        \
            for (int j = 0; j < G; j++)                                                                              \
                for (int u = 0; u < CH; u++) _mm256_storeu_ps(acc + j * a_sh + c + 8 * u, r[j][u]);                  \
        }                                                                                                            \
        return c;                                                                                                    \
    }                                                                                                                \
    AVX2 static ATTEND_ALWAYS_INLINE void weigh_values_##SUFFIX(const float *p, int64_t p_sh, const int G,            \
                                                                const KT *v, int64_t v_sp, int64_t n, int64_t D,     \
                                                                float *acc, int64_t a_sh) {                          \
        int64_t d = weigh_chunks_##SUFFIX(p, p_sh, G, v, v_sp, n, 0, D, 4, acc, a_sh);                               \
        d = weigh_chunks_##SUFFIX(p, p_sh, G, v, v_sp, n, d, D, 1, acc, a_sh);                                       \
        for (; d < D; d++)                                                                                           \
            for (int j = 0; j < G; j++) {                                                                            \
                float a = 0.0f;                                                                                      \
                for (int64_t t = 0; t < n; t++) a = fmaf(p[j * p_sh + t], value_##SUFFIX(v + t * v_sp + d), a);      \
                acc[j * a_sh + d] = a;                                                                               \
            }                                                                                                        \
    }                                                                                                                \
                                                                                                                     \
    /* The outputs of G <= ATTEND_GROUP_MAX query heads (q + j * q_sh -> out + j * o_sh) that share one key/value     \
     * head, over its first n keys; s: G x s_sh floats of scratch, s_sh >= n rounded up to 8. */                     \
    AVX2 static void attend_heads_##SUFFIX(const float *q, int64_t q_sh, int G, const KT *k, int64_t k_sp,            \
                                           const KT *v, int64_t v_sp, float *out, int64_t o_sh, int64_t n,           \
                                           int64_t D, float scale, float *s, int64_t s_sh) {                         \
        scores_any_##SUFFIX(q, q_sh, G, k, k_sp, v, v_sp, n, D, s, s_sh);                                            \
        float inv[ATTEND_GROUP_MAX], acc[ATTEND_GROUP_MAX * MAX_HEAD_DIM];                                           \
        for (int j = 0; j < G; j++) inv[j] = softmax_weights(s + j * s_sh, n, scale);                                \
        for (int j = 0; j < G; j += 3) {                                                                             \
            const float *p = s + j * s_sh;                                                                           \
            if (G - j >= 3)                                                                                          \
                weigh_values_##SUFFIX(p, s_sh, 3, v, v_sp, n, D, acc + j * D, D);                                    \
            else if (G - j == 2)                                                                                     \
                weigh_values_##SUFFIX(p, s_sh, 2, v, v_sp, n, D, acc + j * D, D);                                    \
            else                                                                                                     \
                weigh_values_##SUFFIX(p, s_sh, 1, v, v_sp, n, D, acc + j * D, D);                                    \
        }                                                                                                            \
        for (int j = 0; j < G; j++)                                                                                  \
            for (int64_t d = 0; d < D; d++) out[j * o_sh + d] = acc[j * D + d] * inv[j];                             \
    }                                                                                                                \
                                                                                                                     \
    /* scratch: attend_scratch_floats(L) floats a thread (per_thread apart). Tasks are (key/value head, part of its   \
     * query heads, query row); a group is split into more parts only where there are fewer tasks than threads. */   \
    static void attend_##SUFFIX(const float *q, int64_t q_sh, int64_t q_sp, const KT *k, int64_t k_sh, int64_t k_sp, \
                                const KT *v, int64_t v_sh, int64_t v_sp, float *out, int64_t o_sh, int64_t o_sp,     \
                                int64_t H, int64_t Hkv, int64_t M, int64_t L, int64_t D, float scale, int threads,   \
                                float *scratch, int64_t per_thread) {                                                \
        const int64_t group = H / Hkv;                                                                               \
        int64_t parts = (group + ATTEND_GROUP_MAX - 1) / ATTEND_GROUP_MAX;                                           \
        const int64_t wanted = (threads + Hkv * M - 1) / (Hkv * M);                                                  \
        if (wanted > parts) parts = wanted < group ? wanted : group;                                                 \
        const int64_t size = (group + parts - 1) / parts;                                                            \
        parts = (group + size - 1) / size;                                                                           \
        _Pragma("omp parallel for num_threads(threads) schedule(static)")                                            \
        for (int64_t task = 0; task < Hkv * parts * M; task++) {                                                     \
            const int64_t i = task % M, kv = task / M / parts, part = task / M % parts;                              \
            const int64_t h0 = kv * group + part * size, G = group - part * size < size ? group - part * size : size; \
            const int64_t n = L - M + i + 1;                                                                         \
            int thread = 0;                                                                                          \
            _OMP_THREAD(thread);                                                                                     \
            attend_heads_##SUFFIX(q + h0 * q_sh + i * q_sp, q_sh, (int)G, k + kv * k_sh, k_sp, v + kv * v_sh, v_sp,  \
                                  out + h0 * o_sh + i * o_sp, o_sh, n, D, scale, scratch + thread * per_thread,      \
                                  (n + 7) & ~(int64_t)7);                                                            \
        }                                                                                                            \
    }

#ifdef _OPENMP
#define _OMP_THREAD(t) (t) = omp_get_thread_num()
#else
#define _OMP_THREAD(t) (void)(t)
#endif

DEFINE_ATTEND(f32, float)
DEFINE_ATTEND(bf16, uint16_t)
#endif

#endif
