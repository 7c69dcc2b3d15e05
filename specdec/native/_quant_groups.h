/* The group functions (Q4_K_R16, Q6_K_R16, Q5_0_R16, Q8_0_R16: the 16 outputs of one group of rows for up to
 * R16_INPUTS inputs, out[i * R16 + r]) on GROUP_BITS-bit registers. _quant_kernels.h includes this file once per
 * kernel family: 512 bits (16 rows a register: the avx512-vnni and amx kernels), 256 bits with VNNI (8 rows a
 * register, each group in two parts: the avx512-vnni-256 kernel, the AVX512-VL encodings of the same instructions,
 * for CPUs that run a 512-bit instruction as two 256-bit halves) and 256 bits on AVX2 alone (GROUP_NO_VNNI: the avx2
 * kernel; vpdpbusd as vpmaddubsw then vpmaddwd by ones, exact where no pair of products leaves int16: the 4-, 5- and
 * 6-bit quants; Q8_0 by sign as the rows' dot_s8). Lane r of part h is row GL h + r, and every lane
 * takes the same integer and float operations in the same order at either width, so all give the same bits (and the
 * row code's: the layouts and why are above q4k_pack_block .. q8_0_pack_block). GROUP_ISA: the functions' target;
 * GROUP_SUFFIX: their names' (group_q4_k_r16_512, _256, _avx2). No include guard: included three times on purpose. */
#if GROUP_BITS == 512
#define GL 16
#define VI __m512i
#define VF __m512
#define V_LOAD(p) _mm512_loadu_si512((const void *)(p))
#define V_AND _mm512_and_si512
#define V_SRLI16 _mm512_srli_epi16
#define V_SLLI16 _mm512_slli_epi16
#define V_SLLI32 _mm512_slli_epi32
#define V_ADD32 _mm512_add_epi32
#define V_SUB32 _mm512_sub_epi32
#define V_MULLO32 _mm512_mullo_epi32
#define V_DPBUSD _mm512_dpbusd_epi32
#define V_DPWSSD _mm512_dpwssd_epi32
#define V_MADDUBS _mm512_maddubs_epi16
#define V_SET1_8 _mm512_set1_epi8
#define V_SET1_32 _mm512_set1_epi32
#define V_ZERO _mm512_setzero_si512
#define V_OR_AND(a, b, c) _mm512_ternarylogic_epi32((a), (b), (c), 0xF8) /* a | (b & c) */
#define V_SHUFFLE8 _mm512_shuffle_epi8
#define V_BROADCAST128 _mm512_broadcast_i32x4
#define V_U8_TO_32(p) _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p)))
#define V_U8_TO_16(p) _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(p)))
#define V_I8_TO_16(p) _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(p)))
#define F_HALVES(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define F_ZERO _mm512_setzero_ps
#define F_SET1 _mm512_set1_ps
#define F_MUL _mm512_mul_ps
#define F_ADD _mm512_add_ps
#define F_FMADD _mm512_fmadd_ps
#define F_FNMADD _mm512_fnmadd_ps
#define F_CVT _mm512_cvtepi32_ps
#define F_STORE _mm512_storeu_ps
#elif GROUP_BITS == 256
#define GL 8
#define VI __m256i
#define VF __m256
#define V_LOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define V_AND _mm256_and_si256
#define V_SRLI16 _mm256_srli_epi16
#define V_SLLI16 _mm256_slli_epi16
#define V_SLLI32 _mm256_slli_epi32
#define V_ADD32 _mm256_add_epi32
#define V_SUB32 _mm256_sub_epi32
#define V_MULLO32 _mm256_mullo_epi32
#ifdef GROUP_NO_VNNI
#define V_DPBUSD(acc, u, s)                                                                                       \
    _mm256_add_epi32((acc), _mm256_madd_epi16(_mm256_maddubs_epi16((u), (s)), _mm256_set1_epi16(1)))
#define V_DPWSSD(acc, a, b) _mm256_add_epi32((acc), _mm256_madd_epi16((a), (b)))
#define V_OR_AND(a, b, c) _mm256_or_si256((a), _mm256_and_si256((b), (c)))
#else
#define V_DPBUSD _mm256_dpbusd_epi32
#define V_DPWSSD _mm256_dpwssd_epi32
#define V_OR_AND(a, b, c) _mm256_ternarylogic_epi32((a), (b), (c), 0xF8)
#endif
#define V_MADDUBS _mm256_maddubs_epi16
#define V_SET1_8 _mm256_set1_epi8
#define V_SET1_32 _mm256_set1_epi32
#define V_ZERO _mm256_setzero_si256
#define V_SHUFFLE8 _mm256_shuffle_epi8
#define V_BROADCAST128 _mm256_broadcastsi128_si256
#define V_U8_TO_32(p) _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p)))
#define V_U8_TO_16(p) _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(p)))
#define V_I8_TO_16(p) _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p)))
#define F_HALVES(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define F_ZERO _mm256_setzero_ps
#define F_SET1 _mm256_set1_ps
#define F_MUL _mm256_mul_ps
#define F_ADD _mm256_add_ps
#define F_FMADD _mm256_fmadd_ps
#define F_FNMADD _mm256_fnmadd_ps
#define F_CVT _mm256_cvtepi32_ps
#define F_STORE _mm256_storeu_ps
#else
#error "GROUP_BITS must be 512 or 256"
#endif
#define GH (R16 / GL)                          /* parts of a group */
/* The K-quant group functions' inner loop over a block's eight pieces, unrolled: rolled, GCC 12 keeps each input's
 * sums in other registers than the multiplies write and copies them back and forth (two moves a multiply at 8
 * inputs, and spills). The same operations in the same order: the same bits. Intel Xeon, avx512-vnni, alternating
 * processes: 28 ffn_up products at 64 rows 3.07-3.31 against 3.51-3.81 ms; with matmul's inputs quantised on every
 * thread, a prompt pass of 512 at 144-148 against 127-134 tokens/s (experiments/cpu-lead, fifth run). */
#define GROUP_UNROLL _Pragma("GCC unroll 8")
/* Q4_K's eight steps of a sub-block (Q4K_STEP: four unsigned nibbles times four input quants into the row's lane)
 * and their sum times the rows' 6-bit scales (Q4K_SCALED, sc: one int32 lane a row). With VNNI, vpdpbusd into int32
 * and one vpmulld. On AVX2 (GROUP_NO_VNNI) the steps' vpmaddubsw pairs are summed as int16 (a lane's eight pairs are
 * at most 8 x 2 x 15 x 128 = 30720 in size: exact), then one vpmaddwd by the scales (each row's in both of its int16
 * lanes): one multiply per 32 products instead of two and the vpmulld. The same integer S either way (AMD EPYC
 * Zen 3, sixteenth run). */
/* GROUP_IN_ORDER(v) after each step's addition into a sum: on AVX2 the sums are vpaddw / vpaddd, which GCC
 * reassociates across the unrolled steps: it formed all of a chunk's products first and added them as a tree,
 * holding them all at once (spilled at four inputs and more). IN_ORDER_256 (_simd.h) keeps the written order, one
 * product live at a time. Integer sums: the same values in any order. AMD EPYC Zen 3, one thread, builds alternated
 * (bench/group_rate.py), G multiply-adds a second at 3 / 5 / 7 inputs: Q4_K in L2 89 / 95 / 95 against 83 / 80 / 85,
 * streaming 28 layers 74 / 90 / 90 against 70 / 77 / 81; Q6_K at 7 inputs 47 against 33 (eighteenth run). VNNI's
 * vpdpbusd adds in place: nothing to keep. */
#ifdef GROUP_NO_VNNI
#define GROUP_IN_ORDER(v) IN_ORDER_256(v)
#else
#define GROUP_IN_ORDER(v) ((void)0)
#endif
#ifdef GROUP_NO_VNNI
#define Q4K_STEP(acc, u, s) _mm256_add_epi16((acc), V_MADDUBS((u), (s)))
#define Q4K_SCALED(sum, sc) _mm256_madd_epi16((sum), _mm256_or_si256((sc), V_SLLI32((sc), 16)))
#else
#define Q4K_STEP(acc, u, s) V_DPBUSD((acc), (u), (s))
#define Q4K_SCALED(sum, sc) V_MULLO32((sum), (sc))
#endif
/* The input count r16_prefetch_step is told: on AVX2 one input's weights are asked for as two inputs' (dealt into L2,
 * 8 KB on) rather than a whole block into L1. AMD EPYC Zen 3, 2 threads, all 28 (24) layers' matrices in turn, the
 * builds in one process: one-input products 0.93 of the time on Q4_K (ffn_up), 0.82 on Q6_K (ffn_down), 0.91 on the
 * 0.5B's Q5_0 (seventeenth run); the AVX-512 kernels keep the block into L1 (measured better there). */
#ifdef GROUP_NO_VNNI
#define GROUP_PF_NX(nx) ((nx) > 1 ? (nx) : 2)
#else
#define GROUP_PF_NX(nx) (nx)
#endif
#define GCAT2(a, b) a##_##b
#define GCAT(a, b) GCAT2(a, b)
#define GNAME(name) GCAT(name, GROUP_SUFFIX)   /* group_q4_k_r16_512, group_q4_k_r16_256, ... */
/* Where part h's rows start in a block's arrays of 4 quant bytes, 2 bytes (fp16, int16 pairs) or 1 byte per row */
#define AT4(h) (4 * GL * (h))
#define AT2(h) (2 * GL * (h))
#define AT1(h) (GL * (h))

/* Eight accumulators summed lane by lane in hsum8's order: ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)). */
GROUP_ISA static inline VF GNAME(sum8)(const VF *a) {
    return F_ADD(F_ADD(F_ADD(a[0], a[4]), F_ADD(a[2], a[6])), F_ADD(F_ADD(a[1], a[5]), F_ADD(a[3], a[7])));
}

/* acc[input][part][l] (room for N inputs) for the first nx inputs set to zero, and at the end stored in hsum8's
 * order into out. */
#define GROUP_ACCUMULATORS(N) VF acc[N][GH][8];                                                               \
    for (int i = 0; i < nx; i++)                                                                              \
        for (int h = 0; h < GH; h++)                                                                          \
            for (int l = 0; l < 8; l++) acc[i][h][l] = F_ZERO();
#define GROUP_STORE                                                                                           \
    for (int i = 0; i < nx; i++)                                                                              \
        for (int h = 0; h < GH; h++) F_STORE(out + i * R16 + AT1(h), GNAME(sum8)(acc[i][h]));

/* One input's Q4_K block into its accumulator (acc: accumulator b mod 8 of part h; S the block's integer, d and dmin
 * the part's rows' scales): Mn (the rows' mins times the input's sums per 32), then q4k_flush's two roundings. Also
 * the AMX tiles' epilogue (amx_group_q4_k_r16), so both give these bits. */
GROUP_ISA static inline __attribute__((always_inline)) void GNAME(q4k_r16_flush)(const uint8_t *w, int h, VF d, VF dmin,
                                                                                  const act_k *xb, VI S, VF *acc) {
    VI Mn = V_ZERO();
    for (int k = 0; k < 4; k++) { /* lane r: its mins 2k, 2k + 1 times the input's sums of those 32s */
        int32_t pair;
        memcpy(&pair, xb->sums32 + 2 * k, 4);
        Mn = V_DPWSSD(Mn, V_U8_TO_16(w + R16_MINS + 2 * R16 * k + AT2(h)), V_SET1_32(pair));
    }
    const VF dx = F_SET1(xb->d);
    *acc = F_FMADD(F_MUL(d, dx), F_CVT(S), *acc);
    *acc = F_FNMADD(F_MUL(dmin, dx), F_CVT(Mn), *acc);
}

/* Q4_K: per block and input, S (lane r: the row's scaled quants times the input's, exact), Mn (the mins times the
 * input's sums per 32), then q4k_flush's two roundings into accumulator b mod 8; at the end hsum8's order. room: the
 * blocks from w to the matrix's end (the prefetches stay inside it). Three integer registers an input, so up to
 * R16_K_INPUTS inputs a pass (Intel Xeon, avx512-vnni: 28 ffn_up at 5 rows 0.49 ms in one pass against 0.67-0.79 in
 * 3 + 2; a step at m 5 69-70 against 75 ms). */
GROUP_ISA static inline __attribute__((always_inline)) void GNAME(group_q4_k_r16)(const uint8_t *w,
                                                                                   const act_k *const *x, int nx,
                                                                                   int64_t blocks, int64_t room,
                                                                                   float *out) {
    GROUP_ACCUMULATORS(R16_K_INPUTS)
    const VI low4 = V_SET1_8(0x0F);
    for (int64_t b = 0; b < blocks; b++, w += R16_Q4K_BYTES) {
        for (int h = 0; h < GH; h++) {
            VI S[R16_K_INPUTS];
            for (int i = 0; i < nx; i++) S[i] = V_ZERO();
            for (int p = 0; p < 4; p++) { /* chunk p: sub-blocks 2p (low nibbles) and 2p + 1 (high) */
                VI lo_sum[R16_K_INPUTS], hi_sum[R16_K_INPUTS];
                for (int i = 0; i < nx; i++) lo_sum[i] = hi_sum[i] = V_ZERO();
                GROUP_UNROLL
                for (int t = 0; t < 8; t++) {
                    const VI v = V_LOAD(w + R16_QS + 512 * p + 64 * t + AT4(h));
                    r16_prefetch_step(w, R16_Q4K_BYTES, b, room, GROUP_PF_NX(nx), (h * 4 + p) * 8 + t, GH * 32);
                    const VI lo = V_AND(v, low4), hi = V_AND(V_SRLI16(v, 4), low4);
                    for (int i = 0; i < nx; i++) {
                        int32_t a, c;
                        memcpy(&a, x[i][b].q + 64 * p + 4 * t, 4);
                        memcpy(&c, x[i][b].q + 64 * p + 32 + 4 * t, 4);
                        lo_sum[i] = Q4K_STEP(lo_sum[i], lo, V_SET1_32(a));
                        hi_sum[i] = Q4K_STEP(hi_sum[i], hi, V_SET1_32(c));
                        GROUP_IN_ORDER(lo_sum[i]);
                        GROUP_IN_ORDER(hi_sum[i]);
                    }
                }
                const uint8_t *scales = w + R16_SCALES + 2 * R16 * p; /* 16 rows' scales per sub-block */
                const VI sc_lo = V_U8_TO_32(scales + AT1(h)), sc_hi = V_U8_TO_32(scales + R16 + AT1(h));
                for (int i = 0; i < nx; i++)
                    S[i] = V_ADD32(S[i], V_ADD32(Q4K_SCALED(lo_sum[i], sc_lo), Q4K_SCALED(hi_sum[i], sc_hi)));
            }
            const VF d = F_HALVES(w + R16_D + AT2(h)), dmin = F_HALVES(w + R16_DMIN + AT2(h));
            for (int i = 0; i < nx; i++) GNAME(q4k_r16_flush)(w, h, d, dmin, &x[i][b], S[i], &acc[i][h][b & 7]);
        }
    }
    GROUP_STORE
}

/* Q6_K: per block, lane l's integers for every row, its offset off them, then q6k_accumulate's rounding into
 * accumulator l; at the end hsum8's order across the eight. Lanes k and k + 4 (the k-th 4-value run of each 32's low
 * and high 16) are formed together over the block's eight 32s and flushed before the next pair, so an input holds
 * two integer registers, not eight, and up to R16_K_INPUTS inputs share one unpacking of the weights (at five
 * rows, a verify pass over k = 4, the former eight-lane order took two passes with spills). Each lane's integer and
 * rounding are as before: the same bits. The rows' scales per 32 are unpacked once a block into sc_even / sc_odd.
 * Intel Xeon: 14 ffn_down products at 5 rows 0.80 against 0.95 ms, 1 row alike; not yet timed on an AMD CPU. */
GROUP_ISA static inline __attribute__((always_inline)) void GNAME(group_q6_k_r16)(const uint8_t *w,
                                                                                   const act_k *const *x, int nx,
                                                                                   int64_t blocks, int64_t room,
                                                                                   float *out) {
    GROUP_ACCUMULATORS(R16_K_INPUTS)
    const VI low4 = V_SET1_8(0x0F), top2 = V_SET1_8(0x30);
    /* int16 lanes 2r and 2r + 1 both take row r's scale 2t (even) or 2t + 1 (odd) from lanes 2r, 2r + 1 */
    const VI even = V_BROADCAST128(_mm_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13));
    const VI odd = V_BROADCAST128(_mm_setr_epi8(2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15));
    for (int64_t b = 0; b < blocks; b++, w += R16_Q6K_BYTES) {
        for (int h = 0; h < GH; h++) {
            VI sc_even[8], sc_odd[8];
            for (int t = 0; t < 8; t++) { /* row r's scales 2t and 2t + 1 in int16 lanes 2r and 2r + 1 */
                const VI pairs = V_I8_TO_16(w + R16_Q6K_SCALES + 2 * R16 * t + AT2(h));
                sc_even[t] = V_SHUFFLE8(pairs, even);
                sc_odd[t] = V_SHUFFLE8(pairs, odd);
            }
            const VF d = F_HALVES(w + R16_Q6K_D + AT2(h));
            for (int k = 0; k < 4; k++) {
                VI lo[R16_K_INPUTS], hi[R16_K_INPUTS]; /* lanes k and k + 4 */
                for (int i = 0; i < nx; i++) lo[i] = hi[i] = V_ZERO();
                GROUP_UNROLL
                for (int t = 0; t < 8; t++) {
                    const uint8_t *piece = w + R16_Q6K_QS + 384 * t;
                    const VI v = V_LOAD(piece + 64 * k + AT4(h));
                    r16_prefetch_step(w, R16_Q6K_BYTES, b, room, GROUP_PF_NX(nx), (h * 4 + k) * 8 + t, GH * 32);
                    const VI qh0 = V_LOAD(piece + 256 + AT4(h)), qh1 = V_LOAD(piece + 320 + AT4(h));
                    /* the top two bits of lanes k and k + 4 moved to bits 4-5 (16-bit shifts: what crosses a byte
                     * is masked off) */
                    const VI h0 = k < 3 ? V_SLLI16(qh0, 4 - 2 * k) : V_SRLI16(qh0, 2);
                    const VI h1 = k < 3 ? V_SLLI16(qh1, 4 - 2 * k) : V_SRLI16(qh1, 2);
                    const VI q_lo = V_OR_AND(V_AND(v, low4), h0, top2);
                    const VI q_hi = V_OR_AND(V_AND(V_SRLI16(v, 4), low4), h1, top2);
                    for (int i = 0; i < nx; i++) {
                        int32_t a, c;
                        memcpy(&a, x[i][b].q + 32 * t + 4 * k, 4);
                        memcpy(&c, x[i][b].q + 32 * t + 4 * (k + 4), 4);
                        lo[i] = V_DPWSSD(lo[i], V_MADDUBS(q_lo, V_SET1_32(a)), sc_even[t]);
                        hi[i] = V_DPWSSD(hi[i], V_MADDUBS(q_hi, V_SET1_32(c)), sc_odd[t]);
                        GROUP_IN_ORDER(lo[i]);
                        GROUP_IN_ORDER(hi[i]);
                    }
                }
                for (int half = 0; half < 2; half++) {
                    const int l = k + 4 * half;
                    const VI pairs = V_I8_TO_16(w + R16_Q6K_SCALES + 2 * R16 * l + AT2(h));
                    for (int i = 0; i < nx; i++) {
                        int32_t sums;
                        memcpy(&sums, x[i][b].sums + 2 * l, 4);
                        const VI offset = V_DPWSSD(V_ZERO(), pairs, V_SET1_32(sums));
                        const VI total = V_SUB32(half ? hi[i] : lo[i], V_SLLI32(offset, 5));
                        const VF scale = F_MUL(d, F_SET1(x[i][b].d));
                        acc[i][h][l] = F_FMADD(scale, F_CVT(total), acc[i][h][l]);
                    }
                }
            }
        }
    }
    GROUP_STORE
}

/* Per input, (d x the input's d) for part h's rows of a Q5_0 / Q8_0 group's block (d: the 16 rows' fp16 scales at
 * the block's start): ROW_Q32's one multiply. */
GROUP_ISA static inline __attribute__((always_inline)) void GNAME(q32_scales)(const uint8_t *w, const act_32 *const *x,
                                                                              int nx, int64_t b, int h, VF *scale) {
    const VF d = F_HALVES(w + AT2(h));
    for (int i = 0; i < nx; i++) scale[i] = F_MUL(d, F_SET1(x[i][b].d));
}

/* One block's lane l for part h's rows (q: their unsigned quants of values 4l..4l+3) into input x's accumulator l:
 * the lane's integer from the input's offset, then ROW_Q32's rounding. */
GROUP_ISA static inline __attribute__((always_inline)) VF GNAME(q32_lane)(VF acc, VF scale, VI q, const act_32 *x,
                                                                          int l) {
    int32_t quad;
    memcpy(&quad, x->q + 4 * l, 4);
    const VI lane = V_DPBUSD(V_SET1_32(x->offsets[l]), q, V_SET1_32(quad));
    return F_FMADD(scale, F_CVT(lane), acc);
}

/* Q5_0: the fifth bits joined to the nibbles, then q32_lane per lane and input. */
GROUP_ISA static inline __attribute__((always_inline)) void GNAME(group_q5_0_r16)(const uint8_t *w,
                                                                                   const act_32 *const *x, int nx,
                                                                                   int64_t blocks, int64_t room,
                                                                                   float *out) {
    GROUP_ACCUMULATORS(R16_INPUTS)
    const VI low4 = V_SET1_8(0x0F), fifth = V_SET1_8(0x10);
    for (int64_t b = 0; b < blocks; b++, w += R16_Q5_0_BYTES) {
        for (int h = 0; h < GH; h++) {
            VF scale[R16_INPUTS];
            GNAME(q32_scales)(w, x, nx, b, h, scale);
            const VI bits = V_LOAD(w + R16_Q32_QS + 256 + AT4(h));
            for (int k = 0; k < 4; k++) {
                const VI v = V_LOAD(w + R16_Q32_QS + 64 * k + AT4(h));
                r16_prefetch_step(w, R16_Q5_0_BYTES, b, room, GROUP_PF_NX(nx), h * 4 + k, GH * 4);
                /* the fifth bits of lanes k and k + 4 moved to bit 4 (16-bit shifts: what crosses a byte is masked
                 * off) */
                const VI h_lo = V_SLLI16(bits, 4 - k), h_hi = V_SRLI16(bits, k);
                const VI q_lo = V_OR_AND(V_AND(v, low4), h_lo, fifth);
                const VI q_hi = V_OR_AND(V_AND(V_SRLI16(v, 4), low4), h_hi, fifth);
                for (int i = 0; i < nx; i++) {
                    acc[i][h][k] = GNAME(q32_lane)(acc[i][h][k], scale[i], q_lo, &x[i][b], k);
                    acc[i][h][k + 4] = GNAME(q32_lane)(acc[i][h][k + 4], scale[i], q_hi, &x[i][b], k + 4);
                }
            }
        }
    }
    GROUP_STORE
}

/* Q8_0's lane l for part h's rows (stored: their quants + 128, unsigned bytes) into input x's accumulator l. With
 * VNNI q32_lane (the input's offsets take the 128 back off). On AVX2 the unsigned quants (up to 255) would saturate
 * vpmaddubsw, so the signed quants (the top bit flipped back) go in as the rows' dot_s8 takes them: |q| times the
 * input with q's sign (|q| <= 128, |x| <= 127: no pair leaves int16), then vpmaddwd by ones. The same lane integer,
 * sum q x, then ROW_Q32's rounding: the same bits. */
GROUP_ISA static inline __attribute__((always_inline)) VF GNAME(q8_0_lane)(VF acc, VF scale, VI stored,
                                                                           const act_32 *x, int l) {
#ifdef GROUP_NO_VNNI
    const VI q = _mm256_xor_si256(stored, _mm256_set1_epi8((char)0x80));
    int32_t quad;
    memcpy(&quad, x->q + 4 * l, 4);
    const VI pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(_mm256_set1_epi32(quad), q));
    return F_FMADD(scale, F_CVT(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1))), acc);
#else
    return GNAME(q32_lane)(acc, scale, stored, x, l);
#endif
}

/* Q8_0: q8_0_lane per lane and input. */
GROUP_ISA static inline __attribute__((always_inline)) void GNAME(group_q8_0_r16)(const uint8_t *w,
                                                                                   const act_32 *const *x, int nx,
                                                                                   int64_t blocks, int64_t room,
                                                                                   float *out) {
    GROUP_ACCUMULATORS(R16_INPUTS)
    for (int64_t b = 0; b < blocks; b++, w += R16_Q8_0_BYTES) {
        for (int h = 0; h < GH; h++) {
            VF scale[R16_INPUTS];
            GNAME(q32_scales)(w, x, nx, b, h, scale);
            for (int l = 0; l < 8; l++) {
                const VI q = V_LOAD(w + R16_Q32_QS + 64 * l + AT4(h));
                r16_prefetch_step(w, R16_Q8_0_BYTES, b, room, GROUP_PF_NX(nx), h * 8 + l, GH * 8);
                for (int i = 0; i < nx; i++) acc[i][h][l] = GNAME(q8_0_lane)(acc[i][h][l], scale[i], q, &x[i][b], l);
            }
        }
    }
    GROUP_STORE
}

/* Each group function compiled for 1..R16_INPUTS inputs (Q4_K, Q6_K: 1..R16_K_INPUTS; the count a constant, as for
 * the row functions), and their tables: group_q4_k_r16_512_for[nx] and so on. */
#define GROUP_FN(NAME, ACT, N)                                                                                     \
    GROUP_ISA static void GCAT(NAME, N)(const uint8_t *w, const ACT *const *x, int64_t blocks, int64_t room,     \
                                        float *o) {                                                               \
        NAME(w, x, N, blocks, room, o);                                                                           \
    }
#define GROUP_TABLE(NAME, ACT, N) static void (*const GCAT(NAME, for)[N + 1])(const uint8_t *, const ACT *const *,  \
                                                                             int64_t, int64_t, float *)
#define GROUP_FNS4(NAME, ACT)                                                                                      \
    GROUP_FN(NAME, ACT, 1) GROUP_FN(NAME, ACT, 2) GROUP_FN(NAME, ACT, 3) GROUP_FN(NAME, ACT, 4)
#define SPECIALISE_GROUP(NAME, ACT)                                                                                \
    GROUP_FNS4(NAME, ACT)                                                                                          \
    GROUP_TABLE(NAME, ACT, R16_INPUTS) = {NULL, GCAT(NAME, 1), GCAT(NAME, 2), GCAT(NAME, 3), GCAT(NAME, 4)};
#define SPECIALISE_GROUP8(NAME, ACT)                                                                               \
    GROUP_FNS4(NAME, ACT)                                                                                          \
    GROUP_FN(NAME, ACT, 5) GROUP_FN(NAME, ACT, 6) GROUP_FN(NAME, ACT, 7) GROUP_FN(NAME, ACT, 8)                    \
    GROUP_TABLE(NAME, ACT, R16_K_INPUTS) = {NULL,          GCAT(NAME, 1), GCAT(NAME, 2), GCAT(NAME, 3),         \
                                              GCAT(NAME, 4), GCAT(NAME, 5), GCAT(NAME, 6), GCAT(NAME, 7),         \
                                              GCAT(NAME, 8)};
SPECIALISE_GROUP8(GNAME(group_q4_k_r16), act_k)
SPECIALISE_GROUP8(GNAME(group_q6_k_r16), act_k)
SPECIALISE_GROUP(GNAME(group_q5_0_r16), act_32)
SPECIALISE_GROUP(GNAME(group_q8_0_r16), act_32)

/* The 16 outputs of one group for nx inputs on its type's group function. */
GROUP_ISA static void GNAME(group_product)(int type, const uint8_t *w, const void **rows, int nx, int64_t blocks,
                                           int64_t room, float *out) {
    switch (type) {
    case Q4_K_R16: GCAT(GNAME(group_q4_k_r16), for)[nx](w, (const act_k *const *)rows, blocks, room, out); break;
    case Q6_K_R16: GCAT(GNAME(group_q6_k_r16), for)[nx](w, (const act_k *const *)rows, blocks, room, out); break;
    case Q5_0_R16: GCAT(GNAME(group_q5_0_r16), for)[nx](w, (const act_32 *const *)rows, blocks, room, out); break;
    default: GCAT(GNAME(group_q8_0_r16), for)[nx](w, (const act_32 *const *)rows, blocks, room, out); break;
    }
}

#undef GROUP_FN
#undef GROUP_TABLE
#undef GROUP_UNROLL
#undef GROUP_PF_NX
#undef GROUP_IN_ORDER
#undef Q4K_STEP
#undef Q4K_SCALED
#undef GROUP_FNS4
#undef SPECIALISE_GROUP
#undef SPECIALISE_GROUP8
#undef GROUP_ACCUMULATORS
#undef GROUP_STORE
#undef AT4
#undef AT2
#undef AT1
#undef GNAME
#undef GH
#undef GL
#undef VI
#undef VF
#undef V_LOAD
#undef V_AND
#undef V_SRLI16
#undef V_SLLI16
#undef V_SLLI32
#undef V_ADD32
#undef V_SUB32
#undef V_MULLO32
#undef V_DPBUSD
#undef V_DPWSSD
#undef V_MADDUBS
#undef V_SET1_8
#undef V_SET1_32
#undef V_ZERO
#undef V_OR_AND
#undef V_SHUFFLE8
#undef V_BROADCAST128
#undef V_U8_TO_32
#undef V_U8_TO_16
#undef V_I8_TO_16
#undef F_HALVES
#undef F_ZERO
#undef F_SET1
#undef F_MUL
#undef F_ADD
#undef F_FMADD
#undef F_FNMADD
#undef F_CVT
#undef F_STORE
