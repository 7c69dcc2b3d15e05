/* Small AVX2 helpers shared by specdec's native modules (included, not a module of its own; part of every module's
 * build id, specdec/native_build.py). Every helper works lane by lane or in one fixed order, so the modules' results
 * do not depend on how many rows share a call. */
#ifndef SPECDEC_SIMD_H
#define SPECDEC_SIMD_H

#include <stdint.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define SPECDEC_X86 1
#define AVX2 __attribute__((target("avx2,fma,f16c")))

/* An integer sum kept in the order written: after each step's vpaddw / vpaddd into `v` (a 256-bit register), an empty
 * asm that says it changed `v`. Without it GCC reassociates such chains across unrolled steps, forming every step's
 * products first and adding them as a tree, all live at once: on AVX2's 16 registers, spills (the quantised group
 * functions from four inputs on; _quant_groups.h gives the measurements). No instruction is emitted, and an integer
 * sum has the same value in any order. */
#define IN_ORDER_256(v) __asm__("" : "+x"(v))
#define IN_ORDER_256_PAIR(a, b) __asm__("" : "+x"(a), "+x"(b)) /* two sums, one statement */

/* The sum of 8 lanes, always in the same order. */
AVX2 static inline float hsum8(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

/* Eight values as fp32, and one value as a float, for each stored type (bf16 is the top half of an fp32). */
AVX2 static inline __m256 load8_f32(const float *p) { return _mm256_loadu_ps(p); }
AVX2 static inline __m256 load8_bf16(const uint16_t *p) {
    __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
static inline float value_f32(const float *p) { return *p; }
static inline float value_bf16(const uint16_t *p) {
    union { uint32_t u; float f; } v = {.u = (uint32_t)*p << 16};
    return v.f;
}

/* exp(x) lane by lane (Cephes' single-precision polynomial, ~1 ulp; inputs clamped to +-88.38). Each lane's result
 * depends on its own input only. */
AVX2 static inline __m256 exp8(__m256 x) {
    x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f)), _mm256_set1_ps(-88.3762626647949f));
    __m256 fx = _mm256_floor_ps(_mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                              _mm256_set1_ps(0.5f)));
    x = _mm256_sub_ps(x, _mm256_mul_ps(fx, _mm256_set1_ps(0.693359375f)));
    x = _mm256_sub_ps(x, _mm256_mul_ps(fx, _mm256_set1_ps(-2.12194440e-4f)));
    __m256 z = _mm256_mul_ps(x, x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_add_ps(_mm256_fmadd_ps(y, z, x), _mm256_set1_ps(1.0f));
    __m256i n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(n));
}
#endif

/* Whether this CPU runs the AVX2 code (with FMA and F16C). */
static inline int specdec_avx2_supported(void) {
#ifdef SPECDEC_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
    return 0;
#endif
}

#endif
