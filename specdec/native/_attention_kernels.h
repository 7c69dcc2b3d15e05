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

#ifdef SPECDEC_X86
#define DEFINE_ATTEND(SUFFIX, KT)                                                                                    \
    AVX2 static float dot_##SUFFIX(const float *q, const KT *k, int64_t D) {                                         \
        __m256 acc = _mm256_setzero_ps();                                                                            \
        const int64_t D8 = D & ~(int64_t)7;                                                                          \
        for (int64_t d = 0; d < D8; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), load8_##SUFFIX(k + d), acc); \
        float s = hsum8(acc);                                                                                         \
        for (int64_t d = D8; d < D; d++) s = fmaf(q[d], value_##SUFFIX(k + d), s);                                   \
        return s;                                                                                                    \
    }                                                                                                                \
                                                                                                                     \
    /* dot_() of q with four keys k_sp apart, each in dot_()'s own order (the same bits): four independent chains    \
     * instead of one, which waited on each multiply-add's latency (AMD EPYC Zen 4: experiments/cpu-lead, seventh     \
     * run) */                                                                                                       \
    AVX2 static void dot4_##SUFFIX(const float *q, const KT *k, int64_t k_sp, int64_t D, float *s4) {                \
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};     \
        const int64_t D8 = D & ~(int64_t)7;                                                                          \
        for (int64_t d = 0; d < D8; d += 8) {                                                                        \
            const __m256 qd = _mm256_loadu_ps(q + d);                                                                \
            for (int j = 0; j < 4; j++) acc[j] = _mm256_fmadd_ps(qd, load8_##SUFFIX(k + j * k_sp + d), acc[j]);    \
        }                                                                                                            \
        for (int j = 0; j < 4; j++) {                                                                                \
            float s = hsum8(acc[j]);                                                                                 \
            for (int64_t d = D8; d < D; d++) s = fmaf(q[d], value_##SUFFIX(k + j * k_sp + d), s);                    \
            s4[j] = s;                                                                                               \
        }                                                                                                            \
    }                                                                                                                \
                                                                                                                     \
    /* acc[d] = sum over the n keys of p[t] v[t][d], key by key from zero (the order of every output value is the    \
     * same whatever D is) */                                                                                        \
    AVX2 static void weigh_values_##SUFFIX(const float *p, const KT *v, int64_t v_sp, int64_t n, int64_t D,          \
                                           float *acc) {                                                             \
        const int64_t D8 = D & ~(int64_t)7;                                                                          \
        for (int64_t d = 0; d < D; d++) acc[d] = 0.0f;                                                               \
        for (int64_t t = 0; t < n; t++) {                                                                            \
            const KT *vt = v + t * v_sp;                                                                             \
            const __m256 pt = _mm256_set1_ps(p[t]);                                                                  \
            for (int64_t d = 0; d < D8; d += 8)                                                                      \
                _mm256_storeu_ps(acc + d, _mm256_fmadd_ps(pt, load8_##SUFFIX(vt + d), _mm256_loadu_ps(acc + d)));    \
            for (int64_t d = D8; d < D; d++) acc[d] = fmaf(p[t], value_##SUFFIX(vt + d), acc[d]);                     \
        }                                                                                                            \
    }                                                                                                                \
    /* The same for D = 8 x chunks (a constant where inlined): the sums in registers rather than a load and a store   \
     * per key and value, the same operations in the same order */                                                  \
    AVX2 static inline __attribute__((always_inline)) void weigh_values_in_registers_##SUFFIX(                       \
        const float *p, const KT *v, int64_t v_sp, int64_t n, const int chunks, float *acc) {                        \
        __m256 r[16];                                                                                                \
        for (int c = 0; c < chunks; c++) r[c] = _mm256_setzero_ps();                                                 \
        for (int64_t t = 0; t < n; t++) {                                                                            \
            const KT *vt = v + t * v_sp;                                                                             \
            const __m256 pt = _mm256_set1_ps(p[t]);                                                                  \
            for (int c = 0; c < chunks; c++) r[c] = _mm256_fmadd_ps(pt, load8_##SUFFIX(vt + 8 * c), r[c]);          \
        }                                                                                                            \
        for (int c = 0; c < chunks; c++) _mm256_storeu_ps(acc + 8 * c, r[c]);                                        \
    }                                                                                                                \
    AVX2 static void weigh_values_any_##SUFFIX(const float *p, const KT *v, int64_t v_sp, int64_t n, int64_t D,      \
                                               float *acc) {                                                         \
        if (D == 128)                                                                                                \
            weigh_values_in_registers_##SUFFIX(p, v, v_sp, n, 16, acc);                                              \
        else if (D == 64)                                                                                            \
            weigh_values_in_registers_##SUFFIX(p, v, v_sp, n, 8, acc);                                               \
        else                                                                                                         \
            weigh_values_##SUFFIX(p, v, v_sp, n, D, acc);                                                            \
    }                                                                                                                \
                                                                                                                     \
    /* One (head, query) output; s: n rounded up to 8 floats of scratch. */                                          \
    AVX2 static void attend_one_##SUFFIX(const float *q, const KT *k, int64_t k_sp, const KT *v, int64_t v_sp,       \
                                         float *out, int64_t n, int64_t D, float scale, float *s) {                  \
        float mx = -INFINITY;                                                                                        \
        int64_t n4 = 0;                                                                                              \
        for (; n4 + 4 <= n; n4 += 4) dot4_##SUFFIX(q, k + n4 * k_sp, k_sp, D, s + n4);                               \
        for (int64_t t = n4; t < n; t++) s[t] = dot_##SUFFIX(q, k + t * k_sp, D);                                    \
        for (int64_t t = 0; t < n; t++) {                                                                            \
            s[t] = scale * s[t];                                                                                     \
            mx = s[t] > mx ? s[t] : mx;                                                                              \
        }                                                                                                            \
        const int64_t n8 = (n + 7) & ~(int64_t)7;                                                                    \
        for (int64_t t = n; t < n8; t++) s[t] = mx; /* padding lanes, zeroed below */                                \
        const __m256 vmx = _mm256_set1_ps(mx);                                                                       \
        const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);                                              \
        __m256 total = _mm256_setzero_ps();                                                                          \
        for (int64_t t = 0; t < n8; t += 8) {                                                                        \
            __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + t), vmx));                                             \
            __m256i live = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - t)), lane);                                \
            e = _mm256_and_ps(e, _mm256_castsi256_ps(live));                                                         \
            _mm256_storeu_ps(s + t, e);                                                                              \
            total = _mm256_add_ps(total, e);                                                                         \
        }                                                                                                            \
        float acc[MAX_HEAD_DIM];                                                                                     \
        weigh_values_any_##SUFFIX(s, v, v_sp, n, D, acc);                                                          \
        const float inv = 1.0f / hsum8(total);                                                                        \
        for (int64_t d = 0; d < D; d++) out[d] = acc[d] * inv;                                                       \
    }                                                                                                                \
                                                                                                                     \
    static void attend_##SUFFIX(const float *q, int64_t q_sh, int64_t q_sp, const KT *k, int64_t k_sh, int64_t k_sp, \
                                const KT *v, int64_t v_sh, int64_t v_sp, float *out, int64_t o_sh, int64_t o_sp,     \
                                int64_t H, int64_t Hkv, int64_t M, int64_t L, int64_t D, float scale, int threads,   \
                                float *scratch, int64_t per_thread) {                                                \
        const int64_t group = H / Hkv;                                                                               \
        _Pragma("omp parallel for num_threads(threads) schedule(static)")                                            \
        for (int64_t task = 0; task < H * M; task++) {                                                               \
            const int64_t h = task / M, i = task % M, kv = h / group;                                                \
            int thread = 0;                                                                                          \
            _OMP_THREAD(thread);                                                                                     \
            attend_one_##SUFFIX(q + h * q_sh + i * q_sp, k + kv * k_sh, k_sp, v + kv * v_sh, v_sp,                   \
                                out + h * o_sh + i * o_sp, L - M + i + 1, D, scale, scratch + thread * per_thread);  \
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
