/* Q6_K's top four bits, with a bound: a cheap first pass of an exact greedy LM head (specdec/gguf/argmax_head.py).
 *
 * A Q6_K value is d x scale x (q - 32) with q = 4 hi + lo (hi 0..15, lo 0..3) and one int8 scale per 16 values.
 * Q6_K_HI4 keeps d, the 16 scales and hi: 146 bytes a block of 256 values against 210 (d at 0, the scales at 2..17,
 * value j's hi in byte 18 + j mod 128, the low nibble for j < 128). Its value stands lo at 1.5, the middle of 0..3:
 * d x scale x (4 hi + 1.5 - 32), so it is within 1.5 |d x scale| of the Q6_K value, element by element.
 *
 * For an activation row quantised as the Q6_K product quantises it (quantize_row_k: int8 a, one float da a block),
 * the approximate output of a row is sum over blocks of d x da x I / 2, I = sum over 16s of scale x (8 hi.a - 61
 * sum a) (integers, exact in any order), and its bound sum over blocks of 1.5 |d x da| x sum over 16s |scale| x
 * sum |a|. The Q6_K product's output lies within the bound of the approximate one, up to float rounding: both sums'
 * terms are at most 32 / 1.5 times the bound's, and each is rounded a dozen times at 2^-24, so hi4_candidates widens
 * the bound by a margin (argmax_head.BOUND_MARGIN, 2^-10 of itself: 60 times more than the rounding can move either
 * sum). hi4_exact_rows then computes the candidate rows' Q6_K products. The float epilogue
 * runs in one order (lanes, then blocks, then hsum8): a row's outputs are the same bits whatever rows share the call
 * and on any thread count, on either variant below (maddubs + madd with AVX2; maddubs + vpdpwssd with AVX-512 VNNI on
 * 256-bit registers). */
#ifndef SPECDEC_QUANT_HI4_H
#define SPECDEC_QUANT_HI4_H

#define HI4_BLOCK_BYTES 146

/* The sums of |a| over every 16 of an input block's quants (the bound's), as int16 (at most 16 x 127). */
typedef struct {
    int16_t l1[16];
} act_l1;

static void hi4_l1(const act_k *a, act_l1 *l, int64_t blocks) {
    for (int64_t b = 0; b < blocks; b++)
        for (int j = 0; j < 16; j++) {
            int s = 0;
            for (int i = 0; i < 16; i++) s += abs(a[b].q[16 * j + i]);
            l[b].l1[j] = (int16_t)s;
        }
}

/* A Q6_K row's blocks (w, 210 bytes each) as Q6_K_HI4 blocks (o, 146 bytes each). */
static void hi4_pack_row(const uint8_t *w, uint8_t *o, int64_t blocks) {
    for (int64_t b = 0; b < blocks; b++, w += 210, o += HI4_BLOCK_BYTES) {
        memcpy(o, w + 208, 2);
        memcpy(o + 2, w + 192, 16);
        memset(o + 18, 0, 128);
        for (int j = 0; j < QK; j++) o[18 + j % 128] |= (uint8_t)((q6k_quant(w, j) >> 2) << (j < 128 ? 0 : 4));
    }
}

/* Scales 2c and 2c + 1 of the eight in each 128-bit half of `scales` (int16, both halves the same eight): the first
 * over int16 lanes 0-7, the second over 8-15 (the pair sums of their 16 values). */
TARGET static inline __attribute__((always_inline)) __m256i hi4_scale_pair(__m256i scales, int c) {
    const __m256i pick = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3,
                                          2, 3, 2, 3, 2, 3);
    return _mm256_shuffle_epi8(scales, _mm256_add_epi8(pick, _mm256_set1_epi8((char)(4 * c))));
}

/* M input rows of K values quantised as the Q6_K product quantises them (quantize_row_k), K / 256 blocks a row, in
 * one allocation (the caller frees it); NULL where memory ran out. */
TARGET static act_k *hi4_quantize_inputs(const float *x, int64_t M, int64_t K) {
    act_k *acts = malloc(sizeof(act_k) * (K / QK) * M);
    for (int64_t i = 0; acts && i < M; i++) quantize_row_k(x + i * K, acts + i * (K / QK), K);
    return acts;
}

/* One weight row against nx (at most GROUPN) inputs: approx[i] and bound[i] (the bound before the margin). MADD(acc,
 * p, s): acc plus the int16 pairs p times the scales s, pairwise summed (exact integers either way). The 8 of 8 hi
 * rides on the scales (8 x 128 and the pair sums' 2 x 15 x 127 stay in int16; a block's lanes under 2^27). */
#define HI4_ROW(NAME, ISA, GROUPN, MADD)                                                                            \
    ISA static inline __attribute__((always_inline)) void NAME(const uint8_t *w, const act_k *const *x,            \
                                                               const act_l1 *const *l, const int nx,               \
                                                               int64_t blocks, int64_t left, float *approx,        \
                                                               float *bound) {                                     \
        const __m256i low4 = _mm256_set1_epi8(0x0F);                                                                \
        __m256 acc[GROUPN], lim[GROUPN];                                                                            \
        for (int i = 0; i < nx; i++) acc[i] = lim[i] = _mm256_setzero_ps();                                         \
        for (int64_t b = 0; b < blocks; b++, w += HI4_BLOCK_BYTES, left -= HI4_BLOCK_BYTES) {                      \
            row_prefetch(w, HI4_BLOCK_BYTES, left);                                                                 \
            const float d = half(w);                                                                                \
            const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + 2)));                  \
            const __m256i sc8 = _mm256_slli_epi16(sc16, 3);                                                         \
            /* piece c's low nibbles (values 32c..32c+31) take scales 2c, 2c+1, its high nibbles (values 128 +      \
             * 32c..) scales 8 + 2c, 9 + 2c */                                                                      \
            const __m256i first8 = _mm256_permute4x64_epi64(sc8, 0x44), last8 = _mm256_permute4x64_epi64(sc8, 0xEE); \
            __m256i total[GROUPN];                                                                                  \
            const __m256i offset = _mm256_mullo_epi16(sc16, _mm256_set1_epi16(-61));                                \
            for (int i = 0; i < nx; i++) /* -61 x scale x (the sum of 16 quants), first */                          \
                total[i] = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)x[i][b].sums), offset);            \
            for (int c = 0; c < 4; c++) {                                                                           \
                const __m256i packed = _mm256_loadu_si256((const __m256i *)(w + 18 + 32 * c));                      \
                const __m256i lo = _mm256_and_si256(packed, low4);                                                  \
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low4);                            \
                const __m256i s_a = hi4_scale_pair(first8, c), s_b = hi4_scale_pair(last8, c);                      \
                for (int i = 0; i < nx; i++) {                                                                      \
                    const int8_t *q = x[i][b].q;                                                                    \
                    const __m256i qa = _mm256_loadu_si256((const __m256i *)(q + 32 * c));                           \
                    const __m256i qb = _mm256_loadu_si256((const __m256i *)(q + 128 + 32 * c));                     \
                    total[i] = MADD(total[i], _mm256_maddubs_epi16(lo, qa), s_a);                                   \
                    total[i] = MADD(total[i], _mm256_maddubs_epi16(hi, qb), s_b);                                   \
                }                                                                                                   \
            }                                                                                                       \
            const __m256i abs16 = _mm256_abs_epi16(sc16);                                                           \
            for (int i = 0; i < nx; i++) {                                                                          \
                const float dd = d * x[i][b].d;                                                                     \
                acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(dd), _mm256_cvtepi32_ps(total[i]), acc[i]);                 \
                const __m256i l1 = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)l[i][b].l1), abs16);      \
                lim[i] = _mm256_fmadd_ps(_mm256_set1_ps(fabsf(dd)), _mm256_cvtepi32_ps(l1), lim[i]);                \
            }                                                                                                       \
        }                                                                                                           \
        for (int i = 0; i < nx; i++) approx[i] = 0.5f * hsum8(acc[i]), bound[i] = 1.5f * hsum8(lim[i]);            \
    }

#define HI4_MADD_AVX2(acc, p, s) _mm256_add_epi32(acc, _mm256_madd_epi16(p, s))
#define HI4_MADD_VNNI(acc, p, s) _mm256_dpwssd_epi32(acc, p, s)
HI4_ROW(hi4_row_avx2, TARGET, GROUP, HI4_MADD_AVX2)
HI4_ROW(hi4_row_vnni, TARGET512, GROUP512, HI4_MADD_VNNI)

/* The row functions with nx fixed at compile time (registers, not arrays in memory), as SPECIALISE does. */
typedef void (*hi4_row_fn)(const uint8_t *, const act_k *const *, const act_l1 *const *, int64_t, int64_t, float *,
                           float *);
#define HI4_FN(NAME, ISA, N)                                                                                        \
    ISA static void NAME##_##N(const uint8_t *w, const act_k *const *x, const act_l1 *const *l, int64_t blocks,    \
                               int64_t left, float *approx, float *bound) {                                        \
        NAME(w, x, l, N, blocks, left, approx, bound);                                                              \
    }
HI4_FN(hi4_row_avx2, TARGET, 1) HI4_FN(hi4_row_avx2, TARGET, 2) HI4_FN(hi4_row_avx2, TARGET, 3)
HI4_FN(hi4_row_avx2, TARGET, 4)
HI4_FN(hi4_row_vnni, TARGET512, 1) HI4_FN(hi4_row_vnni, TARGET512, 2) HI4_FN(hi4_row_vnni, TARGET512, 3)
HI4_FN(hi4_row_vnni, TARGET512, 4) HI4_FN(hi4_row_vnni, TARGET512, 5) HI4_FN(hi4_row_vnni, TARGET512, 6)
HI4_FN(hi4_row_vnni, TARGET512, 7) HI4_FN(hi4_row_vnni, TARGET512, 8)
static const hi4_row_fn hi4_avx2_for[GROUP + 1] = {NULL, hi4_row_avx2_1, hi4_row_avx2_2, hi4_row_avx2_3,
                                                   hi4_row_avx2_4};
static const hi4_row_fn hi4_vnni_for[GROUP512 + 1] = {NULL, hi4_row_vnni_1, hi4_row_vnni_2, hi4_row_vnni_3,
                                                      hi4_row_vnni_4, hi4_row_vnni_5, hi4_row_vnni_6,
                                                      hi4_row_vnni_7, hi4_row_vnni_8};

/* A first pass's inputs: the M rows quantised as the Q6_K product quantises them, their sums of |a| per 16, and one
 * pointer to each row's of both. */
typedef struct {
    act_k *acts;
    act_l1 *l1;
    const act_k **xs;
    const act_l1 **ls;
} hi4_inputs;

static void hi4_release(hi4_inputs *in) { free(in->acts), free(in->l1), free(in->xs), free(in->ls); }

/* 0, or -1 where memory ran out (nothing left to free). */
TARGET static int hi4_prepare(const float *x, int64_t M, int64_t K, hi4_inputs *in) {
    const int64_t blocks = K / QK;
    in->acts = hi4_quantize_inputs(x, M, K);
    in->l1 = malloc(sizeof(act_l1) * blocks * M);
    in->xs = malloc(sizeof(act_k *) * M);
    in->ls = malloc(sizeof(act_l1 *) * M);
    if (!in->acts || !in->l1 || !in->xs || !in->ls) {
        hi4_release(in);
        return -1;
    }
    for (int64_t i = 0; i < M; i++) {
        hi4_l1(in->acts + i * blocks, in->l1 + i * blocks, blocks);
        in->xs[i] = in->acts + i * blocks, in->ls[i] = in->l1 + i * blocks;
    }
    return 0;
}

/* approx and bound (M x N each, row i at i x N) = the Q6_K_HI4 matrix w (N rows of K / 256 blocks) against x (M x K);
 * kernel: avx2 runs the AVX2 row function, every other the VNNI one (the same bits). Threads split the rows. */
TARGET static int hi4_matmul(const uint8_t *w, const float *x, float *approx, float *bound, int64_t N, int64_t K,
                             int64_t M, int threads, int kernel) {
    const int64_t blocks = K / QK, stride = blocks * HI4_BLOCK_BYTES;
    hi4_inputs in;
    if (hi4_prepare(x, M, K, &in)) return -1;
    const int width = kernel == KERNEL_AVX2 ? GROUP : GROUP512; /* inputs sharing each unpacked piece */
    const int64_t groups = (M + width - 1) / width;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t n = 0; n < N; n++) {
        for (int64_t g = 0, i0 = 0; g < groups; g++) {
            const int nx = (int)(M / groups + (g < M % groups));
            float a[GROUP512], b[GROUP512];
            (kernel == KERNEL_AVX2 ? hi4_avx2_for : hi4_vnni_for)[nx](w + n * stride, in.xs + i0, in.ls + i0, blocks,
                                                                     (N - n) * stride, a, b);
            for (int i = 0; i < nx; i++) approx[(i0 + i) * N + n] = a[i], bound[(i0 + i) * N + n] = b[i];
            i0 += nx;
        }
    }
    hi4_release(&in);
    return 0;
}

/* Q6_K_HI4 in groups of 16 rows (hi4_r16_pack), for passes of several inputs: where the rows' first pass multiplies
 * each 32 values twice (vpmaddubsw, then its scale by vpdpwssd), this one multiplies the four-value runs by vpdpbusd
 * (unsigned hi x signed input) into one sum per 16 values and input (at most 16 x 15 x 128 < 2^15: a word), joins
 * two 16s' sums into word pairs (a merge-masked vpshufb) and applies their two scales with one vpdpwssd: about 1.5
 * slots a 64 multiply-adds against 2.4-2.8 (bench/verify_roofline.py; the AMD EPYC Zen 4's one multiply slot a
 * cycle). The integer I and the bound's integer are the rows' exactly; the float epilogue differs (one row a lane,
 * no horizontal sum), so the bounds hold as the rows' do. A row's outputs are the same bits whatever inputs and
 * threads share the call.
 * A group's block, 16 x 146 bytes: d of the 16 rows (fp16) at 0; scale s of row r at 32 + 16 s + r; the top four
 * bits in 32 pieces of 64 bytes from 288, piece 4 p + k (p < 8, k < 4) holding row r's 4 bytes at 4 r, byte j with
 * value 16 p + 4 k + j's in its low nibble and value 128 + 16 p + 4 k + j's in its high one. */
#define HI4_R16_BYTES (R16 * HI4_BLOCK_BYTES)
#define HI4_R16_SCALES 32
#define HI4_R16_QS 288
#define HI4_R16_INPUTS 8 /* inputs a pass: two accumulators and two sums an input */

/* N Q6_K rows (the file's rows, N a multiple of 16) of `blocks` blocks to Q6_K_HI4 groups of 16 rows. */
static void hi4_r16_pack(const uint8_t *rows, uint8_t *out, int64_t N, int64_t blocks) {
    for (int64_t g = 0; g < N / R16; g++)
        for (int64_t b = 0; b < blocks; b++) {
            uint8_t *o = out + (g * blocks + b) * HI4_R16_BYTES;
            memset(o, 0, HI4_R16_BYTES);
            for (int r = 0; r < R16; r++) {
                const uint8_t *w = rows + ((R16 * g + r) * blocks + b) * 210;
                memcpy(o + 2 * r, w + 208, 2);
                for (int sub = 0; sub < 16; sub++) o[HI4_R16_SCALES + R16 * sub + r] = w[192 + sub];
                for (int j = 0; j < QK; j++) {
                    const int v = j % 128, p = v / 16, k = v % 16 / 4;
                    o[HI4_R16_QS + 64 * (4 * p + k) + 4 * r + v % 4] |=
                        (uint8_t)((q6k_quant(w, j) >> 2) << (j < 128 ? 0 : 4));
                }
            }
        }
}

/* Row r's scales s and t of a group's block as the word pair (s in the low word, t in the high) of lane r. The
 * multiples the pass needs are taken of the pair's words (8 x and -61 x a scale stay under 2^15). */
TARGET512 static inline __attribute__((always_inline)) __m512i hi4_r16_pair(const uint8_t *w, int s, int t) {
    const __m512i a = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(w + HI4_R16_SCALES + R16 * s)));
    const __m512i b = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(w + HI4_R16_SCALES + R16 * t)));
    return _mm512_or_si512(_mm512_and_si512(a, _mm512_set1_epi32(0xFFFF)), _mm512_slli_epi32(b, 16));
}

/* One group of 16 rows against nx inputs: approx[16 i + r] and bound[16 i + r] (the bound before the margin).
 * room: the blocks from w to the matrix's end (the prefetches stay inside it). */
TARGET512 static inline __attribute__((always_inline)) void hi4_group(const uint8_t *w, const act_k *const *x,
                                                                      const act_l1 *const *l, const int nx,
                                                                      int64_t blocks, int64_t room, float *approx,
                                                                      float *bound) {
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    const __m512i low_to_high = _mm512_broadcast_i32x4(
        _mm_setr_epi8(-1, -1, 0, 1, -1, -1, 4, 5, -1, -1, 8, 9, -1, -1, 12, 13)); /* bytes 0, 1 of a lane to 2, 3 */
    __m512 acc[HI4_R16_INPUTS], lim[HI4_R16_INPUTS];
    for (int i = 0; i < nx; i++) acc[i] = lim[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; b++, w += HI4_R16_BYTES) {
        __m512i total[HI4_R16_INPUTS], l1[HI4_R16_INPUTS];
        for (int i = 0; i < nx; i++) total[i] = l1[i] = _mm512_setzero_si512();
        for (int q = 0; q < 8; q++) { /* 16s 2q, 2q + 1: -61 x scale x their sums, and |scale| x their l1 */
            const __m512i pair = hi4_r16_pair(w, 2 * q, 2 * q + 1);
            const __m512i offset = _mm512_mullo_epi16(pair, _mm512_set1_epi16(-61)), size = _mm512_abs_epi16(pair);
            for (int i = 0; i < nx; i++) {
                int32_t sums, l1s;
                memcpy(&sums, x[i][b].sums + 2 * q, 4);
                memcpy(&l1s, l[i][b].l1 + 2 * q, 4);
                total[i] = _mm512_dpwssd_epi32(total[i], offset, _mm512_set1_epi32(sums));
                l1[i] = _mm512_dpwssd_epi32(l1[i], size, _mm512_set1_epi32(l1s));
            }
        }
        for (int p = 0; p < 8; p++) { /* 16s p and 8 + p, then their two scales (times the 8 of 8 hi) */
            __m512i lo_sum[HI4_R16_INPUTS], hi_sum[HI4_R16_INPUTS];
            for (int i = 0; i < nx; i++) lo_sum[i] = hi_sum[i] = _mm512_setzero_si512();
            for (int k = 0; k < 4; k++) {
                const __m512i v = _mm512_loadu_si512((const void *)(w + HI4_R16_QS + 64 * (4 * p + k)));
                r16_prefetch_step(w, HI4_R16_BYTES, b, room, nx, 4 * p + k, 32);
                const __m512i lo = _mm512_and_si512(v, low4);
                const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
                for (int i = 0; i < nx; i++) {
                    int32_t a, c;
                    memcpy(&a, x[i][b].q + 16 * p + 4 * k, 4);
                    memcpy(&c, x[i][b].q + 128 + 16 * p + 4 * k, 4);
                    lo_sum[i] = _mm512_dpbusd_epi32(lo_sum[i], lo, _mm512_set1_epi32(a));
                    hi_sum[i] = _mm512_dpbusd_epi32(hi_sum[i], hi, _mm512_set1_epi32(c));
                }
            }
            const __m512i scales = _mm512_slli_epi16(hi4_r16_pair(w, p, 8 + p), 3);
            for (int i = 0; i < nx; i++) {
                const __m512i pairs = _mm512_mask_shuffle_epi8(lo_sum[i], (__mmask64)0xCCCCCCCCCCCCCCCCull,
                                                               hi_sum[i], low_to_high);
                total[i] = _mm512_dpwssd_epi32(total[i], pairs, scales);
            }
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)w));
        for (int i = 0; i < nx; i++) {
            const __m512 dd = _mm512_mul_ps(d, _mm512_set1_ps(x[i][b].d));
            acc[i] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(total[i]), acc[i]);
            lim[i] = _mm512_fmadd_ps(_mm512_abs_ps(dd), _mm512_cvtepi32_ps(l1[i]), lim[i]);
        }
    }
    for (int i = 0; i < nx; i++) {
        _mm512_storeu_ps(approx + 16 * i, _mm512_mul_ps(acc[i], _mm512_set1_ps(0.5f)));
        _mm512_storeu_ps(bound + 16 * i, _mm512_mul_ps(lim[i], _mm512_set1_ps(1.5f)));
    }
}

/* hi4_group on AVX2 alone (no VNNI): 8 rows a register, the group in two parts of 8 rows. A 16's sum comes from
 * vpmaddubsw pairs summed as int16 over its four runs (each word under 4 x 2 x 15 x 128 = 15360: exact), its scale
 * applied by one vpmaddwd per 16 (the scale, times the 8 of 8 hi, in both words of the row's lane), the offsets' and
 * l1's word pairs by vpmaddwd and an add where VNNI has vpdpwssd: the same integers in every lane, then the same float
 * epilogue, so the same bits as hi4_group's. The scales' words are made by placing each int8 scale in a word's high
 * byte (vpshufb) and shifting it down arithmetically (vpsraw): sign-extended, and by 5 rather than 8 it is 8 x the
 * scale. */
#define HI4_HIGH(r) -1, (r)                /* byte r of the 8 in a word's high byte */
#define HI4_LANES(r) HI4_HIGH(r), HI4_HIGH(r) /* lane r: both words */
/* Row 8h + r's scale s (times 8) in both words of lane r, r < 8. */
TARGET static inline __attribute__((always_inline)) __m256i hi4_scale8_avx2(const uint8_t *w, int h, int s) {
    const __m256i pick = _mm256_setr_epi8(HI4_LANES(0), HI4_LANES(1), HI4_LANES(2), HI4_LANES(3), HI4_LANES(4),
                                          HI4_LANES(5), HI4_LANES(6), HI4_LANES(7));
    int64_t eight;
    memcpy(&eight, w + HI4_R16_SCALES + R16 * s + 8 * h, 8);
    return _mm256_srai_epi16(_mm256_shuffle_epi8(_mm256_set1_epi64x(eight), pick), 5);
}

/* Row 8h + r's scales s and s + 1 as the word pair of lane r (s in the low word), as hi4_r16_pair's lanes 8h + r. */
TARGET static inline __attribute__((always_inline)) __m256i hi4_pair_avx2(const uint8_t *w, int h, int s) {
    /* the two scales' bytes interleaved (row r's at 2r, 2r + 1), the same 16 bytes in both halves */
    const __m256i pick = _mm256_setr_epi8(HI4_HIGH(0), HI4_HIGH(1), HI4_HIGH(2), HI4_HIGH(3), HI4_HIGH(4), HI4_HIGH(5),
                                          HI4_HIGH(6), HI4_HIGH(7), HI4_HIGH(8), HI4_HIGH(9), HI4_HIGH(10),
                                          HI4_HIGH(11), HI4_HIGH(12), HI4_HIGH(13), HI4_HIGH(14), HI4_HIGH(15));
    int64_t first, second;
    memcpy(&first, w + HI4_R16_SCALES + R16 * s + 8 * h, 8);
    memcpy(&second, w + HI4_R16_SCALES + R16 * (s + 1) + 8 * h, 8);
    const __m256i both = _mm256_unpacklo_epi8(_mm256_set1_epi64x(first), _mm256_set1_epi64x(second));
    return _mm256_srai_epi16(_mm256_shuffle_epi8(both, pick), 8);
}

TARGET static inline __attribute__((always_inline)) void hi4_group_avx2(const uint8_t *w, const act_k *const *x,
                                                                        const act_l1 *const *l, const int nx,
                                                                        int64_t blocks, int64_t room, float *approx,
                                                                        float *bound) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    __m256 acc[HI4_R16_INPUTS][2], lim[HI4_R16_INPUTS][2];
    for (int i = 0; i < nx; i++)
        for (int h = 0; h < 2; h++) acc[i][h] = lim[i][h] = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; b++, w += HI4_R16_BYTES) {
        for (int h = 0; h < 2; h++) { /* rows 8h .. 8h + 7 */
            __m256i total[HI4_R16_INPUTS], l1[HI4_R16_INPUTS];
            for (int i = 0; i < nx; i++) total[i] = l1[i] = _mm256_setzero_si256();
            for (int q = 0; q < 8; q++) {
                const __m256i pair = hi4_pair_avx2(w, h, 2 * q);
                const __m256i offset = _mm256_mullo_epi16(pair, _mm256_set1_epi16(-61));
                const __m256i size = _mm256_abs_epi16(pair);
                for (int i = 0; i < nx; i++) {
                    int32_t sums, l1s;
                    memcpy(&sums, x[i][b].sums + 2 * q, 4);
                    memcpy(&l1s, l[i][b].l1 + 2 * q, 4);
                    total[i] = _mm256_add_epi32(total[i], _mm256_madd_epi16(offset, _mm256_set1_epi32(sums)));
                    l1[i] = _mm256_add_epi32(l1[i], _mm256_madd_epi16(size, _mm256_set1_epi32(l1s)));
                }
            }
            for (int p = 0; p < 8; p++) { /* 16s p and 8 + p, then their scales (times the 8 of 8 hi) */
                __m256i lo_sum[HI4_R16_INPUTS], hi_sum[HI4_R16_INPUTS];
                for (int i = 0; i < nx; i++) lo_sum[i] = hi_sum[i] = _mm256_setzero_si256();
                for (int k = 0; k < 4; k++) {
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(w + HI4_R16_QS + 64 * (4 * p + k) + 32 * h));
                    /* one input dealt out as two (GROUP_PF_NX): the first pass at 1 row 6.2 ms, 8.6 into L1 */
                    r16_prefetch_step(w, HI4_R16_BYTES, b, room, 2, 32 * h + 4 * p + k, 64);
                    const __m256i lo = _mm256_and_si256(v, low4);
                    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
                    for (int i = 0; i < nx; i++) {
                        int32_t a, c;
                        memcpy(&a, x[i][b].q + 16 * p + 4 * k, 4);
                        memcpy(&c, x[i][b].q + 128 + 16 * p + 4 * k, 4);
                        lo_sum[i] = _mm256_add_epi16(lo_sum[i], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(a)));
                        hi_sum[i] = _mm256_add_epi16(hi_sum[i], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(c)));
                        IN_ORDER_256_PAIR(lo_sum[i], hi_sum[i]);
                    }
                }
                const __m256i s_lo = hi4_scale8_avx2(w, h, p), s_hi = hi4_scale8_avx2(w, h, 8 + p);
                for (int i = 0; i < nx; i++)
                    total[i] = _mm256_add_epi32(total[i], _mm256_add_epi32(_mm256_madd_epi16(lo_sum[i], s_lo),
                                                                           _mm256_madd_epi16(hi_sum[i], s_hi)));
            }
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 16 * h)));
            for (int i = 0; i < nx; i++) {
                const __m256 dd = _mm256_mul_ps(d, _mm256_set1_ps(x[i][b].d));
                const __m256 size = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), dd); /* |dd| */
                acc[i][h] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(total[i]), acc[i][h]);
                lim[i][h] = _mm256_fmadd_ps(size, _mm256_cvtepi32_ps(l1[i]), lim[i][h]);
            }
        }
    }
    for (int i = 0; i < nx; i++)
        for (int h = 0; h < 2; h++) {
            _mm256_storeu_ps(approx + 16 * i + 8 * h, _mm256_mul_ps(acc[i][h], _mm256_set1_ps(0.5f)));
            _mm256_storeu_ps(bound + 16 * i + 8 * h, _mm256_mul_ps(lim[i][h], _mm256_set1_ps(1.5f)));
        }
}

#define HI4_GROUP_FN(N)                                                                                            \
    TARGET512 static void hi4_group_##N(const uint8_t *w, const act_k *const *x, const act_l1 *const *l,            \
                                        int64_t blocks, int64_t room, float *approx, float *bound) {               \
        hi4_group(w, x, l, N, blocks, room, approx, bound);                                                         \
    }
HI4_GROUP_FN(1) HI4_GROUP_FN(2) HI4_GROUP_FN(3) HI4_GROUP_FN(4) HI4_GROUP_FN(5) HI4_GROUP_FN(6) HI4_GROUP_FN(7)
HI4_GROUP_FN(8)
#define HI4_GROUP_AVX2_FN(N)                                                                                       \
    TARGET static void hi4_group_avx2_##N(const uint8_t *w, const act_k *const *x, const act_l1 *const *l,          \
                                          int64_t blocks, int64_t room, float *approx, float *bound) {             \
        hi4_group_avx2(w, x, l, N, blocks, room, approx, bound);                                                    \
    }
HI4_GROUP_AVX2_FN(1) HI4_GROUP_AVX2_FN(2) HI4_GROUP_AVX2_FN(3) HI4_GROUP_AVX2_FN(4) HI4_GROUP_AVX2_FN(5)
HI4_GROUP_AVX2_FN(6) HI4_GROUP_AVX2_FN(7) HI4_GROUP_AVX2_FN(8)
typedef void (*hi4_group_fn)(const uint8_t *, const act_k *const *, const act_l1 *const *, int64_t, int64_t, float *,
                             float *);
static const hi4_group_fn hi4_group_for[HI4_R16_INPUTS + 1] = {NULL, hi4_group_1, hi4_group_2, hi4_group_3,
                                                                hi4_group_4, hi4_group_5, hi4_group_6, hi4_group_7,
                                                                hi4_group_8};
static const hi4_group_fn hi4_group_avx2_for[HI4_R16_INPUTS + 1] = {
    NULL, hi4_group_avx2_1, hi4_group_avx2_2, hi4_group_avx2_3, hi4_group_avx2_4, hi4_group_avx2_5, hi4_group_avx2_6,
    hi4_group_avx2_7, hi4_group_avx2_8};

/* approx and bound (M x N each, row i at i x N) = the Q6_K_HI4 groups w (N rows, a multiple of 16, of K / 256 blocks)
 * against x (M x K); kernel: avx2 runs hi4_group_avx2, every other hi4_group (AVX512-VNNI: the caller checks), the
 * same bits. Threads split the groups; inputs go HI4_R16_INPUTS a pass (the passes as even as they can be). */
TARGET static int hi4_r16_matmul(const uint8_t *w, const float *x, float *approx, float *bound, int64_t N, int64_t K,
                                 int64_t M, int threads, int kernel) {
    const hi4_group_fn *group_for = kernel == KERNEL_AVX2 ? hi4_group_avx2_for : hi4_group_for;
    const int64_t blocks = K / QK, groups = N / R16;
    hi4_inputs in;
    if (hi4_prepare(x, M, K, &in)) return -1;
    const int64_t passes = (M + HI4_R16_INPUTS - 1) / HI4_R16_INPUTS;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t g = 0; g < groups; g++) {
        for (int64_t pass = 0, i0 = 0; pass < passes; pass++) {
            const int nx = (int)(M / passes + (pass < M % passes));
            float a[R16 * HI4_R16_INPUTS], bd[R16 * HI4_R16_INPUTS];
            group_for[nx](w + g * blocks * HI4_R16_BYTES, in.xs + i0, in.ls + i0, blocks, (groups - g) * blocks,
                              a, bd);
            for (int i = 0; i < nx; i++)
                for (int r = 0; r < R16; r++) {
                    approx[(i0 + i) * N + R16 * g + r] = a[R16 * i + r];
                    bound[(i0 + i) * N + R16 * g + r] = bd[R16 * i + r];
                }
            i0 += nx;
        }
    }
    hi4_release(&in);
    return 0;
}

/* The rows that can be an input's argmax: with each bound widened by `margin` of itself, row n is a candidate of
 * input i where approx + bound reaches the largest approx - bound of input i (its argmax's Q6_K logit lies between
 * its own two). Writes the union of the inputs' candidates, ascending, to index (N slots), whether each is input i's
 * to member[i x N + j] (j below the union's count) and each input's count to counts; returns the union's count, or -1
 * where memory ran out. Eight rows at a time, the rest one by one (the same comparisons). */
TARGET static int64_t hi4_candidates(const float *approx, const float *bound, int64_t N, int64_t M, float margin,
                                     int64_t *index, uint8_t *member, int64_t *counts) {
    float *floor = malloc(sizeof(float) * M);
    if (!floor) return -1;
    const float widen = 1.0f + margin;
    const __m256 widen8 = _mm256_set1_ps(widen);
    const int64_t N8 = N / 8 * 8;
    for (int64_t i = 0; i < M; i++) {
        const float *a = approx + i * N, *b = bound + i * N;
        __m256 best8 = _mm256_set1_ps(-INFINITY);
        for (int64_t n = 0; n < N8; n += 8)
            best8 = _mm256_max_ps(best8, _mm256_fnmadd_ps(_mm256_loadu_ps(b + n), widen8, _mm256_loadu_ps(a + n)));
        float lanes[8], best = -INFINITY;
        _mm256_storeu_ps(lanes, best8);
        for (int l = 0; l < 8; l++) best = lanes[l] > best ? lanes[l] : best;
        for (int64_t n = N8; n < N; n++) {
            const float low = fmaf(-b[n], widen, a[n]);
            best = low > best ? low : best;
        }
        floor[i] = best, counts[i] = 0;
    }
    int64_t kept = 0;
    for (int64_t n0 = 0; n0 < N; n0 += 8) {
        int any = n0 >= N8; /* the last few rows one by one */
        for (int64_t i = 0; i < M && !any; i++) {
            const __m256 high = _mm256_fmadd_ps(_mm256_loadu_ps(bound + i * N + n0), widen8,
                                                _mm256_loadu_ps(approx + i * N + n0));
            any = _mm256_movemask_ps(_mm256_cmp_ps(high, _mm256_set1_ps(floor[i]), _CMP_GE_OQ));
        }
        if (!any) continue;
        for (int64_t n = n0; n < N && n < n0 + 8; n++) {
            int some = 0; /* each input's verdict goes in slot kept, taken only where some input has the row */
            for (int64_t i = 0; i < M; i++) {
                member[i * N + kept] = fmaf(bound[i * N + n], widen, approx[i * N + n]) >= floor[i];
                some |= member[i * N + kept];
            }
            if (!some) continue;
            for (int64_t i = 0; i < M; i++) counts[i] += member[i * N + kept];
            index[kept++] = n;
        }
    }
    free(floor);
    return kept;
}

/* The argmax head's second pass: out (M x N, row i at i x N) gets -inf everywhere but at input i's candidates
 * (member, index and count as hi4_candidates writes them), which get the Q6_K product of x (M x K) with those rows
 * of w (the file's rows, stride bytes apart): the same row functions, so the same bits, as matmul's over all of them
 * (an input's output does not depend on the inputs beside it). Each row is multiplied by the inputs it is a
 * candidate of, not by all M: the positions of a verify pass rarely share candidates. The rows lie anywhere: each is
 * asked for HI4_PREFETCH_ROWS ahead. Threads split the rows. */
#define HI4_PREFETCH_ROWS 4
TARGET static int hi4_exact_rows(const uint8_t *w, int64_t stride, const int64_t *index, const uint8_t *member,
                                 int64_t count, const float *x, float *out, int64_t N, int64_t K, int64_t M,
                                 int threads, int kernel) {
    act_k *acts = hi4_quantize_inputs(x, M, K);
    const void **rows = malloc(sizeof(void *) * M);
    if (!acts || !rows) {
        free(acts), free(rows);
        return -1;
    }
    for (int64_t i = 0; i < M; i++) rows[i] = acts + i * (K / QK);
    for (int64_t i = 0; i < M * N; i++) out[i] = -INFINITY;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t j = 0; j < count; j++) {
        if (j + HI4_PREFETCH_ROWS < count) {
            const uint8_t *ahead = w + index[j + HI4_PREFETCH_ROWS] * stride;
            for (int64_t off = 0; off < stride; off += 64) _mm_prefetch((const char *)(ahead + off), _MM_HINT_T0);
        }
        float y[GROUP512 * 4];
        const void *mine[GROUP512 * 4]; /* the inputs row j is a candidate of, at most 32 a call */
        int64_t whose[GROUP512 * 4];
        const int64_t n = index[j];
        for (int64_t i = 0, m = 0; i < M; i++) {
            if (member[i * N + j]) mine[m] = rows[i], whose[m++] = i;
            if (m && (m == GROUP512 * 4 || i == M - 1)) {
                product_row(Q6_K, w + n * stride, mine, m, kernel, K, 0, NULL, y, 1);
                for (int64_t c = 0; c < m; c++) out[whose[c] * N + n] = y[c];
                m = 0;
            }
        }
    }
    free(acts), free(rows);
    return 0;
}

#endif
