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
 * W8A8 (specpipe_packed_linear_q8): int8 weights and int8 activations, multiplied with integer dot
 * products (AVX-512 VNNI or AVX2 where the CPU has them), as llama.cpp multiplies its quantized blocks. Each
 * row of x is quantized per block of QB input features (a scale each, its largest |x| at 127); a
 * block's dot product is an exact int32 sum, so it is the same whatever the order or vector width,
 * and the blocks' scaled sums join one FMA chain per output in block order: batch-invariant too.
 * W4A8 (specpipe_packed_linear_q4) does the same with 4-bit Q4_K weights, a GGUF's own blocks.
 *
 * Built by specpipe.engine.native with the host compiler and -march=native; GNU C vector extensions pick
 * the host's vector width (AVX-512: 16 floats, AVX2: 8, NEON and SSE: 4).
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
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

/* --- Threads ---------------------------------------------------------------------------------------
 * A kernel call splits its work (column panels, attention rows, blocks) over worker threads of this
 * library's own, not OpenMP's. libgomp keeps a team for each thread that ever ran a parallel region
 * (the main thread at load, each role's scheduler thread, a servicer computing entropy), and once
 * their threads outnumber the cores its idle workers spin 100 times, not about 300,000, before they
 * sleep: every kernel call of a forward then woke its workers from sleep, and a verifier's forward on
 * its scheduler thread took 1.25x the time it took on the main thread (2 cores, qwen-coder, W4A8).
 * Here one pool serves every caller: its workers spin for SPIN_NS after their last job before they
 * sleep, so the calls of a forward, and forwards a round apart, find them awake. A caller that finds
 * the pool busy (the other role's forward) runs its call on its own thread: a column's sums are the
 * same on any number of threads, so that changes timing, never a bit. */
typedef void (*Job)(void *ctx, int thread, int threads);

#define MAX_WORKERS 255
#define SPIN_NS 2000000L /* 2 ms */

typedef struct {
    _Alignas(64) atomic_ulong generation; /* incremented by the caller for each job of this worker */
    Job job;
    void *ctx;
    int thread, threads;
} Slot;

static Slot slots[MAX_WORKERS + 1];                              /* slots[1..workers] */
static int workers;                                             /* started (under busy) */
static pthread_mutex_t busy = PTHREAD_MUTEX_INITIALIZER;         /* held by the caller of a job */
static pthread_mutex_t sleep_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static atomic_int sleepers, pending;

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

static void *worker(void *arg) {
    Slot *slot = arg;
    unsigned long seen = 0; /* a slot's worker is started before its first job */
    for (;;) {
        long start = now_ns();
        for (unsigned i = 1; atomic_load_explicit(&slot->generation, memory_order_acquire) == seen; i++) {
            if (i % 64) {
                relax();
            } else if (now_ns() - start < SPIN_NS) {
                sched_yield(); /* a thread waiting for this core (torch's own OpenMP workers, another role) runs */
            } else { /* idle: sleep until the next job */
                pthread_mutex_lock(&sleep_lock);
                atomic_fetch_add(&sleepers, 1);
                while (atomic_load(&slot->generation) == seen) pthread_cond_wait(&wake, &sleep_lock);
                atomic_fetch_sub(&sleepers, 1);
                pthread_mutex_unlock(&sleep_lock);
            }
        }
        seen++; /* one job at a time: the caller waits for it before it gives this worker another */
        slot->job(slot->ctx, slot->thread, slot->threads);
        atomic_fetch_sub_explicit(&pending, 1, memory_order_release);
    }
    return NULL;
}

/* A forked child has none of the parent's workers (or whatever locks a parent's thread held). */
static void forked(void) {
    pthread_mutex_init(&busy, NULL);
    pthread_mutex_init(&sleep_lock, NULL);
    pthread_cond_init(&wake, NULL);
    atomic_store(&sleepers, 0);
    for (int i = 1; i <= workers; i++) atomic_store(&slots[i].generation, 0);
    workers = 0;
}

__attribute__((constructor)) static void register_fork_handler(void) { pthread_atfork(NULL, NULL, forked); }

/* job(ctx, t, n) for t = 0..n-1 on n threads (the caller's and n - 1 workers; fewer where the pool is
 * busy or a thread cannot be started), returning when every part has. */
static void run_threads(Job job, void *ctx, int threads) {
    if (threads > MAX_WORKERS + 1) threads = MAX_WORKERS + 1;
    if (threads <= 1 || pthread_mutex_trylock(&busy)) {
        job(ctx, 0, 1);
        return;
    }
    while (workers < threads - 1) {
        pthread_t id;
        if (pthread_create(&id, NULL, worker, &slots[workers + 1])) break;
        pthread_detach(id);
        workers++;
    }
    if (threads > workers + 1) threads = workers + 1;
    atomic_store(&pending, threads - 1);
    for (int i = 1; i < threads; i++) {
        slots[i].job = job, slots[i].ctx = ctx, slots[i].thread = i, slots[i].threads = threads;
        atomic_fetch_add(&slots[i].generation, 1);
    }
    if (atomic_load(&sleepers)) {
        pthread_mutex_lock(&sleep_lock);
        pthread_cond_broadcast(&wake);
        pthread_mutex_unlock(&sleep_lock);
    }
    job(ctx, 0, threads);
    for (unsigned i = 1; atomic_load_explicit(&pending, memory_order_acquire); i++) {
        if (i % 1024 == 0) sched_yield(); /* a worker without a core (more threads than cores) */
        relax();
    }
    pthread_mutex_unlock(&busy);
}

/* Thread t's share [*begin, *end) of n items split over threads: contiguous, sizes differing by one. */
static void share(long n, int t, int threads, long *begin, long *end) {
    long q = n / threads, r = n % threads;
    *begin = t * q + (t < r ? t : r);
    *end = *begin + q + (t < r);
}

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

/* Output column c of a row: its sum, times the column's scale s[c] (int8 weights) and plus its bias b[c] where
 * there are, with one rounding where both are (a fused multiply-add, whether or not the compiler may fuse). */
static inline float output(float sum, const float *s, const float *b, size_t c) {
    if (s && b) return __builtin_fmaf(sum, s[c], b[c]);
    if (s) return sum * s[c];
    return b ? sum + b[c] : sum;
}

/* x [M][K], w packed [ceil(N/P)][K][P], s [N] (int8 weights' scales) or NULL, b [N] or NULL,
 * y [M][N] = s * (x @ w^T) + b; panels split across threads, each with a buffer of M x P
 * accumulators. With narrow weights and several row blocks (widen), the first row block of a chunk
 * keeps the weights it widened in a second buffer (KC x P floats, in L2) and the others read them
 * there, rather than each widening the chunk again. */
typedef struct {
    const float *x;
    size_t M, K;
    const void *w;
    size_t N;
    const float *s, *b;
    float *y;
    size_t kc, bytes;
    int widen, failed;
} Linear;

#define PACKED_LINEAR(T, WT, WIDEN)                                                                        \
    static void packed_linear_part_##T(void *ctx, int thread, int threads) {                              \
        Linear *job = ctx;                                                                                 \
        const float *x = job->x;                                                                             \
        const WT *w = job->w;                                                                                \
        size_t M = job->M, K = job->K, N = job->N, kc = job->kc;                                                   \
        float *buf = aligned_alloc(64, job->bytes);                                                          \
        float *wide = job->widen ? aligned_alloc(64, KC * P * sizeof(float)) : NULL;                         \
        long begin, end;                                                                                   \
        share((long)((N + P - 1) / P), thread, threads, &begin, &end);                                     \
        if (!buf || (job->widen && !wide)) {                                                                 \
            __atomic_store_n(&job->failed, 1, __ATOMIC_RELAXED);                                             \
            begin = end;                                                                                   \
        } else if (!K) { /* no input features: y is the bias (or zero) */                                  \
            memset(buf, 0, job->bytes);                                                                      \
        }                                                                                                  \
        for (long j = begin; j < end; j++) {                                                               \
            const WT *panel = w + (size_t)j * K * P;                                                       \
            size_t col = (size_t)j * P;                                                                    \
            size_t ncols = N - col < P ? N - col : P;                                                      \
            for (size_t k0 = 0; k0 < K; k0 += kc) {                                                        \
                size_t k1 = K - k0 < kc ? K : k0 + kc;                                                     \
                for (size_t m = 0; m < M; m += MR) {                                                       \
                    size_t rows = M - m < MR ? M - m : MR;                                                 \
                    if (m && wide)                                                                         \
                        row_block_f32[rows](x + m * K, K, k0, k1, wide, buf + m * P, NULL);                \
                    else                                                                                   \
                        row_block_##T[rows](x + m * K, K, k0, k1, panel + k0 * P, buf + m * P, wide);      \
                }                                                                                          \
            }                                                                                              \
            for (size_t r = 0; r < M; r++)                                                                 \
                for (size_t c = 0; c < ncols; c++) {                                                       \
                    job->y[r * N + col + c] = output(buf[r * P + c], job->s, job->b, col + c);              \
                }                                                                                          \
        }                                                                                                  \
        free(buf);                                                                                         \
        free(wide);                                                                                        \
    }                                                                                                      \
    int specpipe_packed_linear_##T(const float *x, size_t M, size_t K, const WT *w, size_t N,              \
                                   const float *s, const float *b, float *y, int threads) {                \
        Linear part = {x, M, K, w, N, s, b, y, M <= MR ? K : KC, (M * P * sizeof(float) + 63) / 64 * 64,   \
                       WIDEN && M > MR, 0};                                                                \
        run_threads(packed_linear_part_##T, &part, threads);                                               \
        return part.failed ? -1 : 0; /* -1: a thread's buffers could not be allocated */                   \
    }

int specpipe_panel_width(void) { return P; }

/* --- W8A8 ------------------------------------------------------------------------------------------
 * Weights: int8 w with a scale per output column, stored as unsigned w + 128 (VNNI multiplies unsigned
 * by signed bytes) in panels of P columns, 4 consecutive input features a column together:
 * [ceil(N/P)][Kp/4][P][4], Kp = K rounded up to QB (padding: w = 0). Activations: a row's block b of
 * QB features as signed bytes xq with scale xs; sum_k xq * (w + 128) - 128 * sum_k xq = sum_k xq * w.
 */
#define QB 64     /* input features per activation scale */
#define QKC 2048  /* input features per chunk of a panel that several row blocks share (in L2) */
#define QMR 6     /* rows a block: QMR x NV int32 sums, NV weight vectors and a broadcast in registers (8 rows
                   * spilled the sums to the stack: twice the time) */

int specpipe_q8_block(void) { return QB; }

int specpipe_q8_simd(void) { /* where the W8A8 sums run: 2 AVX-512 VNNI, 1 AVX2, 0 the portable integer loop */
#if defined(__AVX512VNNI__) && VL == 16
    return 2;
#elif defined(__AVX2__) && VL == 8
    return 1;
#else
    return 0;
#endif
}

/* x [M][K] -> xq [M][Kp] (zero-padded), xs [M][Kp/block] scales (a block's largest |x| at 127),
 * xsum [M][Kp/sum_block] sums of xq (sum_block divides block). */
static void quantize_rows(const float *x, size_t M, size_t K, size_t Kp, size_t block, size_t sum_block,
                          signed char *xq, float *xs, int *xsum) {
    size_t nb = Kp / block, ns = Kp / sum_block;
    for (size_t r = 0; r < M; r++)
        for (size_t b = 0; b < nb; b++) {
            const float *xr = x + r * K;
            size_t k0 = b * block, k1 = K < k0 + block ? K : k0 + block;
            float amax = 0.0f;
            for (size_t k = k0; k < k1; k++) amax = amax > __builtin_fabsf(xr[k]) ? amax : __builtin_fabsf(xr[k]);
            float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            for (size_t k = k0; k < k0 + block; k++) {
                int q = k < k1 ? (int)__builtin_nearbyintf(xr[k] * inv) : 0;
                q = q > 127 ? 127 : q < -127 ? -127 : q;
                xq[r * Kp + k] = (signed char)q;
                if (k % sum_block == 0) xsum[r * ns + k / sum_block] = 0;
                xsum[r * ns + k / sum_block] += q;
            }
            xs[r * nb + b] = amax / 127.0f;
        }
}

/* Blocks b0..b1-1 of R rows over one panel (w: the panel at block b0): buf[r][c] += the block's exact
 * integer dot * xs, block by block. */
#if defined(__AVX512VNNI__) && VL == 16
#define Q8_ROW_BLOCK(R)                                                                                    \
    static void row_block_q8_##R(const signed char *xq, size_t Kp, size_t b0, size_t b1,                   \
                                 const unsigned char *w, float *buf, const float *xs, const int *xsum,     \
                                 size_t nb) {                                                              \
        for (size_t b = b0; b < b1; b++) {                                                                 \
            __m512i acc[R][NV];                                                                            \
            for (int r = 0; r < R; r++)                                                                    \
                for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_si512();                           \
            const unsigned char *wb = w + (b - b0) * QB * P;                                               \
            for (size_t q = 0; q < QB / 4; q++) {                                                          \
                const unsigned char *wq = wb + q * P * 4;                                                  \
                for (size_t o = 0; o < P * 4; o += 64) __builtin_prefetch(wq + 16 * P * 4 + o);            \
                __m512i wv[NV];                                                                            \
                for (int v = 0; v < NV; v++) wv[v] = _mm512_loadu_si512((const void *)(wq + v * 64));      \
                for (int r = 0; r < R; r++) {                                                              \
                    int x4;                                                                                \
                    memcpy(&x4, xq + r * Kp + b * QB + q * 4, 4);                                          \
                    __m512i xb = _mm512_set1_epi32(x4);                                                    \
                    for (int v = 0; v < NV; v++) acc[r][v] = _mm512_dpbusd_epi32(acc[r][v], wv[v], xb);    \
                }                                                                                          \
            }                                                                                              \
            for (int r = 0; r < R; r++) {                                                                  \
                __m512i corr = _mm512_set1_epi32(128 * xsum[r * nb + b]);                                  \
                __m512 scale = _mm512_set1_ps(xs[r * nb + b]);                                             \
                for (int v = 0; v < NV; v++) {                                                             \
                    float *f = buf + r * P + v * VL;                                                       \
                    __m512 dot = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r][v], corr));                    \
                    _mm512_store_ps(f, _mm512_fmadd_ps(dot, scale, _mm512_load_ps(f)));                    \
                }                                                                                          \
            }                                                                                              \
            __asm__ volatile("" ::: "memory"); /* buf stays in memory: the registers are the int sums' */  \
        }                                                                                                  \
    }
#elif defined(__AVX2__) && VL == 8
/* AVX2 has no u8 x s8 dot product into int32, only vpmaddubsw (pairs into saturating int16). Its products
 * are kept exact as llama.cpp keeps them: |w| (at most 128) times x carrying w's sign (|x| <= 127), so a
 * pair sums to at most 2 * 128 * 127 < 2^15; vpmaddwd then adds the pairs into int32. One vector of VL
 * columns at a time over the whole block, so the R x 1 sums stay in registers for any R <= QMR. */
#define Q8_ROW_BLOCK(R)                                                                                    \
    static void row_block_q8_##R(const signed char *xq, size_t Kp, size_t b0, size_t b1,                   \
                                 const unsigned char *w, float *buf, const float *xs, const int *xsum,     \
                                 size_t nb) {                                                              \
        (void)xsum; /* w's sign is applied to x: no offset to take back */                                 \
        const __m256i bias = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);                    \
        for (size_t b = b0; b < b1; b++) {                                                                 \
            const unsigned char *wb = w + (b - b0) * QB * P;                                               \
            for (int v = 0; v < NV; v++) {                                                                 \
                __m256i acc[R];                                                                            \
                for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_si256();                               \
                for (size_t q = 0; q < QB / 4; q++) {                                                      \
                    __m256i ws = _mm256_xor_si256(                                                         \
                        _mm256_loadu_si256((const __m256i *)(wb + q * P * 4 + v * 32)), bias); /* w */     \
                    __m256i wa = _mm256_sign_epi8(ws, ws);                                /* |w| */        \
                    for (int r = 0; r < R; r++) {                                                          \
                        int x4;                                                                            \
                        memcpy(&x4, xq + r * Kp + b * QB + q * 4, 4);                                      \
                        __m256i xw = _mm256_sign_epi8(_mm256_set1_epi32(x4), ws);                          \
                        acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(_mm256_maddubs_epi16(wa, xw), ones)); \
                    }                                                                                      \
                }                                                                                          \
                for (int r = 0; r < R; r++) {                                                              \
                    float *f = buf + r * P + v * VL;                                                       \
                    __m256 dot = _mm256_cvtepi32_ps(acc[r]);                                               \
                    _mm256_storeu_ps(f, _mm256_fmadd_ps(dot, _mm256_set1_ps(xs[r * nb + b]), _mm256_loadu_ps(f))); \
                }                                                                                          \
            }                                                                                              \
        }                                                                                                  \
    }
#else /* plain integer arithmetic: the same exact sums, the same FMA chain */
#define Q8_ROW_BLOCK(R)                                                                                    \
    static void row_block_q8_##R(const signed char *xq, size_t Kp, size_t b0, size_t b1,                   \
                                 const unsigned char *w, float *buf, const float *xs, const int *xsum,     \
                                 size_t nb) {                                                              \
        for (size_t b = b0; b < b1; b++) {                                                                 \
            const unsigned char *wb = w + (b - b0) * QB * P;                                               \
            for (int r = 0; r < R; r++) {                                                                  \
                const signed char *xb = xq + r * Kp + b * QB;                                              \
                for (int c = 0; c < P; c++) {                                                              \
                    int dot = 0;                                                                           \
                    for (size_t q = 0; q < QB / 4; q++)                                                    \
                        for (int i = 0; i < 4; i++) dot += (int)wb[(q * P + c) * 4 + i] * xb[q * 4 + i];   \
                    dot -= 128 * xsum[r * nb + b];                                                         \
                    buf[r * P + c] = __builtin_fmaf((float)dot, xs[r * nb + b], buf[r * P + c]);           \
                }                                                                                          \
            }                                                                                              \
        }                                                                                                  \
    }
#endif
Q8_ROW_BLOCK(1) Q8_ROW_BLOCK(2) Q8_ROW_BLOCK(3) Q8_ROW_BLOCK(4) Q8_ROW_BLOCK(5) Q8_ROW_BLOCK(6)
static void (*const row_block_q8[QMR + 1])(const signed char *, size_t, size_t, size_t, const unsigned char *,
                                           float *, const float *, const int *, size_t) = {
    NULL, row_block_q8_1, row_block_q8_2, row_block_q8_3, row_block_q8_4, row_block_q8_5, row_block_q8_6};

/* The integer kernels' frame: each row of x quantized (a scale per block of features, sums per sum_block),
 * then every panel j on some thread, accumulated by panel(j, buf, ...) into a zeroed buffer of M x P sums
 * and written out as y = buf * s + b (s: per-column scales, or NULL). -1: out of memory. */
typedef void (*IntegerPanel)(const void *w, size_t M, size_t Kp, long j, const signed char *xq, const float *xs,
                             const int *xsum, float *buf);

typedef struct {
    size_t M, Kp, N;
    IntegerPanel panel;
    const void *w;
    const float *s, *b;
    float *y;
    const signed char *xq;
    const float *xs;
    const int *xsum;
    int failed;
} Integer;

static void integer_part(void *ctx, int thread, int threads) {
    Integer *job = ctx;
    size_t M = job->M, N = job->N, bytes = (M * P * sizeof(float) + 63) / 64 * 64;
    float *buf = aligned_alloc(64, bytes);
    long begin, end;
    share((long)((N + P - 1) / P), thread, threads, &begin, &end);
    if (!buf) {
        __atomic_store_n(&job->failed, 1, __ATOMIC_RELAXED);
        begin = end;
    }
    for (long j = begin; j < end; j++) {
        size_t col = (size_t)j * P, ncols = N - col < P ? N - col : P;
        memset(buf, 0, bytes);
        job->panel(job->w, M, job->Kp, j, job->xq, job->xs, job->xsum, buf);
        for (size_t r = 0; r < M; r++)
            for (size_t c = 0; c < ncols; c++) {
                job->y[r * N + col + c] = output(buf[r * P + c], job->s, job->b, col + c);
            }
    }
    free(buf);
}

static int integer_linear(const float *x, size_t M, size_t K, size_t Kp, size_t block, size_t sum_block,
                          IntegerPanel panel, const void *w, size_t N, const float *s, const float *b, float *y,
                          int threads) {
    signed char *xq = malloc(M * Kp + 1);
    float *xs = malloc(M * (Kp / block) * sizeof(float) + 1);
    int *xsum = malloc(M * (Kp / sum_block) * sizeof(int) + 1);
    Integer job = {M, Kp, N, panel, w, s, b, y, xq, xs, xsum, !(xq && xs && xsum)};
    if (!job.failed) {
        quantize_rows(x, M, K, Kp, block, sum_block, xq, xs, xsum);
        run_threads(integer_part, &job, threads);
    }
    free(xq);
    free(xs);
    free(xsum);
    return job.failed ? -1 : 0;
}

/* W8A8's panel j: blocks in chunks (in L2) that every row block takes in turn. */
static void panel_q8(const void *weights, size_t M, size_t Kp, long j, const signed char *xq, const float *xs,
                     const int *xsum, float *buf) {
    size_t nb = Kp / QB;
    size_t chunk = M <= QMR ? nb : QKC / QB; /* blocks a row block runs before the next takes them */
    const unsigned char *panel = (const unsigned char *)weights + (size_t)j * Kp * P;
    for (size_t b0 = 0; b0 < nb; b0 += chunk) {
        size_t b1 = nb - b0 < chunk ? nb : b0 + chunk;
        for (size_t m = 0; m < M; m += QMR) {
            size_t rows = M - m < QMR ? M - m : QMR;
            row_block_q8[rows](xq + m * Kp, Kp, b0, b1, panel + b0 * QB * P, buf + m * P, xs + m * nb, xsum + m * nb,
                               nb);
        }
    }
}

/* x [M][K] float, w packed as above, s [N] the weights' scales, b [N] or NULL: y = s * (xq . w) + b. */
int specpipe_packed_linear_q8(const float *x, size_t M, size_t K, const unsigned char *w, size_t N, const float *s,
                              const float *b, float *y, int threads) {
    size_t Kp = (K + QB - 1) / QB * QB;
    return integer_linear(x, M, K, Kp, QB, QB, panel_q8, w, N, s, b, y, threads);
}

/* --- W4A8: the GGUF's Q4_K blocks times int8 activations ------------------------------------------
 * A weight column's super-block of SB = 256 input features is Q4_K's: w = d * sc_j * q - dmin * m_j for
 * sub-block j (32 features) of 8, q in 0..15, sc_j and m_j 6-bit, d and dmin floats (the file's fp16).
 * Activations are int8 per super-block of a row (one scale xs, llama.cpp's Q8_K), with their sums per
 * sub-block (xsum_j). A column's super-block is then
 *     xs * (d * sum_j sc_j * (q_j . x_j) - dmin * sum_j m_j * xsum_j)
 * whose two sums are exact int32 (|sum| <= 8 * 63 * 32 * 15 * 127 < 2^31): the same whatever the order or
 * vector width, and the super-blocks join one FMA chain per output in order (batch-invariant, as W8A8).
 * Packed as int32 words [ceil(N/P)][Kp/SB][Q4_WORDS][P], per column of a panel's super-block:
 *   words 0-31: features 8g..8g+7 of word g, byte b holding feature 8g + b (low nibble) and 8g + 4 + b (high);
 *   words 32-33: sc_0..sc_7 (a byte each); 34-35: m_0..m_7; 36: d (float bits); 37: dmin (float bits).
 * 4.75 bits a weight (int8: 8), where decoding on a CPU is bound by the bytes it streams a token. */
#define SB 256
#define Q4_WORDS 38
/* rows a block: Q4_MR partial and whole sums, the weights' nibbles and a broadcast in registers (AVX-512: 32 of them) */
#if defined(__AVX512VNNI__) && VL == 16
#define Q4_MR 8
#else
#define Q4_MR 4
#endif

int specpipe_q4_block(void) { return SB; }

int specpipe_q4_simd(void) { /* where the W4A8 sums run: 2 AVX-512 VNNI, 1 AVX2, 0 the portable integer loop */
#if defined(__AVX512VNNI__) && VL == 16
    return 2;
#elif defined(__AVX2__)
    return 1;
#else
    return 0;
#endif
}

/* Super-block sb of R rows over Q4_COLS columns (w: the panel's super-block sb at column col), added to
 * buf[r][col..col+Q4_COLS-1]. */
#if defined(__AVX512VNNI__) && VL == 16
/* vpdpbusd multiplies unsigned by signed bytes and adds each lane's four products to its int32: a nibble
 * (0..15) times x, exact, with no int16 step. CV vectors of 16 columns at once, the rows' broadcasts
 * shared by them; each sub-block's sum is multiplied by its scale sc_j once (|q_j . x_j| <= 32 * 15 * 127,
 * times sc_j <= 63: exact in int32). The next super-block's same columns are prefetched as this one is
 * read. One to Q4_WIDE_ROWS rows take the whole panel at once (CV = NV), so the super-block streams in
 * order: 1.4-1.5x the time a 16-column strip at a time took at one and two rows; more rows take
 * 16-column strips of up to Q4_MR rows, whose sums all fit the 32 registers. */
#define Q4_COLS VL
#define Q4_WIDE_ROWS 3
#define Q4_VNNI_BLOCK(R, CV, NAME)                                                                         \
    static void NAME(const signed char *xq, size_t Kp, size_t sb, const int *w, size_t col, float *buf,    \
                     const float *xs, const int *xsum) {                                                   \
        const __m512i low = _mm512_set1_epi8(0x0F), byte = _mm512_set1_epi32(0xFF);                        \
        __m512i sums[R][CV];                                                                               \
        for (int r = 0; r < R; r++)                                                                        \
            for (int v = 0; v < CV; v++) sums[r][v] = _mm512_setzero_si512();                              \
        for (int j = 0; j < 8; j++) {                                                                      \
            __m512i part[R][CV];                                                                           \
            for (int r = 0; r < R; r++)                                                                    \
                for (int v = 0; v < CV; v++) part[r][v] = _mm512_setzero_si512();                          \
            for (int g = 4 * j; g < 4 * j + 4; g++) {                                                      \
                __m512i xa[R], xb[R];                                                                      \
                for (int r = 0; r < R; r++) {                                                              \
                    int a, b;                                                                              \
                    memcpy(&a, xq + r * Kp + sb * SB + 8 * g, 4);                                          \
                    memcpy(&b, xq + r * Kp + sb * SB + 8 * g + 4, 4);                                      \
                    xa[r] = _mm512_set1_epi32(a);                                                          \
                    xb[r] = _mm512_set1_epi32(b);                                                          \
                }                                                                                          \
                for (int v = 0; v < CV; v++) {                                                             \
                    const int *wg = w + g * P + col + v * VL;                                              \
                    __builtin_prefetch(wg + Q4_WORDS * P);                                                 \
                    __m512i q = _mm512_loadu_si512((const void *)wg);                                      \
                    __m512i lo = _mm512_and_si512(q, low), hi = _mm512_and_si512(_mm512_srli_epi32(q, 4), low); \
                    for (int r = 0; r < R; r++) {                                                          \
                        part[r][v] = _mm512_dpbusd_epi32(part[r][v], lo, xa[r]);                           \
                        part[r][v] = _mm512_dpbusd_epi32(part[r][v], hi, xb[r]);                           \
                    }                                                                                      \
                }                                                                                          \
            }                                                                                              \
            for (int v = 0; v < CV; v++) {                                                                 \
                __m512i sc = _mm512_loadu_si512((const void *)(w + (32 + j / 4) * P + col + v * VL));      \
                sc = _mm512_and_si512(_mm512_srli_epi32(sc, 8 * (j % 4)), byte);                           \
                for (int r = 0; r < R; r++) sums[r][v] = _mm512_add_epi32(sums[r][v], _mm512_mullo_epi32(part[r][v], sc)); \
            }                                                                                              \
        }                                                                                                  \
        for (int v = 0; v < CV; v++) {                                                                     \
            const int *wv = w + col + v * VL;                                                              \
            __m512i mins[2] = {_mm512_loadu_si512((const void *)(wv + 34 * P)),                            \
                               _mm512_loadu_si512((const void *)(wv + 35 * P))};                           \
            __m512 d = _mm512_loadu_ps((const float *)(wv + 36 * P));                                     \
            __m512 dmin = _mm512_loadu_ps((const float *)(wv + 37 * P));                                  \
            for (int r = 0; r < R; r++) {                                                                  \
                const int *xsr = xsum + (r * (Kp / SB) + sb) * 8;                                          \
                __m512i m = _mm512_setzero_si512();                                                        \
                for (int j = 0; j < 8; j++) /* m_j * xsum_j: |xsum_j| <= 32 * 127 */                       \
                    m = _mm512_add_epi32(m, _mm512_mullo_epi32(                                            \
                        _mm512_and_si512(_mm512_srli_epi32(mins[j / 4], 8 * (j % 4)), byte), _mm512_set1_epi32(xsr[j]))); \
                __m512 t = _mm512_fmsub_ps(d, _mm512_cvtepi32_ps(sums[r][v]), _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(m))); \
                float *f = buf + r * P + col + v * VL;                                                     \
                _mm512_storeu_ps(f, _mm512_fmadd_ps(t, _mm512_set1_ps(xs[r * (Kp / SB) + sb]), _mm512_loadu_ps(f))); \
            }                                                                                              \
        }                                                                                                  \
    }
#define Q4_ROW_BLOCK(R) Q4_VNNI_BLOCK(R, 1, row_block_q4_##R)
Q4_VNNI_BLOCK(1, NV, row_block_q4_wide_1) Q4_VNNI_BLOCK(2, NV, row_block_q4_wide_2)
Q4_VNNI_BLOCK(3, NV, row_block_q4_wide_3)
static void (*const row_block_q4_wide[Q4_WIDE_ROWS + 1])(const signed char *, size_t, size_t, const int *, size_t,
                                                         float *, const float *, const int *) = {
    NULL, row_block_q4_wide_1, row_block_q4_wide_2, row_block_q4_wide_3};
#elif defined(__AVX2__)
/* vpmaddubsw multiplies the unsigned nibbles by the signed bytes of x, a pair a lane into int16 (exact:
 * an int16 adds 16 products of |q x| <= 15 * 127 over a sub-block, 30,480 < 2^15), vpmaddwd by
 * sc_j into int32. A row block takes the whole 32-column panel (CV = 4 vectors, sharing the rows'
 * broadcasts), so each super-block streams in order: 0.6-0.85x the time 8-column strips took at 1 to
 * 16 rows (the same bits). Built for AVX-512 without VNNI (48-column panels), blocks of 16 columns. */
#define Q4_CV (P % 32 ? 2 : 4) /* vectors of 8 columns a block: AVX2's whole panel; 16 of 48 with AVX-512 */
#define Q4_COLS (Q4_CV * 8)
static inline __m256i int16_pair(int lo, int hi) { /* (lo, hi) as int16 in every 32-bit lane; |lo|, |hi| < 2^15 */
    return _mm256_set1_epi32((int)(((unsigned)lo & 0xFFFF) | (unsigned)hi << 16));
}
#define Q4_AVX2_BLOCK(R, CV, NAME)                                                                         \
    static void NAME(const signed char *xq, size_t Kp, size_t sb, const int *w, size_t col, float *buf,    \
                     const float *xs, const int *xsum) {                                                   \
        const __m256i low = _mm256_set1_epi8(0x0F), byte = _mm256_set1_epi32(0xFF);                        \
        const __m256i evens = _mm256_set1_epi32(0x00FF00FF);                                               \
        __m256i sums[R][CV];                                                                               \
        for (int r = 0; r < R; r++)                                                                        \
            for (int v = 0; v < CV; v++) sums[r][v] = _mm256_setzero_si256();                              \
        for (int j = 0; j < 8; j++) {                                                                      \
            __m256i part[R][CV];                                                                           \
            for (int r = 0; r < R; r++)                                                                    \
                for (int v = 0; v < CV; v++) part[r][v] = _mm256_setzero_si256();                          \
            for (int g = 4 * j; g < 4 * j + 4; g++) {                                                      \
                __m256i xa[R], xb[R];                                                                      \
                for (int r = 0; r < R; r++) {                                                              \
                    int a, b;                                                                              \
                    memcpy(&a, xq + r * Kp + sb * SB + 8 * g, 4);                                          \
                    memcpy(&b, xq + r * Kp + sb * SB + 8 * g + 4, 4);                                      \
                    xa[r] = _mm256_set1_epi32(a);                                                          \
                    xb[r] = _mm256_set1_epi32(b);                                                          \
                }                                                                                          \
                for (int v = 0; v < CV; v++) {                                                             \
                    const int *wg = w + g * P + col + v * 8;                                               \
                    __builtin_prefetch(wg + Q4_WORDS * P);                                                 \
                    __m256i q = _mm256_loadu_si256((const __m256i *)wg);                                   \
                    __m256i lo = _mm256_and_si256(q, low), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low); \
                    for (int r = 0; r < R; r++) {                                                          \
                        part[r][v] = _mm256_add_epi16(part[r][v], _mm256_maddubs_epi16(lo, xa[r]));        \
                        part[r][v] = _mm256_add_epi16(part[r][v], _mm256_maddubs_epi16(hi, xb[r]));        \
                    }                                                                                      \
                }                                                                                          \
            }                                                                                              \
            for (int v = 0; v < CV; v++) {                                                                 \
                __m256i sc = _mm256_loadu_si256((const __m256i *)(w + (32 + j / 4) * P + col + v * 8));      \
                sc = _mm256_and_si256(_mm256_srli_epi32(sc, 8 * (j % 4)), byte);                           \
                sc = _mm256_or_si256(sc, _mm256_slli_epi32(sc, 16)); /* sc_j in both int16 halves */       \
                for (int r = 0; r < R; r++) sums[r][v] = _mm256_add_epi32(sums[r][v], _mm256_madd_epi16(part[r][v], sc)); \
            }                                                                                              \
        }                                                                                                  \
        for (int v = 0; v < CV; v++) {                                                                     \
            const int *wv = w + col + v * 8;                                                               \
            __m256i mins[2] = {_mm256_loadu_si256((const __m256i *)(wv + 34 * P)),                         \
                               _mm256_loadu_si256((const __m256i *)(wv + 35 * P))};                        \
            __m256 d = _mm256_loadu_ps((const float *)(wv + 36 * P));                                     \
            __m256 dmin = _mm256_loadu_ps((const float *)(wv + 37 * P));                                  \
            for (int r = 0; r < R; r++) {                                                                  \
                const int *xsr = xsum + (r * (Kp / SB) + sb) * 8;                                          \
                __m256i m = _mm256_setzero_si256();                                                        \
                for (int h = 0; h < 2; h++) { /* m_j * xsum_j, two sub-blocks an int16 pair */             \
                    __m256i even = _mm256_and_si256(mins[h], evens);                                       \
                    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(mins[h], 8), evens);                  \
                    m = _mm256_add_epi32(m, _mm256_madd_epi16(even, int16_pair(xsr[4 * h], xsr[4 * h + 2]))); \
                    m = _mm256_add_epi32(m, _mm256_madd_epi16(odd, int16_pair(xsr[4 * h + 1], xsr[4 * h + 3]))); \
                }                                                                                          \
                __m256 t = _mm256_fmsub_ps(d, _mm256_cvtepi32_ps(sums[r][v]), _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(m))); \
                float *f = buf + r * P + col + v * 8;                                                      \
                _mm256_storeu_ps(f, _mm256_fmadd_ps(t, _mm256_set1_ps(xs[r * (Kp / SB) + sb]), _mm256_loadu_ps(f))); \
            }                                                                                              \
        }                                                                                                  \
    }
#define Q4_ROW_BLOCK(R) Q4_AVX2_BLOCK(R, Q4_CV, row_block_q4_##R)
#else
#define Q4_COLS 8
#define Q4_ROW_BLOCK(R)                                                                                    \
    static void row_block_q4_##R(const signed char *xq, size_t Kp, size_t sb, const int *w, size_t col,    \
                                 float *buf, const float *xs, const int *xsum) {                           \
        for (int r = 0; r < R; r++)                                                                        \
            for (size_t c = col; c < col + Q4_COLS; c++) {                                                 \
                const signed char *x = xq + r * Kp + sb * SB;                                              \
                const int *xsr = xsum + (r * (Kp / SB) + sb) * 8;                                          \
                int sums = 0, m = 0;                                                                       \
                for (int j = 0; j < 8; j++) {                                                              \
                    int dot = 0;                                                                           \
                    for (int g = 4 * j; g < 4 * j + 4; g++) {                                              \
                        unsigned word = (unsigned)w[g * P + c];                                            \
                        for (int b = 0; b < 4; b++) {                                                      \
                            dot += (int)((word >> (8 * b)) & 0xF) * x[8 * g + b];                           \
                            dot += (int)((word >> (8 * b + 4)) & 0xF) * x[8 * g + 4 + b];                   \
                        }                                                                                  \
                    }                                                                                      \
                    sums += (int)((unsigned)w[(32 + j / 4) * P + c] >> (8 * (j % 4)) & 0xFF) * dot;        \
                    m += (int)((unsigned)w[(34 + j / 4) * P + c] >> (8 * (j % 4)) & 0xFF) * xsr[j];        \
                }                                                                                          \
                float d, dmin;                                                                             \
                memcpy(&d, w + 36 * P + c, sizeof d);                                                      \
                memcpy(&dmin, w + 37 * P + c, sizeof dmin);                                                \
                float t = __builtin_fmaf(d, (float)sums, -(dmin * (float)m));                              \
                buf[r * P + c] = __builtin_fmaf(t, xs[r * (Kp / SB) + sb], buf[r * P + c]);                \
            }                                                                                              \
    }
#endif
Q4_ROW_BLOCK(1) Q4_ROW_BLOCK(2) Q4_ROW_BLOCK(3) Q4_ROW_BLOCK(4)
#if Q4_MR > 4
Q4_ROW_BLOCK(5) Q4_ROW_BLOCK(6) Q4_ROW_BLOCK(7) Q4_ROW_BLOCK(8)
#endif
static void (*const row_block_q4[Q4_MR + 1])(const signed char *, size_t, size_t, const int *, size_t, float *,
                                             const float *, const int *) = {
    NULL, row_block_q4_1, row_block_q4_2, row_block_q4_3, row_block_q4_4,
#if Q4_MR > 4
    row_block_q4_5, row_block_q4_6, row_block_q4_7, row_block_q4_8,
#endif
};

/* W4A8's panel j: super-block by super-block, Q4_COLS columns at a time, row block by row block. */
static void panel_q4(const void *weights, size_t M, size_t Kp, long j, const signed char *xq, const float *xs,
                     const int *xsum, float *buf) {
    size_t nsb = Kp / SB;
    const int *panel = (const int *)weights + (size_t)j * nsb * Q4_WORDS * P;
    for (size_t sb = 0; sb < nsb; sb++) {
#ifdef Q4_WIDE_ROWS
        if (M <= Q4_WIDE_ROWS) {
            row_block_q4_wide[M](xq, Kp, sb, panel + sb * Q4_WORDS * P, 0, buf, xs, xsum);
            continue;
        }
#endif
        for (size_t c = 0; c < P; c += Q4_COLS)
            for (size_t m = 0; m < M; m += Q4_MR) {
                size_t rows = M - m < Q4_MR ? M - m : Q4_MR;
                row_block_q4[rows](xq + m * Kp, Kp, sb, panel + sb * Q4_WORDS * P, c, buf + m * P, xs + m * nsb,
                                   xsum + m * nsb * 8);
            }
    }
}

/* x [M][K] float, w packed as above, b [N] or NULL (s unused: the scales are in w): y = the W4A8 product + b. */
int specpipe_packed_linear_q4(const float *x, size_t M, size_t K, const int *w, size_t N, const float *s,
                              const float *b, float *y, int threads) {
    (void)s;
    size_t Kp = (K + SB - 1) / SB * SB;
    return integer_linear(x, M, K, Kp, SB, SB / 8, panel_q4, w, N, NULL, b, y, threads);
}

PACKED_LINEAR(f32, float, 0)
PACKED_LINEAR(bf16, unsigned short, 1)
PACKED_LINEAR(i8, signed char, 1)

/* --- Row-exact attention ---------------------------------------------------------------------------
 * Each query row (a head's, a token's) attends over exactly the keys it may see, in slot order, in one
 * fixed order of operations: its bits depend on its query and those keys alone, not on how many rows
 * or keys share the call (a token decoded alone, in a draft, in a tree, in a prompt's chunk or a whole
 * prompt). SDPA's CPU kernel blocks rows and keys, so its rows' last bits move with their neighbours.
 * q [heads][n][D]; k, v: key-value head h's position j at h * head_stride + j * pos_stride floats;
 * visible [n][L] (1: row i sees position j); out [n][heads * D]. Query head h reads key-value head
 * h / (heads / kv_heads). */
static inline float dot_row(const float *a, const float *b, size_t D) {
    vf acc = {0};
    size_t d = 0;
    for (; d + VL <= D; d += VL) acc += *(const vf *)(a + d) * *(const vf *)(b + d);
    float s = 0.0f;
    for (int l = 0; l < VL; l++) s += acc[l];
    for (; d < D; d++) s += a[d] * b[d];
    return s;
}

typedef struct {
    const float *q, *k, *v;
    size_t heads, n, D, group, L, head_stride, pos_stride;
    const unsigned char *visible;
    float scale;
    float *out;
    int failed;
} Attention;

static void attention_part(void *ctx, int thread, int threads) {
    Attention *job = ctx;
    size_t n = job->n, D = job->D, L = job->L;
    float *score = malloc((L + 1) * sizeof(float));
    float *acc = aligned_alloc(64, (D + VL) / VL * VL * sizeof(float));
    long begin, end;
    share((long)(job->heads * n), thread, threads, &begin, &end);
    if (!score || !acc) {
        __atomic_store_n(&job->failed, 1, __ATOMIC_RELAXED);
        begin = end;
    }
    for (long pair = begin; pair < end; pair++) {
        size_t h = (size_t)pair / n, i = (size_t)pair % n;
        const float *qi = job->q + (h * n + i) * D;
        const float *kh = job->k + (h / job->group) * job->head_stride, *vh = job->v + (h / job->group) * job->head_stride;
        const unsigned char *sees = job->visible + i * L;
        float top = -__builtin_inff();
        for (size_t j = 0; j < L; j++)
            if (sees[j]) {
                score[j] = dot_row(qi, kh + j * job->pos_stride, D) * job->scale;
                top = score[j] > top ? score[j] : top;
            }
        memset(acc, 0, D * sizeof(float));
        float total = 0.0f;
        for (size_t j = 0; j < L; j++)
            if (sees[j]) {
                float p = __builtin_expf(score[j] - top);
                total += p;
                const float *vj = vh + j * job->pos_stride;
                for (size_t d = 0; d < D; d++) acc[d] += p * vj[d];
            }
        float *o = job->out + i * job->heads * D + h * D;
        for (size_t d = 0; d < D; d++) o[d] = total > 0.0f ? acc[d] / total : 0.0f;
    }
    free(score);
    free(acc);
}

int specpipe_row_exact_attention(const float *q, size_t heads, size_t n, size_t D, const float *k, const float *v,
                                 size_t kv_heads, size_t L, size_t head_stride, size_t pos_stride,
                                 const unsigned char *visible, float scale, float *out, int threads) {
    Attention job = {q, k, v, heads, n, D, heads / kv_heads, L, head_stride, pos_stride, visible, scale, out, 0};
    run_threads(attention_part, &job, heads * n > 1 ? threads : 1);
    return job.failed ? -1 : 0;
}

/* --- GGUF dequantization ---------------------------------------------------------------------------
 * A GGUF tensor's quantized blocks -> fp32, bit for bit what gguf-py's numpy dequantize gives (the
 * values transformers' GGUF loading builds the model from), at memory speed rather than numpy's. Each
 * value is computed as numpy computes it: float32 products and sums, rounded one operation at a time (no
 * fused multiply-add: FP_CONTRACT off below). Types by their ggml number; others are the caller's. */
#define GGML_Q4_0 2
#define GGML_Q4_1 3
#define GGML_Q8_0 8
#define GGML_Q4_K 12
#define GGML_Q6_K 14
#define QK_K 256

static float half_to_float(const unsigned char *p) { /* IEEE binary16, little-endian, exactly */
    unsigned h = (unsigned)p[0] | (unsigned)p[1] << 8, sign = (h >> 15) << 31, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
    unsigned bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | man << 13;
    } else if (exp) {
        bits = sign | (exp + 112) << 23 | man << 13;
    } else if (man) { /* subnormal: normalize */
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400));
        bits = sign | (unsigned)(112 - e) << 23 | (man & 0x3FF) << 13;
    } else {
        bits = sign;
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* The block's size in bytes and in values, or 0 for a type not dequantized here. */
static size_t block_bytes(int type, size_t *values) {
    switch (type) {
    case GGML_Q4_0: *values = 32; return 18;
    case GGML_Q4_1: *values = 32; return 20;
    case GGML_Q8_0: *values = 32; return 34;
    case GGML_Q4_K: *values = QK_K; return 144;
    case GGML_Q6_K: *values = QK_K; return 210;
    default: *values = 0; return 0;
    }
}

#define NO_FMA __attribute__((optimize("fp-contract=off")))

/* Each loop below has a fixed shift and scale, so that the compiler vectorizes it. */
NO_FMA static void dequantize_block(int type, const unsigned char *b, float *y) {
    switch (type) {
    case GGML_Q4_0: { /* d, 16 bytes: values 0-15 their low nibbles, 16-31 their high ones */
        float d = half_to_float(b);
        for (int i = 0; i < 16; i++) y[i] = d * (float)((b[2 + i] & 0xF) - 8);
        for (int i = 0; i < 16; i++) y[16 + i] = d * (float)((b[2 + i] >> 4) - 8);
        break;
    }
    case GGML_Q4_1: { /* d, m, 16 bytes as Q4_0's */
        float d = half_to_float(b), m = half_to_float(b + 2);
        for (int i = 0; i < 16; i++) {
            float p = d * (float)(b[4 + i] & 0xF);
            y[i] = p + m;
        }
        for (int i = 0; i < 16; i++) {
            float p = d * (float)(b[4 + i] >> 4);
            y[16 + i] = p + m;
        }
        break;
    }
    case GGML_Q8_0: {
        float d = half_to_float(b);
        for (int i = 0; i < 32; i++) y[i] = (float)(signed char)b[2 + i] * d;
        break;
    }
    case GGML_Q4_K: { /* d, dmin, 12 bytes of 6-bit scales and mins of 8 sub-blocks, 128 bytes of nibbles */
        float d = half_to_float(b), dmin = half_to_float(b + 2);
        const unsigned char *s = b + 4, *qs = b + 16;
        float ds[8], dm[8];
        for (int j = 0; j < 8; j++) {
            int sc = j < 4 ? s[j] & 0x3F : (s[j + 4] & 0x0F) | ((s[j - 4] >> 2) & 0x30);
            int mn = j < 4 ? s[j + 4] & 0x3F : (s[j + 4] >> 4) | ((s[j] >> 2) & 0x30);
            ds[j] = d * (float)sc;
            dm[j] = dmin * (float)mn;
        }
        for (int c = 0; c < 4; c++) { /* sub-blocks 2c and 2c + 1: the low and high nibbles of bytes 32c .. 32c + 31 */
            const unsigned char *q = qs + 32 * c;
            for (int i = 0; i < 32; i++) {
                float p = ds[2 * c] * (float)(q[i] & 0xF);
                y[64 * c + i] = p - dm[2 * c];
            }
            for (int i = 0; i < 32; i++) {
                float p = ds[2 * c + 1] * (float)(q[i] >> 4);
                y[64 * c + 32 + i] = p - dm[2 * c + 1];
            }
        }
        break;
    }
    case GGML_Q6_K: { /* 128 bytes low nibbles, 64 bytes high 2 bits, 16 int8 scales, d; two halves of 128 */
        const unsigned char *ql = b, *qh = b + 128;
        const signed char *sc = (const signed char *)(b + 192);
        float d = half_to_float(b + 208);
        for (int g = 0; g < 16; g++) { /* 16 values of one scale: half h, quarter t of it */
            int h = g / 8, t = g % 8 / 2, i0 = g % 2 * 16;
            const unsigned char *lo = ql + 64 * h + 32 * (t % 2) + i0, *hi = qh + 32 * h + i0;
            int lshift = t / 2 * 4, hshift = 2 * t;
            float ds = d * (float)sc[g];
            for (int i = 0; i < 16; i++)
                y[16 * g + i] = ds * (float)(signed char)((((lo[i] >> lshift) & 0xF) | ((hi[i] >> hshift) & 3) << 4) - 32);
        }
        break;
    }
    }
}

typedef struct {
    int type;
    const unsigned char *src;
    float *dst;
    size_t blocks, bytes, values;
} Blocks;

static void dequantize_part(void *ctx, int thread, int threads) {
    Blocks *job = ctx;
    long begin, end;
    share((long)job->blocks, thread, threads, &begin, &end);
    for (long i = begin; i < end; i++)
        dequantize_block(job->type, job->src + (size_t)i * job->bytes, job->dst + (size_t)i * job->values);
}

/* blocks of type at src -> dst (blocks x the type's values), threads splitting the blocks. Returns -1 for
 * a type not dequantized here (nothing written). */
int specpipe_dequantize(int type, const unsigned char *src, size_t blocks, float *dst, int threads) {
    size_t values, bytes = block_bytes(type, &values);
    if (!bytes) return -1;
    Blocks job = {type, src, dst, blocks, bytes, values};
    run_threads(dequantize_part, &job, blocks > 4096 ? threads : 1);
    return 0;
}
