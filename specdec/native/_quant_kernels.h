/* Products of GGUF-quantized weights with the few activation rows of a decoding step or a verify pass, and the
 * weights' exact dequantisation (x86: AVX2 + FMA + F16C; AVX-512 VNNI and AMX where the CPU has them).
 *
 * Weights stay in the file's ggml blocks: Q4_K (256 values: fp16 d, dmin; 6-bit scale and min per 32; 4-bit quants),
 * Q6_K (256: 4+2-bit quants, int8 scale per 16, fp16 d), Q5_0 (32: fp16 d, 5-bit quants), Q8_0 (32: fp16 d, int8).
 * Each activation row is quantised on its own to 8 bits: per 256 values (for the K-quants, with the sum of every 16
 * for their offsets) or per 32 (for Q5_0 and Q8_0). A block's dot product runs in integers (maddubs/madd: exact, in
 * any order); each output's float accumulation is one 8-lane vector updated block after block (Q4_K: block b into
 * lane b mod 8, from the block's two exact integer totals, q4k_flush), then one horizontal sum, in an order that
 * depends only on K. So a row's result is
 * the same bits whichever rows share the call, however they are grouped, on any thread count (threads split the
 * output rows): the batch invariance a verify pass needs to equal one-token steps (tests/test_quant.py).
 *
 * Memory: output rows are the outer loop, inputs the inner one, in groups of up to four (AVX2) or eight (AVX-512)
 * that share each unpacked piece of the weight row; a row (at most a few kilobytes) is read from memory once per call
 * whatever the number of inputs, and the bytes 1 KB ahead of it are prefetched while it is multiplied.
 *
 * Four kernels, the same bits: AVX2 (any x86 CPU with AVX2, FMA, F16C), AVX-512 BW/VL/VNNI where the CPU has it on
 * 256-bit registers (avx512-vnni-256: _quant_rows.h, _quant_groups.h) and on 512-bit ones (below: the same integer
 * lanes and the same float epilogue), and AMX (AVX-512 rows, and Q4_K passes on tiles that form the same integers:
 * from 3 rows in the file's layout, from 13 in groups of 16); the caller names one (kernel_supported;
 * specdec/gguf/kernel_plan.py measures them).
 *
 * Dequantisation reproduces the gguf package's reference formulas operation by operation (this file is built with
 * -ffp-contract=off: no multiply-add is fused unless written so), bit for bit.
 */
#ifndef SPECDEC_QUANT_KERNELS_H
#define SPECDEC_QUANT_KERNELS_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <omp.h>
#include <string.h>
#include "_simd.h"

#define QK 256   /* values per K-quant block */
#define Q32 32   /* values per Q5_0 / Q8_0 block, and per activation block for them */
#define GROUP 4     /* inputs that share each unpacked weight piece (AVX2: 16 vector registers) */
#define GROUP512 8  /* the same with AVX-512 (32 registers) */
/* Q6_K's avx2 rows: one integer register an input (the float accumulators change once a block and can wait in
 * memory), so six inputs share each unpacked piece, and a verify pass of 5 or 6 positions (k 4, 5) is one pass over
 * the weights instead of 3 + 2 or 3 + 3 (GROUP). AMD EPYC Zen 3, the 1.5B's whole passes, builds alternated in one
 * process (72 passes a cell): at 5 positions 0.953 [0.902, 1.003] of the time, at 6 0.965, at 1 and 4 alike; with
 * every position's logits (the argmax head) 0.947 and 0.932 (experiments/cpu-lead, twentieth run). */
#define Q6K_AVX2_ROW_GROUP 6
/* How far ahead of the block being multiplied a row function asks for the weights, in bytes. Asked block by block
 * inside the row, the reading overlaps the arithmetic across a long row too: the former ask, a whole row's bytes 1 KB
 * ahead at the row's start, left the 8960-wide ffn_down rows (7 KB) waiting on memory. AMD EPYC Zen 4, in one
 * process, alternating: the 14 Q6_K ffn_down products at 1 row 4.8 against 6.1 ms (33 against 26 GB/s), at 3 rows
 * 8.2 against 10.8; the Q4_K ones 3.7 against 4.9; 1, 2, 4 and 8 KB ahead alike within 5%, the head alike
 * (experiments/cpu-lead, seventh run). */
#define ROW_AHEAD 2048

/* The prefetch helpers below are always inlined. Left to GCC 12, a helper called from a large function stayed out of
 * line, and the call was then removed: a function whose only effect is a prefetch has none the compiler can see.
 * Build 6524d8c5ae4a-... had no prefetch instruction in 84 of the 124 functions that ask for one: the 64 row
 * functions, the argmax head's 12 over rows and the 8 one-input group functions. AMD EPYC Zen 5, one process,
 * interleaved: the 1.5B's Q6_K head in groups at one row 9.6 ms, with the prefetch 5.4; its 28 ffn_down at five
 * rows in the file's rows 28 against 17 ms (experiments/cpu-lead, fifteenth run). tests/test_quant.py checks the
 * built functions for the instruction. */
#define PREFETCH_HELPER static inline __attribute__((always_inline))

/* Asks for the block_bytes at ROW_AHEAD past block w's start, as far as they lie inside the matrix (left: its bytes
 * from w on). A prefetch changes no value. */
PREFETCH_HELPER void row_prefetch(const uint8_t *w, int block_bytes, int64_t left) {
    for (int off = 0; off < block_bytes && ROW_AHEAD + off < left; off += 64)
        _mm_prefetch((const char *)(w + ROW_AHEAD + off), _MM_HINT_T0);
}

/* Q4_K_R16 .. Q8_0_R16: the blocks repacked in groups of 16 rows (below, "Q4_K in groups of 16 rows" and after):
 * 148, 210, 22 and 34 bytes per row and block on average, every value kept. */
enum qtype { Q4_K, Q6_K, Q5_0, Q8_0, F32, F16, Q4_K_R16, Q6_K_R16, Q5_0_R16, Q8_0_R16, N_TYPES };
static const char *TYPE_NAMES[N_TYPES] = {"Q4_K", "Q6_K", "Q5_0", "Q8_0", "F32", "F16",
                                          "Q4_K_R16", "Q6_K_R16", "Q5_0_R16", "Q8_0_R16"};
static const int BLOCK_VALUES[N_TYPES] = {256, 256, 32, 32, 1, 1, 256, 256, 32, 32};
static const int BLOCK_BYTES[N_TYPES] = {144, 210, 22, 34, 4, 2, 148, 210, 22, 34};

/* The product kernels, best last: which one runs is the caller's choice among those the CPU supports
 * (kernel_supported); all give the same bits. */
enum kernel { KERNEL_AVX2, KERNEL_AVX512_256, KERNEL_AVX512_VNNI, KERNEL_AMX, N_KERNELS };
static const char *KERNEL_NAMES[N_KERNELS] = {"avx2", "avx512-vnni-256", "avx512-vnni", "amx"};

/* The kernel code of a name, or -1 for a name that is none of KERNEL_NAMES (whether this CPU runs it aside). */
static inline int kernel_by_name(const char *name) {
    for (int k = 0; k < N_KERNELS; k++)
        if (!strcmp(name, KERNEL_NAMES[k])) return k;
    return -1;
}

#ifdef SPECDEC_X86
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#define SPECDEC_ARCH_REQ_XCOMP_PERM 0x1023 /* Linux: ask for the AMX tile state (asm/prctl.h) */
#define SPECDEC_XFEATURE_XTILEDATA 18

/* Whether the CPU has AMX-TILE and AMX-INT8 and Linux lets this process use them (asked once per process). */
static int amx_usable(void) {
    static int usable = -1;
    if (usable < 0) {
        unsigned a, b, c, d;
        const int cpu = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 24 & 1) && (d >> 25 & 1);
        usable = cpu && syscall(SYS_arch_prctl, SPECDEC_ARCH_REQ_XCOMP_PERM, SPECDEC_XFEATURE_XTILEDATA) == 0;
    }
    return usable;
}

#endif

static inline int kernel_supported(int kernel) {
#ifdef SPECDEC_X86
    if (kernel == KERNEL_AVX2) return specdec_avx2_supported();
    if (kernel == KERNEL_AVX512_VNNI)
        return specdec_avx2_supported() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
    if (kernel == KERNEL_AVX512_256) return kernel_supported(KERNEL_AVX512_VNNI); /* the same instructions on ymm */
    if (kernel == KERNEL_AMX) return kernel_supported(KERNEL_AVX512_VNNI) && amx_usable();
#endif
    return 0;
}

/* Activations quantised for the K-quants: one per 256 values. */
typedef struct {
    float d;
    int16_t sums[16];   /* the sum of every 16 quants (Q6_K's offsets) */
    int16_t sums32[8];  /* the sum of every 32 (Q4_K's mins: formed once per input, not once per weight block) */
    int8_t q[QK];
} act_k;

/* Activations quantised for Q5_0 / Q8_0: one per 32 values. */
typedef struct {
    float d;
    int8_t q[Q32];
    /* Q5_0: -16 x the sum of every 4 quants. The AVX-512 kernel multiplies Q5_0's weights as unsigned bytes (the
     * signed value + 16) and starts each lane's sum here, which leaves exactly the signed products' sum */
    int32_t offsets[8];
} act_32;

#ifdef SPECDEC_X86
#define TARGET AVX2

TARGET static inline float half(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* --- dequantisation: the gguf package's formulas, operation by operation -------------------------------------- */
static void q4k_scale_min(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 2) & 0x30);
        *m = (s[j + 4] >> 4) | ((s[j] >> 2) & 0x30);
    }
}

TARGET static void dequantize_row(int type, const uint8_t *w, float *y, int64_t K) {
    const int64_t blocks = K / BLOCK_VALUES[type];
    for (int64_t b = 0; b < blocks; b++, w += BLOCK_BYTES[type]) {
        switch (type) {
        case Q4_K: {
            const float d = half(w), dmin = half(w + 2);
            for (int j = 0; j < 8; j++) {
                int sc, m;
                q4k_scale_min(w + 4, j, &sc, &m);
                const float dl = d * (float)sc, ml = dmin * (float)m;
                const uint8_t *qs = w + 16 + 32 * (j / 2);
                for (int l = 0; l < 32; l++) {
                    const int q = j % 2 ? qs[l] >> 4 : qs[l] & 0x0F;
                    *y++ = dl * (float)q - ml;
                }
            }
            break;
        }
        case Q6_K: {
            const uint8_t *ql = w, *qh = w + 128;
            const int8_t *scales = (const int8_t *)(w + 192);
            const float d = half(w + 208);
            for (int v = 0; v < QK; v++) {
                const int h = v / 128, r = v % 128;
                const int low = r < 64 ? ql[64 * h + r] & 0x0F : ql[64 * h + r - 64] >> 4;
                const int high = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
                *y++ = (d * (float)scales[v / 16]) * (float)((low | (high << 4)) - 32);
            }
            break;
        }
        case Q5_0: {
            const float d = half(w);
            uint32_t qh;
            memcpy(&qh, w + 2, 4);
            for (int v = 0; v < Q32; v++) {
                const int low = v < 16 ? w[6 + v] & 0x0F : w[6 + v - 16] >> 4;
                *y++ = d * (float)((low | (int)(((qh >> v) & 1) << 4)) - 16);
            }
            break;
        }
        case Q8_0: {
            const float d = half(w);
            for (int v = 0; v < Q32; v++) *y++ = (float)(int8_t)w[2 + v] * d;
            break;
        }
        case F32:
            memcpy(y++, w, 4);
            break;
        case F16:
            *y++ = half(w);
            break;
        }
    }
}

/* --- Q4_K in groups of 16 rows (Q4_K_R16) ------------------------------------------------------------------------
 * The row code forms each block's integers in vector lanes that belong to one output and must add them across lanes
 * (q4k_flush) and apply the block's scales lane by lane: with one input that epilogue is most of a block's work, and
 * a one-token step's Q4_K products ran compute-bound (a block 23-30 cycles, ~20 GB/s a thread against ~45 GB/s of
 * memory; docs/quantized.md). Repacked so that a 512-bit register holds four bytes of each of 16 rows, every int32
 * lane belongs to one output row: vpdpbusd multiplies the 4-bit quants (unsigned) with four broadcast input quants
 * and the lane sums stay the row's, with no sum across lanes; a block's scales, mins and d of 16 rows are one vector
 * each. The integers per row and block (S, Mn) are the same exact integers as the row code's, and the float epilogue
 * is q4k_flush's operation for operation with the 16 rows in lanes and its eight slots (block b mod 8) as eight
 * accumulators, so a row's result is the same bits in either layout (tests/test_quant.py).
 *
 * A group's block (2368 bytes, 148 a row): d and dmin of the 16 rows (fp16, as the file holds them), the rows' eight
 * 6-bit scales (a byte each, [sub-block][row]) and eight mins (bytes, [pair of sub-blocks][row][2]), then the quants:
 * for each of the block's four 32-byte chunks and each 4-byte quad of it, the 16 rows' four bytes. Groups follow one
 * another, each its blocks in order. Every byte of the file's blocks is kept (q4k_unpack_block gives them back). */
#define R16 16
#define R16_Q4K_BYTES (R16 * 148)
#define R16_D 0
#define R16_DMIN 32
#define R16_SCALES 64
#define R16_MINS 192
#define R16_QS 320

/* Every block of every row of N rows (a multiple of 16) of K values: fn(the row's block in the file's layout, its
 * group's block, the row within the group) over `blocks` blocks a row. The converters below move one row's block each
 * way. */
static void r16_each_block(uint8_t *rows, uint8_t *groups, int64_t N, int64_t blocks, int row_block_bytes,
                           int group_block_bytes, void (*fn)(uint8_t *, uint8_t *, int)) {
    const int64_t row = blocks * row_block_bytes;
    for (int64_t g = 0; g < N / R16; g++)
        for (int64_t b = 0; b < blocks; b++)
            for (int r = 0; r < R16; r++)
                fn(rows + (g * R16 + r) * row + b * row_block_bytes, groups + (g * blocks + b) * group_block_bytes, r);
}

/* Where row r's scale j and min j sit in a Q4_K group's block. */
static inline int q4k_r16_scale_at(int j, int r) { return R16_SCALES + R16 * j + r; }
static inline int q4k_r16_min_at(int j, int r) { return R16_MINS + 2 * R16 * (j / 2) + 2 * r + j % 2; }

/* Row r's Q4_K block w (144 bytes) into its group's block o. */
static void q4k_pack_block(uint8_t *w, uint8_t *o, int r) {
    memcpy(o + R16_D + 2 * r, w, 2);
    memcpy(o + R16_DMIN + 2 * r, w + 2, 2);
    for (int j = 0; j < 8; j++) {
        int sc, m;
        q4k_scale_min(w + 4, j, &sc, &m);
        o[q4k_r16_scale_at(j, r)] = (uint8_t)sc;
        o[q4k_r16_min_at(j, r)] = (uint8_t)m;
    }
    for (int p = 0; p < 4; p++)
        for (int t = 0; t < 8; t++) memcpy(o + R16_QS + 512 * p + 64 * t + 4 * r, w + 16 + 32 * p + 4 * t, 4);
}

/* The inverse, byte for byte (the 12 packed scale bytes hold exactly the sixteen 6-bit values: q4k_scale_min read
 * backwards). */
static void q4k_unpack_block(uint8_t *w, uint8_t *o, int r) {
    int sc[8], m[8];
    for (int j = 0; j < 8; j++) {
        sc[j] = o[q4k_r16_scale_at(j, r)];
        m[j] = o[q4k_r16_min_at(j, r)];
    }
    memcpy(w, o + R16_D + 2 * r, 2);
    memcpy(w + 2, o + R16_DMIN + 2 * r, 2);
    for (int j = 0; j < 4; j++) {
        w[4 + j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
        w[8 + j] = (uint8_t)(m[j] | (m[j + 4] >> 4) << 6);
        w[12 + j] = (uint8_t)((sc[j + 4] & 15) | (m[j + 4] & 15) << 4);
    }
    for (int p = 0; p < 4; p++)
        for (int t = 0; t < 8; t++) memcpy(w + 16 + 32 * p + 4 * t, o + R16_QS + 512 * p + 64 * t + 4 * r, 4);
}

/* --- Q6_K in groups of 16 rows (Q6_K_R16) ------------------------------------------------------------------------
 * The same idea for Q6_K (the target's LM head and half its ffn_down and attn_v). The row code's float epilogue is
 * per lane, not per block: lane l of a block's eight int32 lanes holds, over the block's eight 32-value pieces t,
 * scale[2t + (l >= 4)] times the products of values 32t + 4l .. 32t + 4l + 3, less 32 x (scale[2l] x the input's sum
 * of values 32l..32l+15 + scale[2l + 1] x that of the next 16), and enters accumulator l as (d x the input's scale)
 * times it, rounded once; the output is hsum8 of the eight. Grouped, a register holds the four values 32t + 4l + c
 * of 16 rows, so vpmaddubsw with the four broadcast input quants and vpdpwssd with the rows' scales give each row's
 * lane l exactly, and the eight accumulators hold the 16 rows in their lanes: the same bits (tests/test_quant.py).
 *
 * A group's block (3360 bytes, 210 a row: the file's size): d of the 16 rows (fp16), the rows' sixteen int8 scales
 * ([pair j / 2][row][j mod 2]), then per piece t (384 bytes): four registers of low nibbles (byte 4r + c: value
 * 32t + 4k + c of row r in the low nibble, 32t + 4(k + 4) + c in the high one, k = 0..3) and two of the quants' top
 * two bits (value 32t + 4(4h + k) + c's at bits 2k..2k+1 of byte 4r + c of register h). */
#define R16_Q6K_BYTES (R16 * 210)
#define R16_Q6K_D 0
#define R16_Q6K_SCALES 32
#define R16_Q6K_QS 288

/* A Q6_K block's 6-bit quant of value v (0..63; the gguf package's layout), and its setter (on cleared bits). */
static inline int q6k_quant(const uint8_t *w, int v) {
    const int h = v / 128, r = v % 128;
    const int low = r < 64 ? w[64 * h + r] & 0x0F : w[64 * h + r - 64] >> 4;
    return low | ((w[128 + 32 * h + r % 32] >> (2 * (r / 32))) & 3) << 4;
}
static inline void q6k_set_quant(uint8_t *w, int v, int q) {
    const int h = v / 128, r = v % 128;
    w[r < 64 ? 64 * h + r : 64 * h + r - 64] |= (uint8_t)((q & 0x0F) << (r < 64 ? 0 : 4));
    w[128 + 32 * h + r % 32] |= (uint8_t)((q >> 4) << (2 * (r / 32)));
}

/* The same in a group's piece (its 384 bytes): lane l's value c of row r, at byte 4r + c of the nibble register
 * l mod 4 (low nibble for l < 4) and of the top-bits register l / 4 (bits 2(l mod 4)..). */
static inline int q6k_r16_quant(const uint8_t *piece, int l, int byte) {
    return ((piece[64 * (l % 4) + byte] >> (l < 4 ? 0 : 4)) & 0x0F) |
           ((piece[256 + 64 * (l / 4) + byte] >> (2 * (l % 4))) & 3) << 4;
}
static inline void q6k_r16_set_quant(uint8_t *piece, int l, int byte, int q) {
    piece[64 * (l % 4) + byte] |= (uint8_t)((q & 0x0F) << (l < 4 ? 0 : 4));
    piece[256 + 64 * (l / 4) + byte] |= (uint8_t)((q >> 4) << (2 * (l % 4)));
}

/* Row r's Q6_K block w (210 bytes) into its group's block o (cleared by the group's first row: the quants are
 * or-ed in). */
static void q6k_pack_block(uint8_t *w, uint8_t *o, int r) {
    if (r == 0) memset(o, 0, R16_Q6K_BYTES);
    memcpy(o + R16_Q6K_D + 2 * r, w + 208, 2);
    for (int j = 0; j < 16; j++) o[R16_Q6K_SCALES + 2 * R16 * (j / 2) + 2 * r + j % 2] = w[192 + j];
    for (int t = 0; t < 8; t++)
        for (int l = 0; l < 8; l++)
            for (int c = 0; c < 4; c++)
                q6k_r16_set_quant(o + R16_Q6K_QS + 384 * t, l, 4 * r + c, q6k_quant(w, 32 * t + 4 * l + c));
}

/* The inverse, byte for byte. */
static void q6k_unpack_block(uint8_t *w, uint8_t *o, int r) {
    memset(w, 0, 192);
    memcpy(w + 208, o + R16_Q6K_D + 2 * r, 2);
    for (int j = 0; j < 16; j++) w[192 + j] = o[R16_Q6K_SCALES + 2 * R16 * (j / 2) + 2 * r + j % 2];
    for (int t = 0; t < 8; t++)
        for (int l = 0; l < 8; l++)
            for (int c = 0; c < 4; c++)
                q6k_set_quant(w, 32 * t + 4 * l + c, q6k_r16_quant(o + R16_Q6K_QS + 384 * t, l, 4 * r + c));
}

/* --- Q5_0 and Q8_0 in groups of 16 rows (Q5_0_R16, Q8_0_R16) ------------------------------------------------------
 * The 0.5B draft's file is mostly Q5_0 (and its head Q8_0), whose row code ran a one-row product at 11-24 GB/s on the
 * AMD EPYC Zen 5 (bench/quant_kernel.py), a draft step's layers at ~24 GB/s against the target's ~35: per row and
 * block it unpacks 32 quants and their fifth bits and broadcasts one scale for eight lanes. The row code's epilogue
 * (ROW_Q32) is per lane: lane l of a block's eight int32 lanes holds the products of values 4l..4l+3, enters
 * accumulator l as (d x the input's d) times it, rounded once, and the output is hsum8 of the eight. Grouped like
 * Q6_K, a register holds values 4l..4l+3 of 16 rows (byte 4r + c: value 4l + c of row r), so one vpdpbusd with the
 * four broadcast input quants gives lane l for all 16 rows at once, and the eight accumulators hold the 16 rows in
 * their lanes: the same bits (tests/test_quant.py). The quants enter as unsigned bytes (Q5_0's 5-bit value, Q8_0's
 * plus 128) and each lane's sum starts at the input's offset (-16 or -128 x the sum of its four quants), which
 * leaves exactly the signed products' sum, as row_q5_0_512 does.
 *
 * A Q5_0 group's block (352 bytes, 22 a row): d of the 16 rows (fp16), four registers of low four bits (register k,
 * byte 4r + c: value 4k + c of row r in the low nibble, value 4(k + 4) + c in the high one) and one of fifth bits
 * (byte 4r + c, bit l: value 4l + c's). A Q8_0 group's block (544 bytes, 34 a row): d of the 16 rows, then eight
 * registers (register l, byte 4r + c: value 4l + c of row r, plus 128). */
#define R16_Q32_QS 32 /* the quants after the 16 rows' d */
#define R16_Q5_0_BYTES (R16 * 22)
#define R16_Q8_0_BYTES (R16 * 34)

/* A Q5_0 block's 5-bit quant of value v (0..31, the signed value + 16), and its setter (on cleared bits). */
static inline int q5_0_quant(const uint8_t *w, int v) {
    const int low = v < 16 ? w[6 + v] & 0x0F : w[6 + v - 16] >> 4;
    return low | ((w[2 + v / 8] >> (v % 8)) & 1) << 4;
}
static inline void q5_0_set_quant(uint8_t *w, int v, int q) {
    w[6 + v % 16] |= (uint8_t)((q & 0x0F) << (v < 16 ? 0 : 4));
    w[2 + v / 8] |= (uint8_t)((q >> 4) << (v % 8));
}

/* The same in a group's block: lane l's value c of row r (byte 4r + c). */
static inline int q5_0_r16_quant(const uint8_t *o, int l, int byte) {
    return ((o[R16_Q32_QS + 64 * (l % 4) + byte] >> (l < 4 ? 0 : 4)) & 0x0F) |
           ((o[R16_Q32_QS + 256 + byte] >> l) & 1) << 4;
}
static inline void q5_0_r16_set_quant(uint8_t *o, int l, int byte, int q) {
    o[R16_Q32_QS + 64 * (l % 4) + byte] |= (uint8_t)((q & 0x0F) << (l < 4 ? 0 : 4));
    o[R16_Q32_QS + 256 + byte] |= (uint8_t)((q >> 4) << l);
}

/* Row r's Q5_0 block w (22 bytes) into its group's block o (cleared by the group's first row), and back. */
static void q5_0_pack_block(uint8_t *w, uint8_t *o, int r) {
    if (r == 0) memset(o, 0, R16_Q5_0_BYTES);
    memcpy(o + 2 * r, w, 2);
    for (int l = 0; l < 8; l++)
        for (int c = 0; c < 4; c++) q5_0_r16_set_quant(o, l, 4 * r + c, q5_0_quant(w, 4 * l + c));
}
static void q5_0_unpack_block(uint8_t *w, uint8_t *o, int r) {
    memset(w, 0, 22);
    memcpy(w, o + 2 * r, 2);
    for (int l = 0; l < 8; l++)
        for (int c = 0; c < 4; c++) q5_0_set_quant(w, 4 * l + c, q5_0_r16_quant(o, l, 4 * r + c));
}

/* Row r's Q8_0 block w (34 bytes) into its group's block o, and back. */
static void q8_0_pack_block(uint8_t *w, uint8_t *o, int r) {
    memcpy(o + 2 * r, w, 2);
    for (int l = 0; l < 8; l++)
        for (int c = 0; c < 4; c++) o[R16_Q32_QS + 64 * l + 4 * r + c] = (uint8_t)(w[2 + 4 * l + c] ^ 0x80);
}
static void q8_0_unpack_block(uint8_t *w, uint8_t *o, int r) {
    memcpy(w, o + 2 * r, 2);
    for (int l = 0; l < 8; l++)
        for (int c = 0; c < 4; c++) w[2 + 4 * l + c] = (uint8_t)(o[R16_Q32_QS + 64 * l + 4 * r + c] ^ 0x80);
}

/* The file's row type of a grouped type, and -1 for a type that is not grouped. */
static int row_type_of(int grouped) {
    switch (grouped) {
    case Q4_K_R16: return Q4_K;
    case Q6_K_R16: return Q6_K;
    case Q5_0_R16: return Q5_0;
    case Q8_0_R16: return Q8_0;
    default: return -1;
    }
}
static int is_grouped(int type) { return row_type_of(type) >= 0; }

/* Rows of `type` (Q4_K, Q6_K, Q5_0 or Q8_0) to groups of 16 rows (pack) or back. src is only read (the walk takes both
 * sides as writable: one of them is, by direction). */
static void r16_convert(int type, int pack, const uint8_t *src, uint8_t *dst, int64_t N, int64_t K) {
    void (*const packs[4])(uint8_t *, uint8_t *, int) = {q4k_pack_block, q6k_pack_block, q5_0_pack_block,
                                                          q8_0_pack_block};
    void (*const unpacks[4])(uint8_t *, uint8_t *, int) = {q4k_unpack_block, q6k_unpack_block, q5_0_unpack_block,
                                                            q8_0_unpack_block};
    _Static_assert(Q8_0_R16 - Q4_K_R16 == Q8_0 - Q4_K, "the grouped types follow the row types' order");
    const int grouped = Q4_K_R16 + type;
    const int64_t blocks = K / BLOCK_VALUES[type];
    const int row_bytes = BLOCK_BYTES[type], group_bytes = R16 * BLOCK_BYTES[grouped];
    if (pack)
        r16_each_block((uint8_t *)src, dst, N, blocks, row_bytes, group_bytes, packs[type]);
    else
        r16_each_block(dst, (uint8_t *)src, N, blocks, row_bytes, group_bytes, unpacks[type]);
}

/* --- activations, one row at a time ------------------------------------------------------------------------------ */
TARGET static float absmax(const float *x, int64_t n) {
    __m256 m = _mm256_setzero_ps();
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < n; i += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
    __m128 v = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    v = _mm_max_ps(v, _mm_movehl_ps(v, v));
    v = _mm_max_ss(v, _mm_movehdup_ps(v));
    return _mm_cvtss_f32(v);
}

/* n values (a multiple of 8) -> int8 q = round(x * 127 / amax) (to nearest, ties to even), d = amax / 127. Each
 * int32 is cut to its low byte, as a cast to int8 cuts it (not saturated: a NaN's INT_MIN gives 0, as it always
 * did); eight at a time in registers rather than through a stored array and eight scalar moves. */
TARGET static float quantize_values(const float *x, int8_t *q, int64_t n) {
    const float amax = absmax(x, n);
    const float inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
    const __m256 scale = _mm256_set1_ps(inverse);
    const __m256i low_bytes = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, /* lanes */
                                               0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i both_halves = _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0); /* the two halves' four bytes, adjacent */
    for (int64_t i = 0; i < n; i += 8) {
        const __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i), scale));
        const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(v, low_bytes), both_halves);
        _mm_storel_epi64((__m128i *)(q + i), _mm256_castsi256_si128(bytes));
    }
    return amax / 127.0f;
}

/* The sums of every 4 of 32 quants: int32 lane l holds quants 4l..4l+3 (so the first 16's in lanes 0-3, the second
 * 16's in 4-7). quantize_row_32's offsets and quantize_row_k's sums per 16 both start from it. */
TARGET static inline __m256i piece_fours(const int8_t *q) {
    const __m256i v = _mm256_loadu_si256((const __m256i *)q);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), v), _mm256_set1_epi16(1));
}

/* Four pieces' sums per 16: lanes 0-3 the pieces' first 16s, lanes 4-7 their second 16s. */
TARGET static inline __m256i four_pieces(const int8_t *q) {
    return _mm256_hadd_epi32(_mm256_hadd_epi32(piece_fours(q), piece_fours(q + 32)),
                             _mm256_hadd_epi32(piece_fours(q + 64), piece_fours(q + 96)));
}

/* A block's sums per 16 and per 32 in registers (integers: the same values in any order; each at most 16 x 128 or
 * 32 x 128, so the packs to int16 never saturate). With quantize_values' bytes in registers, a row of 8960 values
 * takes 3.5 us against 12.3 on one core, the same bytes (AMD EPYC Zen 3, nineteenth run: the former and this code
 * on 20,000 rows of random, tied, tiny, huge, infinite, NaN and arbitrary-bit values). A pass quantises ~0.4 M
 * values a position, on one thread while the other waits. */
TARGET static void quantize_row_k(const float *x, act_k *y, int64_t K) {
    for (int64_t b = 0; b < K / QK; b++) {
        y[b].d = quantize_values(x + b * QK, y[b].q, QK);
        /* int16 lanes: the low half 16s 0, 2, .., 14, the high half 16s 1, 3, .., 15 */
        const __m256i words = _mm256_packs_epi32(four_pieces(y[b].q), four_pieces(y[b].q + 128));
        const __m128i even = _mm256_castsi256_si128(words), odd = _mm256_extracti128_si256(words, 1);
        _mm_storeu_si128((__m128i *)y[b].sums, _mm_unpacklo_epi16(even, odd));
        _mm_storeu_si128((__m128i *)(y[b].sums + 8), _mm_unpackhi_epi16(even, odd));
        _mm_storeu_si128((__m128i *)y[b].sums32, _mm_add_epi16(even, odd));
    }
}

TARGET static void quantize_row_32(const float *x, act_32 *y, int64_t K, int offset) {
    for (int64_t b = 0; b < K / Q32; b++) {
        y[b].d = quantize_values(x + b * Q32, y[b].q, Q32);
        if (!offset) continue;
        const __m256i offsets = _mm256_mullo_epi32(piece_fours(y[b].q), _mm256_set1_epi32(-offset));
        _mm256_storeu_si256((__m256i *)y[b].offsets, offsets);
    }
}

/* --- dot products of one weight row with up to GROUP activation rows ---------------------------------------------- */
/* signed w times signed x, 32 pairs -> 8 int32 lanes (|w| <= 128, |x| <= 127: no int16 saturation) */
TARGET static inline __m256i dot_s8(__m256i w, __m256i x) {
    const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* _mm256_shuffle_epi8 masks that broadcast 16-bit lane j of each 128-bit half to all its lanes (a sub-block's scale
 * for madd): read from memory as the shuffle's operand, which costs no instruction of its own. */
static const uint8_t PAIR[8][32] __attribute__((aligned(32))) = {
    {0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1},
    {2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3},
    {4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5},
    {6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7},
    {8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9},
    {10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11},
    {12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13},
    {14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15}};
/* _mm256_shuffle_epi8 masks for a Q6_K piece t's two scales (int8 bytes 2t and 2t + 1 of the block's 16, the same 16
 * in both halves) as int16: byte 2t (2t + 1 in the upper half) into the high byte of each 16-bit lane, 128 (zero)
 * into the low one, then an arithmetic shift right by 8. A shuffle and a shift cost no multiply slot on the AMD EPYC
 * Zen 3, where the former vpmovsxbw widening took 1.9 of one (bench/multiply_rate.py --beside; experiments/cpu-lead,
 * twenty-first run). The same int16 scales: the same bits. */
static const uint8_t Q6K_PIECE_SCALES[8][32] __attribute__((aligned(32))) = {
    {128, 0, 128, 0, 128, 0, 128, 0, 128, 0, 128, 0, 128, 0, 128, 0,
     128, 1, 128, 1, 128, 1, 128, 1, 128, 1, 128, 1, 128, 1, 128, 1},
    {128, 2, 128, 2, 128, 2, 128, 2, 128, 2, 128, 2, 128, 2, 128, 2,
     128, 3, 128, 3, 128, 3, 128, 3, 128, 3, 128, 3, 128, 3, 128, 3},
    {128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4,
     128, 5, 128, 5, 128, 5, 128, 5, 128, 5, 128, 5, 128, 5, 128, 5},
    {128, 6, 128, 6, 128, 6, 128, 6, 128, 6, 128, 6, 128, 6, 128, 6,
     128, 7, 128, 7, 128, 7, 128, 7, 128, 7, 128, 7, 128, 7, 128, 7},
    {128, 8, 128, 8, 128, 8, 128, 8, 128, 8, 128, 8, 128, 8, 128, 8,
     128, 9, 128, 9, 128, 9, 128, 9, 128, 9, 128, 9, 128, 9, 128, 9},
    {128, 10, 128, 10, 128, 10, 128, 10, 128, 10, 128, 10, 128, 10, 128, 10,
     128, 11, 128, 11, 128, 11, 128, 11, 128, 11, 128, 11, 128, 11, 128, 11},
    {128, 12, 128, 12, 128, 12, 128, 12, 128, 12, 128, 12, 128, 12, 128, 12,
     128, 13, 128, 13, 128, 13, 128, 13, 128, 13, 128, 13, 128, 13, 128, 13},
    {128, 14, 128, 14, 128, 14, 128, 14, 128, 14, 128, 14, 128, 14, 128, 14,
     128, 15, 128, 15, 128, 15, 128, 15, 128, 15, 128, 15, 128, 15, 128, 15}};

/* A Q4_K block's eight 6-bit scales and eight 6-bit mins as 16 int16 lanes (scales 0-7, mins 8-15): the 12 packed
 * bytes rearranged as four 32-bit words (the layout of q4k_scale_min, four lanes at a time). */
TARGET static inline __m256i q4k_scales_mins(const uint8_t *packed) {
    uint32_t u[4];
    memcpy(u, packed, 12);
    const uint32_t low6 = 0x3f3f3f3f, low4 = 0x0f0f0f0f, low2 = 0x03030303;
    u[3] = ((u[2] >> 4) & low4) | (((u[1] >> 6) & low2) << 4); /* mins 4-7 */
    const uint32_t mins_low = u[1] & low6;                     /* mins 0-3 */
    u[1] = (u[2] & low4) | (((u[0] >> 6) & low2) << 4);        /* scales 4-7 */
    u[2] = mins_low;
    u[0] &= low6; /* scales 0-3 */
    return _mm256_cvtepu8_epi16(_mm_set_epi32((int)u[3], (int)u[2], (int)u[1], (int)u[0]));
}

/* Q4_K's float epilogue, shared by every kernel (the AVX2 and AVX-512 row functions, which form each block's integers
 * as eight lanes, and the AMX tiles, which form them as whole sums), so that their bits agree. A block's two integers
 * are exact whatever computed them: S, the quants times their 6-bit scales times the input's quants, and Mn, the
 * eight mins times the input's sums per 32. They enter eight float accumulators per output, block b into lane
 * b mod 8: acc += (d x the input's scale) S, then acc -= (dmin x the input's scale) Mn, each rounded once; the
 * result is hsum8 of the eight (one fixed order). Eight blocks' integers are summed at once (a tree of hadds), so
 * that a row of one input pays little for them, and the tiles' 16 inputs run the same operations lane by lane. */
typedef struct {
    int32_t s[8][8]; /* the integer lanes of each of eight blocks (only their sum counts) */
    int32_t m[8][8]; /* the mins' four lanes (lanes 4-7 zero) */
} q4k_stash;

/* The integers are read back at the width they were written (a slot's whole 32 bytes), and the scales never pass
 * through memory as single floats: kept one at a time and loaded as eight, they made every flush wait (a load
 * spanning several recent smaller stores cannot take its bytes from them and waits until they reach the cache).
 * With one input each scale is blended into its lane of a register as its block goes by; with more, the flush
 * gathers them from where they were written long before (the blocks' fp16 pair, the inputs' scales), once per
 * eight blocks: cheaper per input than a blend per block, but a gather is many micro-ops, and in some runs it
 * slowed the one-input row's memory stream by 5-20% (docs/quantized.md, Zen 5). The same values either way. */
static const int32_t LANE[8][8] __attribute__((aligned(32))) = {
    {-1, 0, 0, 0, 0, 0, 0, 0}, {0, -1, 0, 0, 0, 0, 0, 0}, {0, 0, -1, 0, 0, 0, 0, 0}, {0, 0, 0, -1, 0, 0, 0, 0},
    {0, 0, 0, 0, -1, 0, 0, 0}, {0, 0, 0, 0, 0, -1, 0, 0}, {0, 0, 0, 0, 0, 0, -1, 0}, {0, 0, 0, 0, 0, 0, 0, -1}};

/* v with lane `slot` set to x */
TARGET static inline __attribute__((always_inline)) __m256 q4k_into_lane(__m256 v, int slot, float x) {
    return _mm256_blendv_ps(v, _mm256_set1_ps(x), _mm256_load_ps((const float *)LANE[slot]));
}

TARGET static inline __attribute__((always_inline)) void q4k_keep(q4k_stash *st, int slot, const act_k *a,
                                                                  __m256i lanes, __m128i min8) {
    _mm256_storeu_si256((__m256i *)st->s[slot], lanes);
    const __m128i mins = _mm_madd_epi16(min8, _mm_loadu_si128((const __m128i *)a->sums32));
    _mm256_storeu_si256((__m256i *)st->m[slot], _mm256_zextsi128_si256(mins));
}

/* Lanes j < count set, the others clear (a last, partial eight keeps only its own scales). */
TARGET static inline __m256i q4k_first(int count) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* The d and dmin (fp16, a block's first four bytes) of `count` consecutive Q4_K blocks from w, as floats (0 past
 * count: the gather reads nothing there). */
TARGET static inline __attribute__((always_inline)) void q4k_gather_block_scales(const uint8_t *w, int count,
                                                                                 __m256 *d, __m256 *dmin) {
    const __m256i words = _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), (const int *)w,
                                                      _mm256_setr_epi32(0, 144, 288, 432, 576, 720, 864, 1008),
                                                      q4k_first(count), 1);
    /* d of lanes 0-3, dmin of 0-3 | the same of lanes 4-7; then every d before every dmin */
    const __m256i packed = _mm256_permute4x64_epi64(
        _mm256_packus_epi32(_mm256_and_si256(words, _mm256_set1_epi32(0xFFFF)), _mm256_srli_epi32(words, 16)),
        _MM_SHUFFLE(3, 1, 2, 0));
    *d = _mm256_cvtph_ps(_mm256_castsi256_si128(packed));
    *dmin = _mm256_cvtph_ps(_mm256_extracti128_si256(packed, 1));
}

/* An input's scale in `count` consecutive blocks from a (0 past count). */
TARGET static inline __attribute__((always_inline)) __m256 q4k_gather_input_scales(const act_k *a, int count) {
    const __m256i offsets = _mm256_mullo_epi32(_mm256_set1_epi32((int)sizeof(act_k)),
                                               _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    return _mm256_mask_i32gather_ps(_mm256_setzero_ps(), &a->d, offsets, _mm256_castsi256_ps(q4k_first(count)), 1);
}

/* The kept blocks (slots 0 .. count - 1: dx the input's scales, d8 and dmin8 their weights' scales, each 0 past
 * count) into the eight accumulators. */
TARGET static inline __attribute__((always_inline)) __m256 q4k_flush(q4k_stash *st, __m256 dx, __m256 d8,
                                                                     __m256 dmin8, int count, __m256 acc) {
    /* A last, partial eight: the empty slots (stale) read as 0 and add +0 (acc is never -0). Masked as they are
     * read rather than cleared: GCC made the clearing loop a `rep stos` (a memset), 15% of a one-input row's time
     * where a row has 6 blocks (K 1536; AMD EPYC Zen 3, perf). */
    const __m256i filled = _mm256_set1_epi32(count);
#define Q4K_SLOT(base, k)                                                                                         \
    _mm256_and_si256(_mm256_loadu_si256((base) + (k)), _mm256_cmpgt_epi32(filled, _mm256_set1_epi32(k)))
    const __m256i *s = (const __m256i *)st->s;
    const __m256i g0 = _mm256_hadd_epi32(_mm256_hadd_epi32(Q4K_SLOT(s, 0), Q4K_SLOT(s, 1)),
                                         _mm256_hadd_epi32(Q4K_SLOT(s, 2), Q4K_SLOT(s, 3)));
    const __m256i g1 = _mm256_hadd_epi32(_mm256_hadd_epi32(Q4K_SLOT(s, 4), Q4K_SLOT(s, 5)),
                                         _mm256_hadd_epi32(Q4K_SLOT(s, 6), Q4K_SLOT(s, 7)));
    const __m256i S =
        _mm256_add_epi32(_mm256_permute2x128_si256(g0, g1, 0x20), _mm256_permute2x128_si256(g0, g1, 0x31));
    const __m256i *m = (const __m256i *)st->m; /* two blocks' four lanes per register */
#define Q4K_TWO_SLOTS(a) _mm256_permute2x128_si256(Q4K_SLOT(m, a), Q4K_SLOT(m, (a) + 1), 0x20)
    const __m256i f = _mm256_hadd_epi32(_mm256_hadd_epi32(Q4K_TWO_SLOTS(0), Q4K_TWO_SLOTS(2)),
                                        _mm256_hadd_epi32(Q4K_TWO_SLOTS(4), Q4K_TWO_SLOTS(6)));
#undef Q4K_TWO_SLOTS
#undef Q4K_SLOT
    const __m256i M = _mm256_permutevar8x32_epi32(f, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    acc = _mm256_fmadd_ps(_mm256_mul_ps(d8, dx), _mm256_cvtepi32_ps(S), acc);
    return _mm256_fnmadd_ps(_mm256_mul_ps(dmin8, dx), _mm256_cvtepi32_ps(M), acc);
}

/* Q4_K's scales for the flush: with one input, blended into their lanes block by block (q4k_scales_next);
 * with more, gathered at the flush (q4k_flush_all). */
typedef struct {
    __m256 d8, dmin8, dx;
} q4k_lanes;

TARGET static inline __attribute__((always_inline)) void q4k_scales_next(q4k_lanes *l, const uint8_t *w, int slot,
                                                                         const act_k *a) {
    l->d8 = q4k_into_lane(l->d8, slot, half(w)), l->dmin8 = q4k_into_lane(l->dmin8, slot, half(w + 2));
    l->dx = q4k_into_lane(l->dx, slot, a->d);
}

/* After block b (w its weights; slot b mod 8 of its eight): the kept eight, or a last partial one, into the nx
 * accumulators. */
TARGET static inline __attribute__((always_inline)) void q4k_flush_all(q4k_stash *stash, q4k_lanes *one,
                                                                       const uint8_t *w, const act_k *const *x,
                                                                       int nx, int64_t b, int64_t blocks, __m256 *acc) {
    const int slot = (int)(b & 7);
    if (slot != 7 && b != blocks - 1) return;
    const int count = slot + 1;
    if (nx == 1) {
        const __m256 keep = _mm256_castsi256_ps(q4k_first(count));
        acc[0] = q4k_flush(&stash[0], _mm256_and_ps(one->dx, keep), _mm256_and_ps(one->d8, keep),
                           _mm256_and_ps(one->dmin8, keep), count, acc[0]);
        return;
    }
    __m256 d8, dmin8;
    q4k_gather_block_scales(w - 144 * slot, count, &d8, &dmin8);
    for (int i = 0; i < nx; i++)
        acc[i] = q4k_flush(&stash[i], q4k_gather_input_scales(&x[i][b - slot], count), d8, dmin8, count, acc[i]);
}

/* Q6_K: the quants' offset of 32 (times each scale and the sum of its 16 activations) comes off the lanes first:
 * an input's eight lane sums start from it, -32 x (scale x sum) per pair of 16s (scale_minus32: the block's scales
 * times -32, once a block), so no shift and subtraction per input and block (integers: any order, the same sums).
 * Then the lanes times d x the input's scale (one vector multiply: the scalar product's rounding). AMD EPYC Zen 4, one
 * thread, rows in L2, with the top bits' masking in row_q6_k_512 and _quant_rows.h: the avx512-vnni rows 1.06-1.19x
 * as fast at 1-8 inputs (37 / 73 / 83 against 34 / 68 / 71 G multiply-adds a second at 1 / 3 / 5), avx512-vnni-256
 * 1.02-1.13x, avx2 0.98-1.06x; the same bits (experiments/cpu-lead, seventh run). */
TARGET static inline __attribute__((always_inline)) __m256i q6k_offset(const act_k *a, __m256i scale_minus32) {
    return _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)a->sums), scale_minus32);
}

TARGET static inline __attribute__((always_inline)) __m256i q6k_scales_minus32(__m256i scale16) {
    return _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(scale16, 5));
}

TARGET static inline __attribute__((always_inline)) void q6k_accumulate(__m256 *acc, __m256 d, const act_k *a,
                                                                        __m256i total) {
    *acc = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_broadcast_ss(&a->d)), _mm256_cvtepi32_ps(total), *acc);
}

/* The K-quant row functions of the avx2 kernel (_quant_rows.h; avx512-vnni-256's below, with the AVX-512 code) */
#define ROW_ISA TARGET
#define ROW_NAME(name) name
#define ROW_GROUP Q6K_AVX2_ROW_GROUP /* the arrays' room; Q4_K's rows are called with up to GROUP */
#define ROW_MADD(acc, p, scale) _mm256_add_epi32(acc, _mm256_madd_epi16(p, scale))
#define ROW_IN_ORDER(v) IN_ORDER_256(v)
#include "_quant_rows.h"
#undef ROW_ISA
#undef ROW_NAME
#undef ROW_GROUP
#undef ROW_MADD
#undef ROW_IN_ORDER

/* A Q5_0 block's 32 quants as signed bytes (-16..15): low nibbles, then high nibbles, each with its fifth bit. */
TARGET static inline __attribute__((always_inline)) __m256i q5_0_quants(const uint8_t *w) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), sixteen = _mm256_set1_epi8(16);
    /* byte l of the broadcast high bits picks bit l of its 32-bit word */
    const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3,
                                          3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
    uint32_t qh;
    memcpy(&qh, w + 2, 4);
    const __m128i half16 = _mm_loadu_si128((const __m128i *)(w + 6));
    const __m256i nib = _mm256_and_si256(
        _mm256_inserti128_si256(_mm256_castsi128_si256(half16), _mm_srli_epi16(half16, 4), 1), low4);
    const __m256i bits = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), pick), bit), bit);
    return _mm256_sub_epi8(_mm256_or_si256(nib, _mm256_and_si256(bits, sixteen)), sixteen);
}

/* A Q8_0 block's 32 quants. */
TARGET static inline __attribute__((always_inline)) __m256i q8_0_quants(const uint8_t *w) {
    return _mm256_loadu_si256((const __m256i *)(w + 2));
}

/* The row function of a 32-value type (Q5_0, Q8_0) for kernel ISA: per block its fp16 scale, its quants (UNPACK)
 * and, per input, one 8-lane integer dot product (DOT) and one multiply-add into that input's accumulator. */
#define ROW_Q32(NAME, ISA, GROUPN, BYTES, UNPACK, DOT)                                                              \
    ISA static inline __attribute__((always_inline)) void NAME(const uint8_t *w, const act_32 *const *x, int nx,    \
                                                               int64_t K, int64_t left, float *out) {               \
        __m256 acc[GROUPN];                                                                                         \
        for (int i = 0; i < nx; i++) acc[i] = _mm256_setzero_ps();                                                  \
        for (int64_t b = 0; b < K / Q32; b++, w += BYTES, left -= BYTES) {                                         \
            row_prefetch(w, BYTES, left);                                                                           \
            const float d = half(w);                                                                                \
            const __m256i q = UNPACK(w);                                                                            \
            for (int i = 0; i < nx; i++) {                                                                          \
                const __m256i p = DOT(q, &x[i][b]);                                                                 \
                acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(d * x[i][b].d), _mm256_cvtepi32_ps(p), acc[i]);            \
            }                                                                                                       \
        }                                                                                                           \
        for (int i = 0; i < nx; i++) out[i] = hsum8(acc[i]);                                                        \
    }
/* signed weights times an input block's quants, 8 lanes of 4 products */
TARGET static inline __attribute__((always_inline)) __m256i dot_act(__m256i w, const act_32 *a) {
    return dot_s8(w, _mm256_loadu_si256((const __m256i *)a->q));
}

ROW_Q32(row_q5_0, TARGET, GROUP, 22, q5_0_quants, dot_act)
ROW_Q32(row_q8_0, TARGET, GROUP, 34, q8_0_quants, dot_act)

/* --- the same products with AVX-512 (BW, VL, VNNI): the same bits --------------------------------------------------
 * Where the CPU has them, two 32-value pieces share one 512-bit register and each sub-block's scale is applied by
 * vpdpwssd (multiply the int16 pair sums by the scale and accumulate, one instruction) or vpdpbusd (four u8 x s8
 * products summed into int32). Every integer sum is exact, and lane l of the 16 int32 lanes holds the products of
 * bytes 4l..4l+3 (mod 32) of its piece, so folding the upper eight lanes onto the lower eight at the end of a block
 * gives each of the AVX2 code's eight lanes exactly its integer; the float epilogue (one 8-lane multiply-add per
 * block, the same horizontal sums) is the AVX2 code's own (q4k_keep / q4k_flush, q6k_accumulate, the ROW_Q32
 * body). So a row's result is the same bits on either variant (tests/test_quant.py), and batch invariance holds
 * across them too. */
#define TARGET512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))

/* vpermw indices: int16 lanes 0-15 take element 2p, lanes 16-31 element 2p + 1 (Q4_K: a piece's two scales, its low
 * and its high nibbles); and lanes 8j..8j+7 take element 4p + j (Q6_K: the four 16-value scales of two pieces). */
static const int16_t HALVES[4][32] __attribute__((aligned(64))) = {
    {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
    {2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3},
    {4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5},
    {6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7}};
static const int16_t QUARTERS[4][32] __attribute__((aligned(64))) = {
    {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3},
    {4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7},
    {8, 8, 8, 8, 8, 8, 8, 8, 9, 9, 9, 9, 9, 9, 9, 9, 10, 10, 10, 10, 10, 10, 10, 10, 11, 11, 11, 11, 11, 11, 11, 11},
    {12, 12, 12, 12, 12, 12, 12, 12, 13, 13, 13, 13, 13, 13, 13, 13, 14, 14, 14, 14, 14, 14, 14, 14, 15, 15, 15, 15,
     15, 15, 15, 15}};

/* 16 int32 lanes -> the AVX2 code's 8 (lane l plus lane l + 8: exact). */
TARGET512 static inline __m256i fold16(__m512i v) {
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

/* 32 bytes in both halves of a register, the upper half shifted right by `shift` bits (per 16-bit lane): the load
 * broadcasts and a masked shift moves only the upper half, with no shuffle-port instruction to join two halves
 * (inserting the shifted half was 10% of a one-row Q4_K product, measured) */
TARGET512 static inline __m512i twice_shifted(const uint8_t *p, int shift) {
    const __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_mask_srl_epi16(v, 0xFFFF0000u, v, _mm_cvtsi32_si128(shift));
}

/* A Q4_K piece's 32 quant bytes as its 64 values: the low nibbles (values 0..31 of the piece), then the high ones
 * (32..63): the activations' order */
TARGET512 static inline __m512i q4k_nibbles(const uint8_t *chunk) {
    return _mm512_and_si512(twice_shifted(chunk, 4), _mm512_set1_epi8(0x0F));
}

/* Q4_K piece p of a block in the file's layout: values 64p..64p+63 */
TARGET512 static inline __m512i q4k_piece(const uint8_t *w, int p) { return q4k_nibbles(w + 16 + 32 * p); }

TARGET512 static inline __attribute__((always_inline)) void row_q4_k_512(const uint8_t *w, const act_k *const *x,
                                                                         int nx, int64_t K, int64_t left, float *out) {
    __m256 acc[GROUP512];
    q4k_stash stash[GROUP512];
    q4k_lanes one = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int i = 0; i < nx; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < K / QK; b++, w += 144, left -= 144) {
        row_prefetch(w, 144, left);
        const int slot = (int)(b & 7);
        if (nx == 1) q4k_scales_next(&one, w, slot, &x[0][b]);
        const __m256i scales_mins = q4k_scales_mins(w + 4);
        const __m512i scales = _mm512_castsi256_si512(scales_mins);
        const __m128i min8 = _mm256_extracti128_si256(scales_mins, 1);
        __m512i sums[GROUP512];
        for (int i = 0; i < nx; i++) sums[i] = _mm512_setzero_si512();
        for (int p = 0; p < 4; p++) {
            const __m512i q = q4k_piece(w, p);
            const __m512i scale = _mm512_permutexvar_epi16(_mm512_load_si512(HALVES[p]), scales);
            for (int i = 0; i < nx; i++) {
                const __m512i a = _mm512_maddubs_epi16(q, _mm512_loadu_si512(x[i][b].q + 64 * p));
                sums[i] = _mm512_dpwssd_epi32(sums[i], a, scale);
            }
        }
        for (int i = 0; i < nx; i++) q4k_keep(&stash[i], slot, &x[i][b], fold16(sums[i]), min8);
        q4k_flush_all(stash, &one, w, x, nx, b, K / QK, acc);
    }
    for (int i = 0; i < nx; i++) out[i] = hsum8(acc[i]);
}

TARGET512 static inline __attribute__((always_inline)) void row_q6_k_512(const uint8_t *w, const act_k *const *x,
                                                                         int nx, int64_t K, int64_t left, float *out) {
    __m256 acc[GROUP512];
    for (int i = 0; i < nx; i++) acc[i] = _mm256_setzero_ps();
    const __m512i low4 = _mm512_set1_epi8(0x0F), two = _mm512_set1_epi8(3), top2 = _mm512_set1_epi8(0x30);
    for (int64_t b = 0; b < K / QK; b++, w += 210, left -= 210) {
        row_prefetch(w, 210, left);
        const uint8_t *ql = w, *qh = w + 128;
        const __m128i scales8 = _mm_loadu_si128((const __m128i *)(w + 192));
        const float d = half(w + 208);
        const __m256i scale16 = _mm256_cvtepi8_epi16(scales8);
        const __m512i scales = _mm512_castsi256_si512(scale16);
        const __m256i scale_minus32 = q6k_scales_minus32(scale16);
        __m512i sums[GROUP512]; /* the offset in the lanes fold16 keeps, zero in the others */
        for (int i = 0; i < nx; i++) sums[i] = _mm512_zextsi256_si512(q6k_offset(&x[i][b], scale_minus32));
        for (int h = 0; h < 2; h++) {
            const __m512i l01 = _mm512_loadu_si512(ql + 64 * h); /* pieces 4h, 4h+1 (low) and 4h+2, 4h+3 (high) */
            const __m512i hb01 = twice_shifted(qh + 32 * h, 2);
            __m512i pair[2]; /* values 32(4h) .. 32(4h+2)-1, then 32(4h+2) .. 32(4h+4)-1 */
            pair[0] = _mm512_or_si512(_mm512_and_si512(l01, low4), _mm512_slli_epi16(_mm512_and_si512(hb01, two), 4));
            /* the high pieces' top bits are bits 4-5 of hb01 already: masked, not shifted down and back */
            pair[1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l01, 4), low4), _mm512_and_si512(hb01, top2));
            for (int s = 0; s < 2; s++) {
                const int t = 4 * h + 2 * s; /* pieces t and t + 1: scales 2t .. 2t + 3 */
                const __m512i scale = _mm512_permutexvar_epi16(_mm512_load_si512(QUARTERS[t / 2]), scales);
                for (int i = 0; i < nx; i++) {
                    const __m512i p = _mm512_maddubs_epi16(pair[s], _mm512_loadu_si512(x[i][b].q + 32 * t));
                    sums[i] = _mm512_dpwssd_epi32(sums[i], p, scale);
                }
            }
        }
        const __m256 dv = _mm256_set1_ps(d);
        for (int i = 0; i < nx; i++) q6k_accumulate(&acc[i], dv, &x[i][b], fold16(sums[i]));
    }
    for (int i = 0; i < nx; i++) out[i] = hsum8(acc[i]);
}

/* signed w times signed x, 32 pairs -> 8 int32 lanes in one vpdpbusd (|w| as u8, x with w's sign) */
TARGET512 static inline __attribute__((always_inline)) __m256i dot_act_vnni(__m256i w, const act_32 *a) {
    const __m256i x = _mm256_loadu_si256((const __m256i *)a->q);
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
}

/* Q5_0 on AVX-512: the weights as unsigned bytes, the 5-bit value itself (its fifth bit added from the block's
 * mask register), so that one vpdpbusd starting from the input block's offsets (-16 x the sum of each lane's 4
 * quants) gives each lane exactly the signed products' sum: the AVX2 kernel's lanes, with fewer instructions per
 * block and input (one-row products of the 0.5B file's ffn_up 11-12% faster; the same done for Q8_0, w + 128,
 * made its products of several rows 25% slower, so Q8_0 keeps the signed form). */
TARGET512 static inline __attribute__((always_inline)) __m256i q5_0_unsigned(const uint8_t *w) {
    uint32_t qh;
    memcpy(&qh, w + 2, 4);
    const __m128i half16 = _mm_loadu_si128((const __m128i *)(w + 6));
    const __m256i nib = _mm256_and_si256(
        _mm256_inserti128_si256(_mm256_castsi128_si256(half16), _mm_srli_epi16(half16, 4), 1), _mm256_set1_epi8(0x0F));
    return _mm256_mask_add_epi8(nib, (__mmask32)qh, nib, _mm256_set1_epi8(16));
}

TARGET512 static inline __attribute__((always_inline)) __m256i dot_offset_vnni(__m256i w, const act_32 *a) {
    return _mm256_dpbusd_epi32(_mm256_loadu_si256((const __m256i *)a->offsets), w,
                               _mm256_loadu_si256((const __m256i *)a->q));
}

ROW_Q32(row_q5_0_512, TARGET512, GROUP512, 22, q5_0_unsigned, dot_offset_vnni)
ROW_Q32(row_q8_0_512, TARGET512, GROUP512, 34, q8_0_quants, dot_act_vnni)

/* How many blocks ahead of the one being multiplied the weights are asked for (bench: 2-4 alike on the AMD EPYC Zen 5,
 * none or one block 20-35% slower; on the Intel Xeon none is ~5% faster at one row, 16 slower, the step alike:
 * experiments/cpu-lead, fifth run) */
#define R16_AHEAD 3
#define R16_INPUTS 4 /* inputs per pass over a group's blocks for Q5_0 and Q8_0 (their eight float accumulators an
                      * input in registers; SPECIALISE_GROUP compiles 1..4) */
#define R16_K_INPUTS 8 /* Q4_K's and Q6_K's: two or three integer registers an input (group_q4_k_r16, group_q6_k_r16),
                        * so a verify pass up to k = 7 is one pass */
/* The K-quants' on AVX2 (sixteen registers): at 8 inputs their group functions spill, and two passes of 4 run
 * faster (AMD EPYC Zen 3, one thread, 16-row groups of a 1536-wide matrix in L2, G multiply-adds a second at 1..8
 * inputs: Q4_K 54, 76, 89, 93, 95, 92, 95, 88; Q6_K 26, 37, 43, 44, 46, 42, 47, 37; eighteenth run,
 * bench/group_rate.py). */
#define R16_K_AVX2_INPUTS 7

/* Asks for the bytes of the block R16_AHEAD blocks on (when the group or the next one has it): a prefetch changes
 * no value. */
PREFETCH_HELPER void r16_prefetch(const uint8_t *w, int block_bytes, int64_t b, int64_t room) {
    if (b + R16_AHEAD < room)
        for (int off = 0; off < block_bytes; off += 64)
            _mm_prefetch((const char *)(w + R16_AHEAD * block_bytes + off), _MM_HINT_T0);
}

/* How far ahead of the block being multiplied the group functions ask for the weights, in bytes, with two inputs or
 * more: the blocks ahead that hold at least this many (four Q4_K blocks of a group, three Q6_K, 24 Q5_0, 16 Q8_0). */
#define R16_AHEAD_BYTES 8192

/* A group function's prefetch at step `part` of the `parts` steps of its inner loop over a block, for nx inputs.
 * - One input: all of the block R16_AHEAD blocks on at the first step (r16_prefetch), into L1. Its arithmetic is
 *   short; dealt out, a one-token step took 8-20% longer (eighth run), and 15% longer in the thirteenth (against
 *   builds whose one-input functions may have had no prefetch at all: see PREFETCH_HELPER). Not on AVX2: its group
 *   functions ask for one input's as for two (GROUP_PF_NX, _quant_groups.h; AMD EPYC Zen 3, seventeenth run).
 * - Two inputs or more: the lines of the block R16_AHEAD_BYTES on, dealt into `parts` shares, one share a step, and
 *   into L2 only (_MM_HINT_T1). All of a block's lines at once (37 for Q4_K, 53 for Q6_K) filled the core's miss
 *   buffers, and the arithmetic waited behind them (eighth run). Asked into L1, 2 KB on, the lines came too late
 *   to hide the reading behind the arithmetic of three inputs or more: a pass took about the sum of the two.
 *   AMD EPYC Zen 4, whole verify passes of the 1.5B, one process, builds swapped per round, 16 rounds: into L2 8 KB
 *   on against into L1 2 KB on (two inputs all at once) 0.83 of the time at 2 positions, 0.78 at 3, 0.84 at 4,
 *   0.86 at 5, 0.94 at 7; 4 KB on 7% slower at 3 positions, 6, 12 and 16 KB within 3%; into L1 8 KB on no
 *   better than 2 KB; into L3 (_MM_HINT_T2) as into L2; the 0.5B draft 0.83-0.97 (experiments/cpu-lead,
 *   thirteenth run).
 * Every line asked for lies inside that block. A prefetch changes no value. */
PREFETCH_HELPER void r16_prefetch_step(const uint8_t *w, int block_bytes, int64_t b, int64_t room, int nx, int part,
                                   int parts) {
    if (nx == 1) {
        if (part == 0)
            r16_prefetch(w, block_bytes, b, room);
        return;
    }
    const int ahead = (R16_AHEAD_BYTES + block_bytes - 1) / block_bytes;
    if (b + ahead >= room)
        return;
    const uint8_t *block = w + (int64_t)ahead * block_bytes;
    for (int off = 64 * part; off < block_bytes; off += 64 * parts) /* lines part, part + parts, ...: no division */
        _mm_prefetch((const char *)(block + off), _MM_HINT_T1);
}

/* The first n rows of eight accumulators each (the AMX tiles' acc[output][l]) set to zero. */
TARGET512 static inline __attribute__((always_inline)) void zero_accumulators(__m512 acc[][8], int n) {
    for (int i = 0; i < n; i++)
        for (int l = 0; l < 8; l++) acc[i][l] = _mm512_setzero_ps();
}

/* The group functions (_quant_groups.h): group_product_512 (the avx512-vnni and amx kernels), group_product_256
 * (avx512-vnni-256) and group_product_avx2 (the avx2 kernel, 256-bit registers without VNNI), the same bits. */
#define GROUP_ISA TARGET512
#define GROUP_BITS 512
#define GROUP_SUFFIX 512
#include "_quant_groups.h"
#undef GROUP_BITS
#undef GROUP_SUFFIX
#define GROUP_BITS 256
#define GROUP_SUFFIX 256
#include "_quant_groups.h"
#undef GROUP_ISA
#undef GROUP_SUFFIX
#define GROUP_ISA TARGET
#define GROUP_SUFFIX avx2
#define GROUP_NO_VNNI
#include "_quant_groups.h"
#undef GROUP_NO_VNNI
#undef GROUP_SUFFIX
#undef GROUP_ISA
#undef GROUP_BITS

/* Plain float weights (F32 / F16 matrices are rare in these files): widen and multiply-add, 8 lanes then a sum. */
TARGET static void row_float(int type, const uint8_t *w, const float *const *x, int nx, int64_t K, float *out) {
    for (int i = 0; i < nx; i++) {
        __m256 acc = _mm256_setzero_ps();
        const int64_t K8 = K & ~(int64_t)7;
        for (int64_t k = 0; k < K8; k += 8) {
            const __m256 wv = type == F32 ? _mm256_loadu_ps((const float *)w + k)
                                          : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 2 * k)));
            acc = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x[i] + k), acc);
        }
        float s = hsum8(acc);
        for (int64_t k = K8; k < K; k++) {
            const float wk = type == F32 ? ((const float *)w)[k] : half(w + 2 * k);
            s = fmaf(wk, x[i][k], s);
        }
        out[i] = s;
    }
}

/* Each row function compiled for every input count of a group: with the count a constant the compiler keeps every
 * accumulator in a register and unrolls the input loops (an unknown count left them on the stack: 3x slower). */
#define ROW_FN(NAME, ACT, ISA, N)                                                                              \
    ISA static void NAME##_##N(const uint8_t *w, const ACT *const *x, int64_t K, int64_t left, float *o) {      \
        NAME(w, x, N, K, left, o);                                                                             \
    }
#define SPECIALISE(NAME, ACT, ISA)                                                                                 \
    ROW_FN(NAME, ACT, ISA, 1) ROW_FN(NAME, ACT, ISA, 2) ROW_FN(NAME, ACT, ISA, 3) ROW_FN(NAME, ACT, ISA, 4)       \
    static void (*const NAME##_for[GROUP + 1])(const uint8_t *, const ACT *const *, int64_t, int64_t,             \
                                               float *) = {                                                  \
        NULL, NAME##_1, NAME##_2, NAME##_3, NAME##_4};
#define SPECIALISE8(NAME, ACT, ISA)                                                                                \
    ROW_FN(NAME, ACT, ISA, 1) ROW_FN(NAME, ACT, ISA, 2) ROW_FN(NAME, ACT, ISA, 3) ROW_FN(NAME, ACT, ISA, 4)       \
    ROW_FN(NAME, ACT, ISA, 5) ROW_FN(NAME, ACT, ISA, 6) ROW_FN(NAME, ACT, ISA, 7) ROW_FN(NAME, ACT, ISA, 8)       \
    static void (*const NAME##_for[GROUP512 + 1])(const uint8_t *, const ACT *const *, int64_t, int64_t,          \
                                                  float *) = {                                               \
        NULL, NAME##_1, NAME##_2, NAME##_3, NAME##_4, NAME##_5, NAME##_6, NAME##_7, NAME##_8};
SPECIALISE(row_q4_k, act_k, TARGET)
ROW_FN(row_q6_k, act_k, TARGET, 1) ROW_FN(row_q6_k, act_k, TARGET, 2) ROW_FN(row_q6_k, act_k, TARGET, 3)
ROW_FN(row_q6_k, act_k, TARGET, 4) ROW_FN(row_q6_k, act_k, TARGET, 5) ROW_FN(row_q6_k, act_k, TARGET, 6)
static void (*const row_q6_k_for[Q6K_AVX2_ROW_GROUP + 1])(const uint8_t *, const act_k *const *, int64_t, int64_t,
                                                          float *) = {
    NULL, row_q6_k_1, row_q6_k_2, row_q6_k_3, row_q6_k_4, row_q6_k_5, row_q6_k_6};
SPECIALISE(row_q5_0, act_32, TARGET)
SPECIALISE(row_q8_0, act_32, TARGET)
SPECIALISE8(row_q4_k_512, act_k, TARGET512)
SPECIALISE8(row_q6_k_512, act_k, TARGET512)
SPECIALISE8(row_q5_0_512, act_32, TARGET512)
SPECIALISE8(row_q8_0_512, act_32, TARGET512)

/* The K-quant row functions of the avx512-vnni-256 kernel (_quant_rows.h with vpdpwssd, eight inputs a pass); its
 * Q5_0 / Q8_0 rows are avx512-vnni's, which run on 256-bit registers already. */
#define ROW_ISA TARGET512
#define ROW_NAME(name) name##_256
#define ROW_GROUP GROUP512
#define ROW_MADD(acc, p, scale) _mm256_dpwssd_epi32(acc, p, scale)
#define ROW_IN_ORDER(v) ((void)0) /* vpdpwssd adds in place */
#include "_quant_rows.h"
#undef ROW_ISA
#undef ROW_NAME
#undef ROW_GROUP
#undef ROW_MADD
#undef ROW_IN_ORDER
SPECIALISE8(row_q4_k_256, act_k, TARGET512)
SPECIALISE8(row_q6_k_256, act_k, TARGET512)


/* --- Q4_K products on AMX tiles (Intel Xeon 4th generation and later): the same bits, for verify passes -------------
 * A tile multiply (tdpbusd) sums 16 x 16 x 64 products of unsigned and signed bytes into int32 in one instruction,
 * sixteen times vpdpbusd's work: with it the extra rows of a verify pass cost nearly nothing beside the weights'
 * reading. It cannot apply a Q4_K block's eight 6-bit scales inside its sums, so each scale is split in two 3-bit
 * halves, sc = lo + 8 hi, and the weights enter twice, as the bytes q lo and q hi (at most 15 x 7 = 105, made by
 * one 16-bit multiply per 32 pairs: neither byte's product carries into the other): over a block's 256 values
 * C1 = sum(q lo x) and C2 = sum(q hi x), and S = C1 + 8 C2 is exactly the integer the row functions form. The mins'
 * integer Mn comes from vpdpwssd on the inputs' sums, and both enter q4k_flush's float epilogue, here on the 16
 * inputs of a tile at once (one lane each, the same operations), so a row's result is the AVX2 kernel's bits.
 *
 * Layout: C (tile 0, 1) is 16 outputs x up to 16 inputs; A (tiles 2, 3) 16 outputs x 64 weights of one block (the
 * file's nibbles unpacked in value order, scaled); B (tile 4) the inputs' 64 quants of the same values, four
 * consecutive ones per int32 (the layout tdpbusd reads). A call's outputs go 16 at a time to the threads; a group's
 * 16 weight rows are read once, block by block (the next group's rows prefetched meanwhile), each block unpacked
 * into an 8 KB buffer that stays in L1 while the tiles of the block before run, and multiplied with every input.
 * Outputs past the last full group of 16, calls with fewer than AMX_MIN_INPUTS rows and every other type run the
 * AVX-512 row functions, which give the same bits. Measured on the Intel Xeon (docs/quantized.md): an extra row
 * costs the tiles almost nothing, but a block's unpacking (two scaled copies) makes a pass of 3 rows cost what the
 * row functions' 3 rows do; from 3 rows on the tiles are faster, at 9 rows 3x. */
#define TARGET_AMX __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,amx-tile,amx-int8")))
#define AMX_TILE 16       /* outputs per tile, and the most inputs one tile holds */
#define AMX_MIN_INPUTS 3  /* one or two rows run faster on the AVX-512 row functions (bench/quant_kernel.py) */
/* Q4_K in groups of 16 rows: unpacking a group's blocks for these tiles (the weights as A) costs more than from the
 * file's rows and pays only over many tiles of inputs (a 17920 x 1536 product on 2 threads: 2.95 / 3.37 ms at 32
 * rows on the group functions / these tiles, 4.36 / 4.10 at 48, 5.85 / 5.00 at 64); fewer rows go to
 * amx_r16_matmul_q4_k (below: the weights as B, as they lie) */
#define AMX_MIN_INPUTS_R16 48

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* The inputs of one call as the tiles read them (at most AMX_TILE of them): per block b and 64-value piece p, 16
 * rows of 4 x inputs bytes (B); per block the inputs' scales (16 lanes, zero past the inputs) and their sums per
 * 32 as int16 pairs (2i, 2i + 1) for vpdpwssd. */
typedef struct {
    int inputs;
    int8_t *b;    /* blocks x 4 pieces x 16 rows x (4 inputs) bytes */
    float *d;     /* blocks x 16 */
    int32_t *sum_pairs; /* blocks x 4 pairs x 16 */
} amx_inputs;

TARGET_AMX static int amx_prepare_inputs(amx_inputs *in, const act_k *const *x, int nx, int64_t K) {
    const int64_t blocks = K / QK;
    in->inputs = nx;
    in->b = malloc((size_t)blocks * 4 * 16 * 4 * nx);
    in->d = calloc((size_t)blocks * 16, sizeof(float));
    in->sum_pairs = calloc((size_t)blocks * 4 * 16, sizeof(int32_t));
    if (!in->b || !in->d || !in->sum_pairs) return -1;
    for (int64_t b = 0; b < blocks; b++)
        for (int n = 0; n < nx; n++) {
            const act_k *a = &x[n][b];
            for (int p = 0; p < 4; p++)
                for (int r = 0; r < 16; r++)
                    memcpy(in->b + (((b * 4 + p) * 16 + r) * nx + n) * 4, a->q + 64 * p + 4 * r, 4);
            in->d[b * 16 + n] = a->d;
            for (int i = 0; i < 4; i++) /* the sums per 32 of sub-blocks 2i and 2i + 1 as one int16 pair */
                in->sum_pairs[(b * 4 + i) * 16 + n] =
                    (int32_t)(uint16_t)a->sums32[2 * i] | ((int32_t)(uint16_t)a->sums32[2 * i + 1] << 16);
        }
    return 0;
}

static void amx_free_inputs(amx_inputs *in) {
    free(in->b);
    free(in->d);
    free(in->sum_pairs);
}

/* One block of a group's 16 weight rows unpacked for the tiles: per piece and output the 64 bytes q lo and q hi
 * (8 KB, kept in L1), and per output d, dmin and the mins as four int16 pairs. */
typedef struct {
    uint8_t lo[4][AMX_TILE][64] __attribute__((aligned(64)));
    uint8_t hi[4][AMX_TILE][64] __attribute__((aligned(64)));
    float d[AMX_TILE], dmin[AMX_TILE];
    int32_t mins[AMX_TILE][4];
} amx_block;

/* Output o's block into u from its parts (both layouts): d and dmin, the scales and mins as q4k_scales_mins gives
 * them, and the 32 quant bytes of each of the block's four pieces. */
TARGET_AMX static inline void amx_unpack_parts(amx_block *u, int o, float d, float dmin, __m256i scales_mins,
                                               const uint8_t *const chunks[4]) {
    u->d[o] = d;
    u->dmin[o] = dmin;
    _mm_storeu_si128((__m128i *)u->mins[o], _mm256_extracti128_si256(scales_mins, 1));
    const __m512i scales = _mm512_castsi256_si512(scales_mins);
    for (int p = 0; p < 4; p++) {
        const __m512i q = q4k_nibbles(chunks[p]);
        const __m512i scale = _mm512_permutexvar_epi16(_mm512_load_si512(HALVES[p]), scales);
        _mm512_store_si512(u->lo[p][o], _mm512_mullo_epi16(q, _mm512_and_si512(scale, _mm512_set1_epi16(7))));
        _mm512_store_si512(u->hi[p][o], _mm512_mullo_epi16(q, _mm512_srli_epi16(scale, 3)));
    }
}

/* Output o's block at w (the file's layout) into u; the same block of the next group's row (ahead) is asked for
 * while this one is unpacked, so that the group's rows stream from memory in the tiles' order. */
TARGET_AMX static inline void amx_unpack_block(amx_block *u, int o, const uint8_t *w, const uint8_t *ahead) {
    _mm_prefetch((const char *)ahead, _MM_HINT_T0);
    _mm_prefetch((const char *)(ahead + 64), _MM_HINT_T0);
    _mm_prefetch((const char *)(ahead + 128), _MM_HINT_T0);
    const uint8_t *const chunks[4] = {w + 16, w + 48, w + 80, w + 112};
    amx_unpack_parts(u, o, half(w), half(w + 2), q4k_scales_mins(w + 4), chunks);
}

/* Row o of a Q4_K group's block g (Q4_K_R16: its bytes where q4k_pack_block put them) into u. */
TARGET_AMX static inline void amx_unpack_block_r16(amx_block *u, int o, const uint8_t *g) {
    int16_t scales_mins[16];
    for (int j = 0; j < 8; j++) {
        scales_mins[j] = g[q4k_r16_scale_at(j, o)];
        scales_mins[8 + j] = g[q4k_r16_min_at(j, o)];
    }
    uint8_t quants[4][32] __attribute__((aligned(32)));
    const __m256i quads = _mm256_setr_epi32(0, 64, 128, 192, 256, 320, 384, 448); /* a piece's 4-byte quads of row o */
    for (int p = 0; p < 4; p++)
        _mm256_store_si256((__m256i *)quants[p],
                           _mm256_i32gather_epi32((const int *)(g + R16_QS + 512 * p + 4 * o), quads, 1));
    const uint8_t *const chunks[4] = {quants[0], quants[1], quants[2], quants[3]};
    amx_unpack_parts(u, o, half(g + R16_D + 2 * o), half(g + R16_DMIN + 2 * o),
                     _mm256_loadu_si256((const __m256i *)scales_mins), chunks);
}

/* Block b of the group's 16 rows (the first at w + n0 rows, `stride` bytes apart) into u. */
TARGET_AMX static inline void amx_unpack_group_block(amx_block *u, const uint8_t *w, int64_t stride, int64_t n0,
                                                     int64_t b, int64_t ahead) {
    for (int o = 0; o < AMX_TILE; o++) {
        const uint8_t *wb = w + (n0 + o) * stride + b * 144;
        amx_unpack_block(u, o, wb, wb + ahead);
    }
}

/* y[i][n0 + o] for the 16 outputs o of one group (rows `stride` bytes apart from w) and every input i: per block the
 * tiles, then (while they run) the next block's rows unpacked, then the float epilogue on 16 lanes (one per input).
 * unpacked: NULL, or the group's blocks already unpacked (amx_matmul_q4_k: shared by every tile of inputs). */
TARGET_AMX static void amx_group(const uint8_t *w, int64_t stride, const amx_inputs *in, int64_t blocks,
                                 const float *bias, float *y, int64_t ldy, int64_t n0, int64_t N16,
                                 const amx_block *unpacked) {
    const int nx = in->inputs;
    amx_block u[2]; /* blocks alternate: the next one is unpacked while the tiles still read this one */
    __m512 acc[AMX_TILE][8]; /* q4k_flush's eight accumulators (block b into b mod 8), each on 16 inputs */
    zero_accumulators(acc, AMX_TILE);
    int32_t c1[AMX_TILE][AMX_TILE] __attribute__((aligned(64))), c2[AMX_TILE][AMX_TILE] __attribute__((aligned(64)));
    memset(c1, 0, sizeof c1);
    memset(c2, 0, sizeof c2);
    const int64_t ahead = n0 + 2 * AMX_TILE <= N16 ? AMX_TILE * stride : 0; /* the next group's rows, if any */
    if (!unpacked) amx_unpack_group_block(&u[0], w, stride, n0, 0, ahead);
    for (int64_t b = 0; b < blocks; b++) {
        const amx_block *ub = unpacked ? &unpacked[b] : &u[b & 1];
        _tile_zero(0);
        _tile_zero(1);
        for (int p = 0; p < 4; p++) {
            _tile_loadd(2, ub->lo[p], 64);
            _tile_loadd(3, ub->hi[p], 64);
            _tile_loadd(4, in->b + (size_t)(b * 4 + p) * 16 * 4 * nx, 4 * nx);
            _tile_dpbusd(0, 2, 4);
            _tile_dpbusd(1, 3, 4);
        }
        if (!unpacked && b + 1 < blocks) amx_unpack_group_block(&u[(b + 1) & 1], w, stride, n0, b + 1, ahead);
        _tile_stored(0, c1, 64);
        _tile_stored(1, c2, 64);
        const __m512 dx = _mm512_loadu_ps(in->d + b * 16);
        __m512i pairs[4];
        for (int i = 0; i < 4; i++) pairs[i] = _mm512_loadu_si512(in->sum_pairs + (b * 4 + i) * 16);
        for (int o = 0; o < AMX_TILE; o++) {
            const __m512i S =
                _mm512_add_epi32(_mm512_load_si512(c1[o]), _mm512_slli_epi32(_mm512_load_si512(c2[o]), 3));
            __m512i Mn = _mm512_setzero_si512();
            for (int i = 0; i < 4; i++) Mn = _mm512_dpwssd_epi32(Mn, pairs[i], _mm512_set1_epi32(ub->mins[o][i]));
            __m512 *a = &acc[o][b & 7];
            *a = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(ub->d[o]), dx), _mm512_cvtepi32_ps(S), *a);
            *a = _mm512_fnmadd_ps(_mm512_mul_ps(_mm512_set1_ps(ub->dmin[o]), dx), _mm512_cvtepi32_ps(Mn), *a);
        }
    }
    for (int o = 0; o < AMX_TILE; o++) {
        const __m512 *a = acc[o]; /* hsum8's order: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)) */
        float out[AMX_TILE];
        _mm512_storeu_ps(out, _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6])),
                                            _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7]))));
        for (int i = 0; i < nx; i++) y[i * ldy + n0 + o] = bias ? out[i] + bias[n0 + o] : out[i];
    }
}

/* The tile configuration for tiles of nx inputs: C (0, 1) 16 outputs x nx int32, A (2, 3) 16 x 64 bytes, B (4) 16 x
 * 4 nx bytes. */
TARGET_AMX static void amx_configure(int nx) {
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 5; t++) cfg.rows[t] = 16;
    cfg.colsb[0] = cfg.colsb[1] = cfg.colsb[4] = (uint16_t)(4 * nx);
    cfg.colsb[2] = cfg.colsb[3] = 64;
    _tile_loadconfig(&cfg);
}

/* The Q4_K product of the first N16 outputs (a multiple of 16) with M inputs on AMX tiles, in as few tiles of inputs
 * as hold them, of even sizes (17 rows: 9 + 8). One tile (a verify pass): each block unpacked while the tiles read
 * the one before. More (a prompt): a group's blocks are unpacked once into a buffer of the thread's and every tile
 * of inputs runs over them, instead of unpacking the group again per tile (the unpacking, not the tiles, is most of
 * a block's work). A tile's operations and their order are the same either way: the same bits. */
TARGET_AMX static int amx_matmul_q4_k(const uint8_t *w, int64_t stride, int grouped, const act_k *const *x,
                                      int64_t M, const float *bias, float *y, int64_t ldy, int64_t N16, int64_t K,
                                      int threads) {
    const int64_t tiles = (M + AMX_TILE - 1) / AMX_TILE, blocks = K / QK;
    const int unpack_once = tiles > 1 || grouped;
    amx_inputs *in = calloc((size_t)tiles, sizeof(amx_inputs));
    int64_t *first = malloc(sizeof(int64_t) * (size_t)tiles);
    amx_block *unpacked = unpack_once ? aligned_alloc(64, sizeof(amx_block) * (size_t)(blocks * threads)) : NULL;
    int failed = !in || !first || (unpack_once && !unpacked);
    for (int64_t t = 0, i0 = 0; !failed && t < tiles; t++) {
        const int nx = (int)(M / tiles + (t < M % tiles));
        first[t] = i0;
        failed = amx_prepare_inputs(&in[t], x + i0, nx, K);
        i0 += nx;
    }
    if (!failed) {
#pragma omp parallel num_threads(threads)
        {
            amx_block *mine = unpacked ? unpacked + blocks * omp_get_thread_num() : NULL;
            int configured = 0; /* the nx the tiles are configured for */
#pragma omp for schedule(static)
            for (int64_t g = 0; g < N16 / AMX_TILE; g++) {
                /* the group's 16 rows (the file's: `stride` bytes apart from w + n0 rows; grouped: group g's blocks),
                 * unpacked once here for every tile of inputs, or (one tile of the file's rows) by amx_group */
                const int64_t n0 = g * AMX_TILE;
                const uint8_t *wg = grouped ? w + g * blocks * R16_Q4K_BYTES : w + n0 * stride;
                if (grouped)
                    for (int64_t b = 0; b < blocks; b++)
                        for (int o = 0; o < AMX_TILE; o++) amx_unpack_block_r16(&mine[b], o, wg + b * R16_Q4K_BYTES);
                else if (mine) {
                    const int64_t ahead = n0 + 2 * AMX_TILE <= N16 ? AMX_TILE * stride : 0;
                    for (int64_t b = 0; b < blocks; b++) amx_unpack_group_block(&mine[b], wg, stride, 0, b, ahead);
                }
                for (int64_t t = 0; t < tiles; t++) {
                    if (in[t].inputs != configured) amx_configure(configured = in[t].inputs);
                    amx_group(wg, stride, &in[t], blocks, bias ? bias + n0 : NULL, y + first[t] * ldy + n0, ldy, 0,
                              mine ? AMX_TILE : N16 - n0, mine);
                }
            }
            if (configured) _tile_release();
        }
    }
    for (int64_t t = 0; in && t < tiles; t++) amx_free_inputs(&in[t]);
    free(in);
    free(first);
    free(unpacked);
    return failed ? -1 : 0;
}

/* --- Q4_K in groups of 16 rows on AMX tiles with the weights as B: passes of 13-47 rows --------------------------
 * The grouped layout keeps a piece's quants as 8 runs of 16 outputs x 4 bytes (q4k_pack_block): with the low nibbles
 * masked out, then the high ones, that is 16 rows of the B operand of tdpbsud as it reads it (K = the piece's 64
 * values, N = the group's 16 outputs). A piece holds two sub-blocks with their own scales, so each input enters A
 * twice, as two rows: its 32 quants of the low sub-block then 32 zeros, and 32 zeros then the high sub-block's. One
 * tile multiply a piece gives C (2 nx x 16 int32): row i input i's integer sums over the low sub-block, row nx + i
 * over the high one, lane r output r: the group function's lo_sum / hi_sum. From there the scales, mins and float
 * epilogue are group_q4_k_r16's line for line: the same bits. The unpacking (two masks per 64 bytes) and the tiles
 * serve every input of the pass at once, so an extra input costs two tile rows and its epilogue, not 64 vpdpbusd a
 * block; but per block the tiles' fixed work outweighs a few inputs' vpdpbusd. Measured on the Intel Xeon (1 thread,
 * weights in L2, per group and block): the group functions 55 ns + 23 per input, these tiles 90 + 12 per input. Over
 * the target file's Q4_K products (2 threads, interleaved, bench/quant_kernel.py), against the group functions in
 * one pass of up to 8 rows (two from 9): at 5-12 rows the group functions are level or faster (28 ffn_up 0.51 / 0.62
 * / 0.78 / 0.87 ms at 5 / 8 / 10 / 12 rows against the tiles' 0.55 / 0.62 / 0.81 / 0.86; 14 ffn_down 0.58 / 0.65 /
 * 0.82 / 0.89 against 0.60 / 0.68 / 0.91 / 0.97), from 14 the tiles (ffn_up 0.91 / 0.96 against 0.98 / 1.07 at 14 /
 * 16; attn_q 0.144 / 0.160 against 0.153 / 0.176). From 48 rows amx_matmul_q4_k's shared unpacking wins (128
 * rows: 4.4 against 6.2 ms). */
#define AMX_AS_B_MIN_INPUTS 13 /* fewer rows: the group functions (one pass up to R16_K_INPUTS, two to 12) */
#define AMX_AS_B_INPUTS 8     /* inputs a pass: twice as many A rows, at most a tile's 16 */

/* C (tiles 0-3, one a piece): 2 nx rows x 16 outputs in int32; A (4, 5): 2 nx rows x 64 quants; B (6, 7): 16 x (16
 * outputs x 4 nibbles). */
TARGET_AMX static void amx_configure_r16(int nx) {
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = (uint8_t)(t < 6 ? 2 * nx : 16);
        cfg.colsb[t] = 64;
    }
    _tile_loadconfig(&cfg);
}

/* The inputs' quants as A reads them, for a pass of nx inputs x: per block and piece, 2 nx rows of 64 bytes (above). */
static void amx_r16_inputs(int8_t *a, const act_k *const *x, int nx, int64_t blocks) {
    memset(a, 0, (size_t)(blocks * 4 * 2 * nx * 64));
    for (int64_t b = 0; b < blocks; b++)
        for (int p = 0; p < 4; p++, a += 2 * nx * 64)
            for (int i = 0; i < nx; i++) {
                memcpy(a + i * 64, x[i][b].q + 64 * p, 32);
                memcpy(a + (nx + i) * 64 + 32, x[i][b].q + 64 * p + 32, 32);
            }
}

/* Block b's quants (at w) as B tiles: per piece its low nibbles' 8 rows, then its high nibbles'. */
TARGET_AMX static inline void amx_r16_nibbles(uint8_t bt[4][16][64], const uint8_t *w) {
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    for (int p = 0; p < 4; p++)
        for (int t = 0; t < 8; t++) {
            const __m512i v = _mm512_loadu_si512(w + R16_QS + 512 * p + 64 * t);
            _mm512_store_si512(bt[p][t], _mm512_and_si512(v, low4));
            _mm512_store_si512(bt[p][8 + t], _mm512_and_si512(_mm512_srli_epi16(v, 4), low4));
        }
}

/* The 16 outputs of one Q4_K group for nx (<= AMX_AS_B_INPUTS) inputs, out[i * R16 + r]: a holds the pass's A rows
 * (amx_r16_inputs), x the same inputs (their scales and sums). Per block: the tiles, then (while they run) the next
 * block's nibbles, then the epilogue on the tiles' sums. */
TARGET_AMX static void amx_group_q4_k_r16(const uint8_t *w, const int8_t *a, const act_k *const *x, int nx,
                                          int64_t blocks, int64_t room, float *out) {
    __m512 acc[AMX_AS_B_INPUTS][8];
    zero_accumulators(acc, nx);
    uint8_t bt[2][4][16][64] __attribute__((aligned(64))); /* blocks alternate, as amx_group's */
    int32_t c[4][2 * AMX_AS_B_INPUTS][R16] __attribute__((aligned(64))); /* piece p: c[p][row][output] */
    const int64_t piece = 2 * nx * 64;
    amx_r16_nibbles(bt[0], w);
    for (int64_t b = 0; b < blocks; b++, w += R16_Q4K_BYTES, a += 4 * piece) {
        r16_prefetch(w, R16_Q4K_BYTES, b, room);
        uint8_t(*const bb)[16][64] = bt[b & 1];
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        _tile_loadd(4, a, 64);
        _tile_loadd(6, bb[0], 64);
        _tile_dpbsud(0, 4, 6);
        _tile_loadd(5, a + piece, 64);
        _tile_loadd(7, bb[1], 64);
        _tile_dpbsud(1, 5, 7);
        _tile_loadd(4, a + 2 * piece, 64);
        _tile_loadd(6, bb[2], 64);
        _tile_dpbsud(2, 4, 6);
        _tile_loadd(5, a + 3 * piece, 64);
        _tile_loadd(7, bb[3], 64);
        _tile_dpbsud(3, 5, 7);
        _tile_stored(0, c[0], 64);
        _tile_stored(1, c[1], 64);
        _tile_stored(2, c[2], 64);
        _tile_stored(3, c[3], 64);
        if (b + 1 < blocks) amx_r16_nibbles(bt[(b + 1) & 1], w + R16_Q4K_BYTES);
        __m512i S[AMX_AS_B_INPUTS];
        for (int i = 0; i < nx; i++) S[i] = _mm512_setzero_si512();
        for (int p = 0; p < 4; p++) {
            const uint8_t *scales = w + R16_SCALES + 2 * R16 * p;
            const __m512i sc_lo = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)scales));
            const __m512i sc_hi = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(scales + R16)));
            for (int i = 0; i < nx; i++)
                S[i] = _mm512_add_epi32(
                    S[i], _mm512_add_epi32(_mm512_mullo_epi32(_mm512_load_si512(c[p][i]), sc_lo),
                                           _mm512_mullo_epi32(_mm512_load_si512(c[p][nx + i]), sc_hi)));
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + R16_D)));
        const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + R16_DMIN)));
        for (int i = 0; i < nx; i++) q4k_r16_flush_512(w, 0, d, dmin, &x[i][b], S[i], &acc[i][b & 7]);
    }
    for (int i = 0; i < nx; i++) _mm512_storeu_ps(out + i * R16, sum8_512(acc[i]));
}

/* Group g's 16 outputs for nx inputs (out[i * R16 + r]) into y, plus the bias. */
static inline void put_group(const float *out, int nx, const float *bias, float *y, int64_t ldy, int64_t g) {
    for (int i = 0; i < nx; i++)
        for (int r = 0; r < R16; r++) {
            const float v = out[i * R16 + r];
            y[i * ldy + g * R16 + r] = bias ? v + bias[g * R16 + r] : v;
        }
}

/* The Q4_K_R16 product with M inputs on the tiles above, in passes of at most AMX_AS_B_INPUTS inputs of even sizes
 * (each pass's A rows made once, before the threads split the groups). */
TARGET_AMX static int amx_r16_matmul_q4_k(const uint8_t *w, const act_k *const *x, const float *bias, float *y,
                                          int64_t ldy, int64_t N, int64_t K, int64_t M, int threads) {
    const int64_t blocks = K / QK, n_groups = N / R16, passes = (M + AMX_AS_B_INPUTS - 1) / AMX_AS_B_INPUTS;
    int8_t *a = aligned_alloc(64, (size_t)(blocks * 4 * 2 * M * 64)); /* pass after pass: 512 bytes an input a block */
    if (!a) return -1;
    for (int64_t pass = 0, i0 = 0; pass < passes; pass++) {
        const int nx = (int)(M / passes + (pass < M % passes));
        amx_r16_inputs(a + i0 * blocks * 512, x + i0, nx, blocks);
        i0 += nx;
    }
#pragma omp parallel num_threads(threads)
    {
        int configured = 0; /* the nx the tiles are configured for */
#pragma omp for schedule(static)
        for (int64_t g = 0; g < n_groups; g++) {
            const uint8_t *wg = w + g * blocks * R16_Q4K_BYTES;
            for (int64_t pass = 0, i0 = 0; pass < passes; pass++) {
                const int nx = (int)(M / passes + (pass < M % passes));
                float out[AMX_AS_B_INPUTS * R16];
                if (nx != configured) amx_configure_r16(configured = nx);
                amx_group_q4_k_r16(wg, a + i0 * blocks * 512, x + i0, nx, blocks, (n_groups - g) * blocks, out);
                put_group(out, nx, bias, y + i0 * ldy, ldy, g);
                i0 += nx;
            }
        }
        if (configured) _tile_release();
    }
    free(a);
    return 0;
}

static int is_k_quant(int type) { return type == Q4_K || type == Q6_K || type == Q4_K_R16 || type == Q6_K_R16; }

/* The offset each activation lane's sum starts from (act_32.offsets: -offset x the sum of its four quants): the
 * group functions on every kernel and the AVX-512 kernels' rows multiply Q5_0's quants as unsigned bytes (+16), the
 * AVX-512 kernels' groups Q8_0's as bytes + 128; the avx2 rows (and Q8_0's groups there, unpacked to rows) take
 * them signed. */
static int act_offset(int type, int kernel) {
    if (type == Q5_0_R16) return 16;
    if (kernel == KERNEL_AVX2) return 0;
    return type == Q5_0 ? 16 : type == Q8_0_R16 ? 128 : 0;
}

/* Output n (weights wn, the file's row) for every input, in groups of the kernel's width, of even sizes (9 rows: 5 +
 * 4): y[i * ldy + n]. The row functions per kernel: avx2's (four inputs a pass), avx512-vnni-256's (eight; Q4_K and
 * Q6_K with vpdpwssd on 256-bit registers) and the 512-bit ones of avx512-vnni and amx (eight); Q5_0 / Q8_0 run the
 * same 256-bit VNNI functions on the last three. left: the matrix's bytes from wn on, how far the row functions may
 * prefetch (0: not at all). */
TARGET static inline void product_row(int type, const uint8_t *wn, const void **rows, int64_t M, int kernel,
                                      int64_t K, int64_t left, const float *bias, float *y, int64_t ldy) {
    const int avx2 = kernel == KERNEL_AVX2, ymm = kernel == KERNEL_AVX512_256;
    const int group = !avx2 ? GROUP512 : type == Q6_K ? Q6K_AVX2_ROW_GROUP : GROUP;
    const int64_t groups = (M + group - 1) / group;
    for (int64_t g = 0, i0 = 0; g < groups; g++) {
        const int nx = (int)(M / groups + (g < M % groups));
        const act_k *const *xk = (const act_k *const *)(rows + i0);
        const act_32 *const *x32 = (const act_32 *const *)(rows + i0);
        float out[GROUP512];
        switch (type) {
        case Q4_K: (avx2 ? row_q4_k_for : ymm ? row_q4_k_256_for : row_q4_k_512_for)[nx](wn, xk, K, left, out); break;
        case Q6_K: (avx2 ? row_q6_k_for : ymm ? row_q6_k_256_for : row_q6_k_512_for)[nx](wn, xk, K, left, out); break;
        case Q5_0: (avx2 ? row_q5_0_for : row_q5_0_512_for)[nx](wn, x32, K, left, out); break;
        case Q8_0: (avx2 ? row_q8_0_for : row_q8_0_512_for)[nx](wn, x32, K, left, out); break;
        default: row_float(type, wn, (const float *const *)(rows + i0), nx, K, out); break;
        }
        for (int i = 0; i < nx; i++) y[(i0 + i) * ldy] = bias ? out[i] + *bias : out[i];
        i0 += nx;
    }
}

/* Inputs a pass over a group's blocks on `kernel`. Passes change no value: each input's outputs are formed alone. */
static inline int r16_pass_inputs(int type, int kernel) {
    if (!is_k_quant(type)) return R16_INPUTS;
    return kernel == KERNEL_AVX2 ? R16_K_AVX2_INPUTS : R16_K_INPUTS;
}

/* A grouped type (N a multiple of 16): every kernel runs the group functions (a few inputs per pass over a group,
 * the group's blocks staying in cache between passes; avx2 and avx512-vnni-256 on 256-bit registers, the others on
 * 512-bit ones). Threads split the groups. */
TARGET static void r16_matmul(int type, const uint8_t *w, const void **rows, const float *bias, float *y, int64_t ldy,
                              int64_t N, int64_t K, int64_t M, int threads, int kernel) {
    const int64_t blocks = K / BLOCK_VALUES[type], n_groups = N / R16, group_bytes = blocks * R16 * BLOCK_BYTES[type];
    const int per_pass = r16_pass_inputs(type, kernel);
    const int64_t passes = (M + per_pass - 1) / per_pass;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t g = 0; g < n_groups; g++) {
        const uint8_t *wg = w + g * group_bytes;
        for (int64_t pass = 0, i0 = 0; pass < passes; pass++) {
            const int nx = (int)(M / passes + (pass < M % passes));
            float out[R16_K_INPUTS * R16];
            (kernel == KERNEL_AVX2         ? group_product_avx2
             : kernel == KERNEL_AVX512_256 ? group_product_256
                                           : group_product_512)(type, wg, rows + i0, nx, blocks,
                                                                (n_groups - g) * blocks, out);
            put_group(out, nx, bias, y + i0 * ldy, ldy, g);
            i0 += nx;
        }
    }
}

/* Inputs per pass over the weights on the row and group code: as many as keep their quantised activations within
 * CHUNK_BYTES (L2), so that a long pass (a prompt: 512 rows of the 8960-wide down product are 5 MB) reads them from
 * L2 for every output row rather than from L3 or memory, at the price of reading the weights once per chunk; a pass
 * of a few rows (a decoding step, a verify pass) is one chunk. Chunks change no value: an output's every input is
 * formed the same way whichever inputs share its pass. */
#define CHUNK_BYTES (512 * 1024)

static int64_t chunk_rows(int type, int64_t K, int64_t M) {
    const int row = row_type_of(type) >= 0 ? row_type_of(type) : type;
    const int64_t per_row = row == F32 || row == F16 ? K * (int64_t)sizeof(float)
                            : is_k_quant(row)       ? (int64_t)sizeof(act_k) * (K / QK)
                                                    : (int64_t)sizeof(act_32) * (K / Q32);
    const int64_t rows = CHUNK_BYTES / per_row / GROUP512 * GROUP512;
    return rows < GROUP512 ? GROUP512 : rows < M ? rows : M;
}

#define QUANTIZE_PARALLEL_ROWS 32 /* inputs from which matmul quantises them on every thread */

/* y (M x N, rows ldy floats apart) = x (M x K) @ W^T (+ b): W's rows of ggml blocks, `stride` bytes apart (the
 * grouped types: groups of 16 rows, N a multiple of 16: the caller checks); `kernel` one that kernel_supported()
 * accepts (the caller checks). */
TARGET static int matmul(int type, const uint8_t *w, int64_t stride, const float *x, const float *bias, float *y,
                         int64_t ldy, int64_t N, int64_t K, int64_t M, int threads, int kernel) {
    void *acts = NULL;
    const void **rows = malloc(sizeof(void *) * M);
    if (!rows) return -1;
    if (type == F32 || type == F16) {
        for (int64_t i = 0; i < M; i++) rows[i] = x + i * K;
    } else {
        const size_t per_row = is_k_quant(type) ? sizeof(act_k) * (K / QK) : sizeof(act_32) * (K / Q32);
        acts = malloc(per_row * M);
        if (!acts) {
            free(rows);
            return -1;
        }
        /* a prompt's inputs are quantised on every thread (one thread took 0.67 ms of a 512-row product, the other
         * idle); a step's few stay on this one, where a parallel region costs more than it saves. Each row alone:
         * the same bytes whichever thread forms it. */
#pragma omp parallel for if (M >= QUANTIZE_PARALLEL_ROWS) num_threads(threads) schedule(static)
        for (int64_t i = 0; i < M; i++) {
            rows[i] = (char *)acts + per_row * i;
            if (is_k_quant(type))
                quantize_row_k(x + i * K, (act_k *)rows[i], K);
            else
                quantize_row_32(x + i * K, (act_32 *)rows[i], K, act_offset(type, kernel));
        }
    }
    if (kernel == KERNEL_AMX && type == Q4_K_R16 && M >= AMX_AS_B_MIN_INPUTS) { /* tiles: the two grouped paths */
        const act_k *const *xk = (const act_k *const *)rows;
        const int failed = M >= AMX_MIN_INPUTS_R16 ? amx_matmul_q4_k(w, stride, 1, xk, M, bias, y, ldy, N, K, threads)
                                                   : amx_r16_matmul_q4_k(w, xk, bias, y, ldy, N, K, M, threads);
        free(acts);
        free(rows);
        return failed;
    }
    if (is_grouped(type)) {
        const int64_t chunk = chunk_rows(type, K, M);
        for (int64_t i0 = 0; i0 < M; i0 += chunk)
            r16_matmul(type, w, rows + i0, bias, y + i0 * ldy, ldy, N, K, M - i0 < chunk ? M - i0 : chunk, threads,
                       kernel);
        free(acts);
        free(rows);
        return 0;
    }
    /* AMX: Q4_K outputs 16 at a time, the inputs in as few tiles as hold them, of even sizes (17 rows: 9 + 8); the
     * outputs past the last group of 16 go on below (the same bits) */
    int64_t n_first = 0;
    int failed = 0;
    if (kernel == KERNEL_AMX && type == Q4_K && M >= AMX_MIN_INPUTS && N >= AMX_TILE) {
        n_first = N / AMX_TILE * AMX_TILE;
        failed = amx_matmul_q4_k(w, stride, 0, (const act_k *const *)rows, M, bias, y, ldy, n_first, K, threads);
    }
    const int64_t chunk = chunk_rows(type, K, M);
    for (int64_t i0 = 0; i0 < M && n_first < N; i0 += chunk) {
        const int64_t mc = M - i0 < chunk ? M - i0 : chunk;
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int64_t n = n_first; n < N; n++) {
            const uint8_t *wn = w + n * stride;
            /* the row functions ask for the weights ROW_AHEAD on as they go (without it a step read them at a third
             * of the machine's bandwidth) */
            product_row(type, wn, rows + i0, mc, kernel, K, (N - n) * stride, bias ? bias + n : NULL,
                        y + i0 * ldy + n, ldy);
        }
    }
    free(acts);
    free(rows);
    return failed ? -1 : 0;
}
#include "_quant_hi4.h"
#endif

#endif
