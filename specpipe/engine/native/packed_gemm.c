/* Small-M GEMM with fp32 arithmetic for decoding and verification: y[M][N] = x[M][K] @ w[N][K]^T (+ b[N]).
 *
 * Speculative decoding feeds 1 to ~32 tokens per forward, where BLAS sgemm is at its weakest: on
 * the reference CPUs, MKL takes more than twice as long for M=8 as for M=1 on a 1536x8960 weight,
 * although both read the weight once. This kernel streams each weight element from memory once and
 * uses it for all rows of a block from registers, so M=1 runs near memory bandwidth and M=8 costs
 * little more.
 *
 * Layout: w is packed once into column panels of P = NV * VL output columns, [ceil(N/P)][K][P]
 * (zero-padded), so a panel streams contiguously, prefetched ahead of the FMAs so that a block's
 * arithmetic does not stall the stream. A row block of MR rows keeps MR x NV vector accumulators in
 * registers; larger M takes several row blocks over each chunk of KC input features in turn, so
 * that the chunk, read from memory once, sits in L2 for all of them (bf16 and int8 weights widened once, by
 * the first row block).
 *
 * Every output element is one fused multiply-add chain over k = 0..K-1, whatever M is and whichever
 * row block or thread computes it: a token's logits do not depend on how many tokens share its
 * forward (batch invariance), so verifying k tokens at once gives each the bits of feeding it alone.
 *
 * Built by specpipe.engine.native with the host compiler and -march=native; GNU C vector extensions pick
 * the host's vector width (AVX-512: 16 floats, AVX2: 8, NEON and SSE: 4).
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

/* VL floats a vector, NV vectors a panel row, MR rows a block: MR * NV accumulators, NV weight
 * vectors and a broadcast fit the register file. */
#if defined(__AVX512F__)
#define VL 16
#define NV 3
#define MR 8  /* 24 + 3 + 1 of 32 registers: M = 8 in one pass over the weight */
#elif defined(__AVX2__) || defined(__AVX__)
#define VL 8
#define NV 4
#define MR 3  /* 12 accumulators of 16 registers; weights as memory operands */
#elif defined(__ARM_NEON)
#define VL 4
#define NV 4
#define MR 6
#else
#define VL 4
#define NV 4
#define MR 2
#endif
#define P (VL * NV)

typedef float vf __attribute__((vector_size(VL * sizeof(float)), aligned(sizeof(float))));
typedef unsigned short vh __attribute__((vector_size(VL * sizeof(short)), aligned(sizeof(short))));
typedef unsigned int vu __attribute__((vector_size(VL * sizeof(int))));
typedef signed char vb __attribute__((vector_size(VL)));
typedef int vi __attribute__((vector_size(VL * sizeof(int))));

/* Weights in fp32, in bf16 (the upper half of an fp32: widened in a register, so the weights stream
 * at half the bytes while the arithmetic stays fp32), or in int8 with a scale per output column
 * (a quarter of the bytes; the scale multiplies the column's sum once, after its FMA chain). */
static inline vf load_f32(const float *w) { return *(const vf *)w; }
static inline vf load_bf16(const unsigned short *w) { return (vf)(__builtin_convertvector(*(const vh *)w, vu) << 16); }
static inline vf load_i8(const signed char *w) { /* sign-extend, convert: the compiler's generic vector
                                                   * conversion loads int8 byte by byte */
#if defined(__AVX512F__)
    return (vf)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)w)));
#elif defined(__AVX2__)
    return (vf)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)w)));
#else
    vb v;
    memcpy(&v, w, sizeof v);
    return __builtin_convertvector(__builtin_convertvector(v, vi), vf);
#endif
}

/* The row block's accumulators live in registers over one chunk of KC input features and in the
 * panel's buffer between chunks (stored and reloaded as they are, so every output keeps one FMA
 * chain over k = 0..K-1). Where M needs several row blocks, each chunk of the panel (KC x P weights)
 * is read from memory once and stays in L2 while every row block uses it. */
#define KC 512
/* How far ahead of the FMAs the weight stream is prefetched, in panel rows (k). */
#define PREFETCH 64

#define ROW_BLOCK(R, T, WT, KEEP)                                                                          \
    static void row_block_##T##_##R(const float *x, size_t K, size_t k0, size_t k1, const WT *w,           \
                                    float *buf, float *wide) {                                             \
        /* w: the panel at row k0, so w[(k - k0) * P + c] is the weight of input k, column c. wide: where  \
         * to keep the weights as loaded (fp32) for the chunk's other row blocks, or NULL; KEEP: 0 where   \
         * they never need keeping (fp32 weights) */                                                       \
        vf acc[R][NV];                                                                                     \
        for (int r = 0; r < R; r++)                                                                        \
            for (int v = 0; v < NV; v++) acc[r][v] = k0 ? *(vf *)(buf + r * P + v * VL) : (vf){0};         \
        for (size_t k = k0; k < k1; k++) {                                                                 \
            const WT *wk = w + (k - k0) * P;                                                               \
            if (R > 1) /* one row is bound by memory alone; a block's FMAs must not stall the stream */    \
                for (size_t o = 0; o < P * sizeof(WT); o += 64)                                            \
                    __builtin_prefetch((const char *)(wk + PREFETCH * P) + o);                             \
            vf wv[NV];                                                                                     \
            for (int v = 0; v < NV; v++) wv[v] = load_##T(wk + v * VL);                                    \
            if (KEEP && wide)                                                                              \
                for (int v = 0; v < NV; v++) *(vf *)(wide + (k - k0) * P + v * VL) = wv[v];                \
            for (int r = 0; r < R; r++) {                                                                  \
                float xr = x[r * K + k];                                                                   \
                for (int v = 0; v < NV; v++) acc[r][v] += xr * wv[v];                                      \
            }                                                                                              \
        }                                                                                                  \
        for (int r = 0; r < R; r++)                                                                        \
            for (int v = 0; v < NV; v++) *(vf *)(buf + r * P + v * VL) = acc[r][v];                        \
    }

/* row_block_<T>[R]: the row block of R rows (R <= MR). */
#define ROW_BLOCKS(T, WT, KEEP)                                                                            \
    ROW_BLOCK(1, T, WT, KEEP) ROW_BLOCK(2, T, WT, KEEP) ROW_BLOCK(3, T, WT, KEEP)                          \
    ROW_BLOCK(4, T, WT, KEEP) ROW_BLOCK(5, T, WT, KEEP) ROW_BLOCK(6, T, WT, KEEP)                          \
    ROW_BLOCK(7, T, WT, KEEP) ROW_BLOCK(8, T, WT, KEEP)                                                    \
    static void (*const row_block_##T[9])(const float *, size_t, size_t, size_t, const WT *, float *,      \
                                          float *) = {NULL,                 row_block_##T##_1,             \
                                                      row_block_##T##_2,    row_block_##T##_3,             \
                                                      row_block_##T##_4,    row_block_##T##_5,             \
                                                      row_block_##T##_6,    row_block_##T##_7,             \
                                                      row_block_##T##_8};

ROW_BLOCKS(f32, float, 0)
ROW_BLOCKS(bf16, unsigned short, 1)
ROW_BLOCKS(i8, signed char, 1)

/* x [M][K], w packed [ceil(N/P)][K][P], s [N] (int8 weights' scales) or NULL, b [N] or NULL,
 * y [M][N] = s * (x @ w^T) + b; panels split across threads, each with a buffer of M x P
 * accumulators. With narrow weights and several row blocks (WIDEN), the first row block of a chunk
 * keeps the weights it widened in a second buffer (KC x P floats, in L2) and the others read them
 * there, rather than each widening the chunk again. */
#define PACKED_LINEAR(T, WT, WIDEN)                                                                        \
    int specpipe_packed_linear_##T(const float *x, size_t M, size_t K, const WT *w, size_t N,              \
                                   const float *s, const float *b, float *y, int threads) {                \
        long panels = (long)((N + P - 1) / P);                                                             \
        size_t kc = M <= MR ? K : KC; /* one row block: one chunk */                                       \
        size_t bytes = (M * P * sizeof(float) + 63) / 64 * 64;                                             \
        int widen = WIDEN && M > MR;                                                                       \
        int failed = 0;                                                                                    \
        _Pragma("omp parallel num_threads(threads) if (threads > 1)") {                                    \
            float *buf = aligned_alloc(64, bytes);                                                         \
            float *wide = widen ? aligned_alloc(64, KC * P * sizeof(float)) : NULL;                        \
            int ready = buf && (wide || !widen);                                                           \
            if (!ready) {                                                                                  \
                _Pragma("omp atomic write") failed = 1;                                                    \
            } else if (!K) { /* no input features: y is the bias (or zero) */                              \
                memset(buf, 0, bytes);                                                                     \
            }                                                                                              \
            _Pragma("omp for schedule(static)")                                                            \
            for (long j = 0; j < panels; j++) {                                                            \
                if (!ready) continue;                                                                      \
                const WT *panel = w + (size_t)j * K * P;                                                   \
                size_t col = (size_t)j * P;                                                                \
                size_t ncols = N - col < P ? N - col : P;                                                  \
                for (size_t k0 = 0; k0 < K; k0 += kc) {                                                    \
                    size_t k1 = K - k0 < kc ? K : k0 + kc;                                                 \
                    for (size_t m = 0; m < M; m += MR) {                                                   \
                        size_t rows = M - m < MR ? M - m : MR;                                             \
                        if (m && wide)                                                                     \
                            row_block_f32[rows](x + m * K, K, k0, k1, wide, buf + m * P, NULL);            \
                        else                                                                               \
                            row_block_##T[rows](x + m * K, K, k0, k1, panel + k0 * P, buf + m * P, wide);  \
                    }                                                                                      \
                }                                                                                          \
                for (size_t r = 0; r < M; r++)                                                             \
                    for (size_t c = 0; c < ncols; c++) {                                                   \
                        float v = s ? buf[r * P + c] * s[col + c] : buf[r * P + c];                        \
                        y[r * N + col + c] = b ? v + b[col + c] : v;                                       \
                    }                                                                                      \
            }                                                                                              \
            free(buf);                                                                                     \
            free(wide);                                                                                    \
        }                                                                                                  \
        return failed ? -1 : 0; /* -1: a thread's buffers could not be allocated */                        \
    }

int specpipe_panel_width(void) { return P; }

PACKED_LINEAR(f32, float, 0)
PACKED_LINEAR(bf16, unsigned short, 1)
PACKED_LINEAR(i8, signed char, 1)
