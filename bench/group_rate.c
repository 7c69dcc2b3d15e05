/* The probe bench/group_rate.py builds: one group function's multiply-add rate, alone on one core.

   group_rate TYPE KERNEL MODE NX ROUNDS [REPS]
     TYPE   q4_k q6_k q5_0 q8_0 (the groups of 16 rows: Q4_K_R16, ...)
     KERNEL avx2 avx512-vnni-256 avx512-vnni (group_product_avx2 / _256 / _512)
     MODE   l2 (16 groups of a 1536-wide matrix, 221-340 KB, again and again) or stream (28 layers of 8960 rows)
     NX     inputs a pass (1 .. the type's most)
   Prints "ms_per_pass gmacs" for each of ROUNDS rounds of REPS passes (default 2000 in L2, 2 streaming). The
   weights and inputs are arbitrary quants with normal scales: every byte 0x30-0x3F, so each fp16 and float scale is
   a normal number near 1 (the integers' time does not depend on their values, the floats' does: arbitrary bytes made
   scales subnormal, NaN or infinite, and each such multiply a microcode assist: Q4_K at 5 inputs in L2 ran 91-94 G
   multiply-adds a second on the Intel Xeon against 195 with these). The weights lie on 2 MB pages where Linux gives
   them (madvise, as numpy's allocations of the engine's weights ask): on 4 KB pages a stream's TLB misses cost the
   Xeon a third of its rate (one input 22.1 against 31.7-33.4 G, 5 inputs 90.8 against 132).

   group_rate step-ceiling NX ROUNDS [STEPS]
     The Q4_K AVX2 group step alone (one 256-bit load of eight rows' nibbles, their low and high halves, and per
     input two broadcast quads, two vpmaddubsw and two vpaddw into registers, added in the order written): no
     scales, no mins, no flush, no prefetch, nothing spilled. What the group function's other work costs is the gap
     between its rate and this one. Prints "ns_per_step gmacs" for each of ROUNDS rounds. */
#include "_quant_kernels.h"
#include <stdio.h>
#include <sys/mman.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define K_WIDTH 1536

#define HUGE_PAGE (2u << 20)

/* A multiple of 2 MB, 2 MB-aligned, asked to lie on 2 MB pages (the engine's weights do: numpy's allocations) */
static void *alloc_huge(size_t bytes) {
    const size_t n = (bytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    void *p = aligned_alloc(HUGE_PAGE, n);
#ifdef MADV_HUGEPAGE
    if (p) madvise(p, n, MADV_HUGEPAGE); /* advice: where refused, 4 KB pages */
#endif
    return p;
}

/* An arbitrary quant byte whose fp16 / float pairs and quads are normal numbers near 1 (0x30-0x3F) */
static uint8_t normal_byte(uint64_t i, unsigned multiplier, int shift) {
    return (uint8_t)(((i * multiplier) >> shift & 0x0F) | 0x30);
}

#ifdef SPECDEC_X86
/* NX inputs, eight t-steps a round of `rounds`, the weights cycling through 8 KB of L1 and the inputs through 2 KB */
#define CEILING(NX)                                                                                               \
    TARGET __attribute__((noinline)) static double ceiling_##NX(long rounds, const uint8_t *ws, const uint8_t *xs) { \
        const __m256i m = _mm256_set1_epi8(15);                                                               \
        __m256i lo[NX], hi[NX];                                                                               \
        for (int i = 0; i < NX; i++) lo[i] = hi[i] = _mm256_setzero_si256();                                  \
        const double start = now();                                                                           \
        for (long k = 0; k < rounds; k++) {                                                                   \
            const uint8_t *w = ws + (k & 15) * 512, *x = xs + (k & 3) * 512; /* nothing hoisted */         \
            _Pragma("GCC unroll 8") for (int t = 0; t < 8; t++) {                                              \
                const __m256i v = _mm256_loadu_si256((const __m256i *)(w + 64 * t));                          \
                const __m256i l = _mm256_and_si256(v, m), h = _mm256_and_si256(_mm256_srli_epi16(v, 4), m);   \
                for (int i = 0; i < NX; i++) {                                                                \
                    int32_t a, c;                                                                             \
                    memcpy(&a, x + 64 * i + 4 * t, 4);                                                        \
                    memcpy(&c, x + 64 * i + 32 + 4 * t, 4);                                                   \
                    lo[i] = _mm256_add_epi16(lo[i], _mm256_maddubs_epi16(l, _mm256_set1_epi32(a)));           \
                    hi[i] = _mm256_add_epi16(hi[i], _mm256_maddubs_epi16(h, _mm256_set1_epi32(c)));           \
                    IN_ORDER_256_PAIR(lo[i], hi[i]);                                                          \
                }                                                                                             \
            }                                                                                                 \
        }                                                                                                     \
        const double seconds = now() - start;                                                                 \
        __m256i all = _mm256_setzero_si256();                                                                 \
        for (int i = 0; i < NX; i++) all = _mm256_xor_si256(all, _mm256_xor_si256(lo[i], hi[i]));             \
        volatile int sink = _mm256_extract_epi32(all, 0);                                                     \
        (void)sink;                                                                                           \
        return seconds;                                                                                       \
    }
CEILING(1) CEILING(2) CEILING(3) CEILING(4) CEILING(5) CEILING(6) CEILING(7) CEILING(8)
static double (*const CEILINGS[9])(long, const uint8_t *, const uint8_t *) = {
    NULL, ceiling_1, ceiling_2, ceiling_3, ceiling_4, ceiling_5, ceiling_6, ceiling_7, ceiling_8};
#endif

static int usage(const char *why) {
    fprintf(stderr, "group_rate: %s\n", why);
    return 2;
}

static int step_ceiling(int nx, int rounds, long steps) {
#ifdef SPECDEC_X86
    if (!kernel_supported(KERNEL_AVX2)) return usage("step-ceiling needs AVX2");
    static uint8_t ws[16 * 512 + 512] __attribute__((aligned(64))), xs[4 * 512] __attribute__((aligned(64)));
    for (size_t i = 0; i < sizeof ws; i++) ws[i] = (uint8_t)(i * 2654435761u >> 13);
    for (size_t i = 0; i < sizeof xs; i++) xs[i] = (uint8_t)(i * 40503u >> 7) & 0x7F;
    for (int r = 0; r < rounds; r++) {
        const double seconds = CEILINGS[nx](steps, ws, xs);
        const double macs = (double)steps * 8 * 64 * nx; /* a step: 8 rows x 4 values x 2 halves an input */
        printf("%.6f %.2f\n", seconds / steps / 8 * 1e9, macs / seconds / 1e9); /* ns a step */
    }
    return 0;
#else
    (void)nx, (void)rounds, (void)steps;
    return usage("step-ceiling needs an x86 CPU");
#endif
}

int main(int argc, char **argv) {
    if ((argc == 4 || argc == 5) && !strcmp(argv[1], "step-ceiling")) {
        const int nx = atoi(argv[2]), rounds = atoi(argv[3]);
        const long steps = argc == 5 ? atol(argv[4]) : 2000000;
        if (nx < 1 || nx > 8 || rounds < 1 || steps < 1)
            return usage("step-ceiling NX (1..8) ROUNDS (1 or more) [STEPS (1 or more)]");
        return step_ceiling(nx, rounds, steps);
    }
    if (argc != 6 && argc != 7)
        return usage("usage: group_rate TYPE KERNEL MODE NX ROUNDS [REPS] | group_rate step-ceiling NX ROUNDS [STEPS]");
#ifdef SPECDEC_X86
    const char *types[] = {"q4_k", "q6_k", "q5_0", "q8_0"};
    int type = -1;
    for (int t = 0; t < 4; t++)
        if (!strcmp(argv[1], types[t])) type = Q4_K_R16 + t;
    if (type < 0) return usage("TYPE is one of q4_k q6_k q5_0 q8_0");
    const int kernel = kernel_by_name(argv[2]);
    if (kernel < 0 || kernel == KERNEL_AMX || !kernel_supported(kernel))
        return usage("KERNEL is one of avx2 avx512-vnni-256 avx512-vnni that this CPU runs");
    const int stream = !strcmp(argv[3], "stream");
    if (!stream && strcmp(argv[3], "l2")) return usage("MODE is l2 or stream");
    const int nx = atoi(argv[4]), rounds = atoi(argv[5]);
    const int most = is_k_quant(type) ? R16_K_INPUTS : R16_INPUTS;
    if (nx < 1 || nx > most || rounds < 1) return usage("NX from 1 to the type's inputs a pass; ROUNDS 1 or more");

    const int64_t blocks = K_WIDTH / BLOCK_VALUES[type], group_bytes = blocks * R16 * BLOCK_BYTES[type];
    const int64_t groups = stream ? 28L * 8960 / R16 : 16;
    uint8_t *w = alloc_huge((size_t)(groups * group_bytes));
    const size_t act_bytes = is_k_quant(type) ? sizeof(act_k) : sizeof(act_32);
    uint8_t *acts = alloc_huge(act_bytes * blocks * R16_K_INPUTS);
    if (!w || !acts) return usage("out of memory");
    for (int64_t i = 0; i < groups * group_bytes; i++) w[i] = normal_byte((uint64_t)i, 2654435761u, 13);
    for (size_t i = 0; i < act_bytes * blocks * R16_K_INPUTS; i++) acts[i] = normal_byte(i, 40503u, 7);
    const void *rows[R16_K_INPUTS];
    for (int i = 0; i < R16_K_INPUTS; i++) rows[i] = acts + (size_t)i * act_bytes * blocks;
    void (*product)(int, const uint8_t *, const void **, int, int64_t, int64_t, float *) =
        kernel == KERNEL_AVX2 ? group_product_avx2 : kernel == KERNEL_AVX512_256 ? group_product_256 : group_product_512;
    float out[R16_K_INPUTS * R16];
    double sink = 0;
    const int reps = argc == 7 ? atoi(argv[6]) : stream ? 2 : 2000;
    if (reps < 1) return usage("REPS 1 or more");
    for (int r = 0; r <= rounds; r++) { /* round 0 warms up */
        const double start = now();
        for (int rep = 0; rep < reps; rep++)
            for (int64_t g = 0; g < groups; g++) {
                product(type, w + g * group_bytes, rows, nx, blocks, (groups - g) * blocks, out);
                sink += out[0];
            }
        const double seconds = (now() - start) / reps;
        if (r) printf("%.6f %.2f\n", seconds * 1e3, (double)groups * R16 * K_WIDTH * nx / seconds / 1e9);
    }
    free(w);
    free(acts);
    return sink == 0.5; /* keeps the products */
#else
    return usage("the group functions are x86 code");
#endif
}
