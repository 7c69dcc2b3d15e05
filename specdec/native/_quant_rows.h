/* The K-quant row functions (one weight row in the file's layout times up to ROW_GROUP inputs) on 256-bit registers,
 * included by _quant_kernels.h twice: for the avx2 kernel (16 registers: Q4_K up to GROUP 4 inputs, Q6_K up to
 * Q6K_AVX2_ROW_GROUP 6; each pair sum multiplied by its scale and added, vpmaddwd + vpaddd) and for avx512-vnni-256
 * (ROW_GROUP 8: 32 registers; vpdpwssd, the same multiply and add in one instruction). The integers are exact either
 * way and the float epilogue is shared (q4k_keep / q4k_flush_all, q6k_accumulate): the same bits. ROW_IN_ORDER keeps
 * Q6_K's additions in the written order on avx2 (GROUP_IN_ORDER, _quant_groups.h; AMD EPYC Zen 3, one thread, in L2:
 * 18 / 30 / 33 against 15 / 27 / 27 G multiply-adds a second at 1 / 3 / 4 inputs, eighteenth run); Q4_K's rows keep
 * theirs as they were (Q4_K runs in groups on avx2). No include guard: included twice on purpose. */
ROW_ISA static inline __attribute__((always_inline)) void ROW_NAME(row_q4_k)(const uint8_t *w, const act_k *const *x,
                                                                            int nx, int64_t K, int64_t left,
                                                                            float *out) {
    __m256 acc[ROW_GROUP];
    q4k_stash stash[ROW_GROUP];
    q4k_lanes one = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int i = 0; i < nx; i++) acc[i] = _mm256_setzero_ps();
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    for (int64_t b = 0; b < K / QK; b++, w += 144, left -= 144) {
        row_prefetch(w, 144, left);
        const int slot = (int)(b & 7);
        if (nx == 1) q4k_scales_next(&one, w, slot, &x[0][b]);
        const __m256i scales_mins = q4k_scales_mins(w + 4);
        const __m256i scales = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(scales_mins));
        const __m128i min8 = _mm256_extracti128_si256(scales_mins, 1);
        __m256i sums[ROW_GROUP];
        for (int i = 0; i < nx; i++) sums[i] = _mm256_setzero_si256();
        for (int p = 0; p < 4; p++) {
            const __m256i bytes = _mm256_loadu_si256((const __m256i *)(w + 16 + 32 * p));
            const __m256i lo = _mm256_and_si256(bytes, low4), hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low4);
            const __m256i s_lo = _mm256_shuffle_epi8(scales, _mm256_load_si256((const __m256i *)PAIR[2 * p]));
            const __m256i s_hi = _mm256_shuffle_epi8(scales, _mm256_load_si256((const __m256i *)PAIR[2 * p + 1]));
            for (int i = 0; i < nx; i++) {
                const int8_t *q = x[i][b].q + 64 * p;
                const __m256i a = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)q));
                const __m256i c = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(q + 32)));
                sums[i] = ROW_MADD(ROW_MADD(sums[i], a, s_lo), c, s_hi);
            }
        }
        for (int i = 0; i < nx; i++) q4k_keep(&stash[i], slot, &x[i][b], sums[i], min8);
        q4k_flush_all(stash, &one, w, x, nx, b, K / QK, acc);
    }
    for (int i = 0; i < nx; i++) out[i] = hsum8(acc[i]);
}

ROW_ISA static inline __attribute__((always_inline)) void ROW_NAME(row_q6_k)(const uint8_t *w, const act_k *const *x,
                                                                            int nx, int64_t K, int64_t left,
                                                                            float *out) {
    __m256 acc[ROW_GROUP];
    for (int i = 0; i < nx; i++) acc[i] = _mm256_setzero_ps();
    const __m256i low4 = _mm256_set1_epi8(0x0F), top2 = _mm256_set1_epi8(0x30);
    for (int64_t b = 0; b < K / QK; b++, w += 210, left -= 210) {
        row_prefetch(w, 210, left);
        const uint8_t *ql = w, *qh = w + 128;
        const __m128i scales8 = _mm_loadu_si128((const __m128i *)(w + 192));
        const float d = half(w + 208);
        const __m256i scale16 = _mm256_cvtepi8_epi16(scales8);
        const __m256i scales_twice = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(w + 192)));
        const __m256i scale_minus32 = q6k_scales_minus32(scale16);
        __m256i sums[ROW_GROUP];
        for (int i = 0; i < nx; i++) sums[i] = q6k_offset(&x[i][b], scale_minus32);
        for (int h = 0; h < 2; h++) {
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)(ql + 64 * h));
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 64 * h + 32));
            const __m256i hb = _mm256_loadu_si256((const __m256i *)(qh + 32 * h));
            /* the four 32-value pieces of this half, quants 0..63: each piece's two top bits moved to bits 4-5 by
             * one 16-bit shift and masked (what crosses a byte is masked off) */
            __m256i piece[4];
            piece[0] = _mm256_or_si256(_mm256_and_si256(l0, low4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), top2));
            piece[1] = _mm256_or_si256(_mm256_and_si256(l1, low4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), top2));
            piece[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4), _mm256_and_si256(hb, top2));
            piece[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                                       _mm256_and_si256(_mm256_srli_epi16(hb, 2), top2));
            for (int s = 0; s < 4; s++) {
                const int t = 4 * h + s; /* values 32t .. 32t + 31: scales 2t and 2t + 1 */
                const __m256i scale = _mm256_srai_epi16(
                    _mm256_shuffle_epi8(scales_twice, _mm256_load_si256((const __m256i *)Q6K_PIECE_SCALES[t])), 8);
                for (int i = 0; i < nx; i++) {
                    const __m256i p = _mm256_maddubs_epi16(piece[s], _mm256_loadu_si256((const __m256i *)(x[i][b].q + 32 * t)));
                    sums[i] = ROW_MADD(sums[i], p, scale);
                    ROW_IN_ORDER(sums[i]);
                }
            }
        }
        const __m256 dv = _mm256_set1_ps(d);
        for (int i = 0; i < nx; i++) q6k_accumulate(&acc[i], dv, &x[i][b], sums[i]);
    }
    for (int i = 0; i < nx; i++) out[i] = hsum8(acc[i]);
}
