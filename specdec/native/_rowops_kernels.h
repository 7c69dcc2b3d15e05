/* The lean forward's per-row operations in one call each (x86, AVX2 + FMA): RMSNorm and the MLP's silu(gate) * up.
 *
 * Why: torch runs RMSNorm on the CPU as five small ops (pow, mean, add, rsqrt, two multiplies), about 0.1 ms for a
 * row of 1536 values against a few microseconds here, and a layer calls it twice; with quantized weights a step is
 * short enough for that to matter (docs/performance.md). Each row is computed on its own in one fixed order (its sum
 * of squares in 8-wide lanes, then one horizontal sum; silu lane by lane), so a row's result does not depend on the
 * other rows of the call: the batch invariance the lean forward needs.
 */
#ifndef SPECDEC_ROWOPS_KERNELS_H
#define SPECDEC_ROWOPS_KERNELS_H

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

#endif
