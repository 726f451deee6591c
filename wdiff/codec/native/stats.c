/*
 * Diff statistics (diff_stats): per span of words, how many changed, the
 * largest |new - old| and the sums of squares of the differences and of
 * the old values, in the float kind of the words. See native.h.
 */
#include "native.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && !defined(WDIFF_PORTABLE)
/* the bf16 statistics: 512-bit lanes where the CPU has them (x86-64-v4) */
#define HOT512 __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#define HOT512_CLONES 1
#else
#define HOT512
#endif

typedef struct {
    uint64_t changed;
    double max_abs; /* -1 while no finite difference was seen */
    double sum_d2;
    double sum_a2;
} stats_t;

static inline double as_float(uint64_t v, int kind, const double *lut)
{
    switch (kind) {
    case F_BF16: { uint32_t u = (uint32_t)v << 16; float f; memcpy(&f, &u, 4); return f; }
    case F_F32: { uint32_t u = (uint32_t)v; float f; memcpy(&f, &u, 4); return f; }
    case F_F64: { double d; memcpy(&d, &v, 8); return d; }
    default: return lut[v];
    }
}

static double sumsq_generic(const uint8_t *p, size_t n, int w, int kind, const double *lut)
{
    double acc[4] = {0, 0, 0, 0};
    for (size_t i = 0; i < n; i++) {
        double d = as_float(load(p + i * w, w), kind, lut);
        if (isfinite(d))
            acc[i & 3] += d * d;
    }
    return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

static inline void count_pair(uint64_t x, uint64_t y, int kind, const double *lut, stats_t *st)
{
    st->changed++;
    if (kind == F_NONE)
        return;
    double d = kind == F_BF16 /* in float: see stats_bf16 */
                   ? (double)((float)as_float(y, kind, lut) - (float)as_float(x, kind, lut))
                   : as_float(y, kind, lut) - as_float(x, kind, lut);
    if (isfinite(d)) {
        double m = fabs(d);
        if (m > st->max_abs)
            st->max_abs = m;
        st->sum_d2 += d * d;
    }
}

#define DEFINE_COMPARE(W)                                                                        \
    HOT static void compare_##W(const uint8_t *a, const uint8_t *b, size_t n, int kind,          \
                                const double *lut, stats_t *st)                                  \
    {                                                                                            \
        FOR_EACH_CANDIDATE(W, a, b, n, if (x != y) count_pair(x, y, kind, lut, st));              \
    }
DEFINE_COMPARE(1)
DEFINE_COMPARE(2)
DEFINE_COMPARE(4)
DEFINE_COMPARE(8)

static void compare_words(const uint8_t *a, const uint8_t *b, size_t n, int w, int kind,
                          const double *lut, stats_t *st)
{
    switch (w) {
    case 1: compare_1(a, b, n, kind, lut, st); break;
    case 2: compare_2(a, b, n, kind, lut, st); break;
    case 4: compare_4(a, b, n, kind, lut, st); break;
    default: compare_8(a, b, n, kind, lut, st); break;
    }
}

#define TILE 8192 /* words: both inputs of a tile stay in L1/L2 between the two passes */

/* bf16 and f32, fused and branch-free: one pass over a and b, a group of
   words at a time (64 for f32, STATS_GROUP_BF16 for bf16), with GCC/clang
   vector extensions. Every lane computes d = b - a
   whether or not its word changed (an unchanged word gives d = 0, which
   adds nothing), so the cost does not depend on how many words changed:
   no branch per word, and a dense change is as fast as a sparse one. The
   squares of a and of d are summed per group in the lanes' type, then
   in double. A group whose sums are not finite (it holds an infinity or a
   NaN, or, in float, values past about 2^60) is done again word by word,
   which skips non-finite values as the numpy twin does. */
#ifdef WDIFF_VECTORS
typedef float v8f __attribute__((vector_size(32)));
typedef uint32_t v8u __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef uint16_t v8h __attribute__((vector_size(16)));
typedef double v4d __attribute__((vector_size(32)));
typedef int64_t v4l __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));
typedef uint32_t v4u __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));
typedef float v16f __attribute__((vector_size(64)));
typedef uint32_t v16u __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef uint16_t v16w __attribute__((vector_size(32)));
#endif


/* the statistics of n words, word by word in double: every dtype without
   a vector kernel, and the groups those kernels hand back */
static void stats_words(const uint8_t *a, const uint8_t *b, size_t n, int w, int kind, const double *lut,
                        stats_t *st)
{
    if (kind != F_NONE)
        st->sum_a2 += sumsq_generic(a, n, w, kind, lut);
    compare_words(a, b, n, w, kind, lut, st);
}

/* The group loop of both: the block given last sets fa, d (float lanes of type FV) and eq
   (-1 in each lane whose words are equal, type CV) for the LANES words at
   i + j; BV holds the bits of an FV lane, whose absolute value ABS masks
   out. Squares are summed per group in the lanes' type FT. */
#ifdef WDIFF_VECTORS
/* what the groups of a run found: the largest |d| (its bits; non-negative
   floats order as their bits) over changed words, and how many of the
   words they covered were equal */
static void add_groups(stats_t *st, double top, size_t covered, uint64_t equal)
{
    if (covered > equal) { /* a changed word; every d in these groups is finite */
        st->changed += covered - equal;
        if (top > st->max_abs)
            st->max_abs = top;
    }
}

/* lanes added in pairs: a short chain of dependent additions */
#define HSUM4(v) (((v)[0] + (v)[1]) + ((v)[2] + (v)[3]))
#define HSUM8(v) ((((v)[0] + (v)[1]) + ((v)[2] + (v)[3])) + (((v)[4] + (v)[5]) + ((v)[6] + (v)[7])))
#ifndef STATS_GROUP_BF16
#define STATS_GROUP_BF16 512
#endif
#define HSUM16(v) (HSUM8((v)) + ((((v)[8] + (v)[9]) + ((v)[10] + (v)[11])) + (((v)[12] + (v)[13]) + ((v)[14] + (v)[15]))))
#define DEFINE_STATS(NAME, W, KIND, LANES, G, FT, FV, BV, CV, ABS, HOTNESS, ...)              \
    HOTNESS static void NAME(const uint8_t *a, const uint8_t *b, size_t n, stats_t *st)       \
    {                                                                                         \
        BV top = {0};                                                                         \
        CV same = {0};                                                                        \
        size_t i = 0, covered = 0;                                                            \
        for (; i + (G) <= n; i += (G)) {                                                      \
            FV acc_a = {0}, acc_d = {0};                                                      \
            BV gtop = {0};                                                                    \
            CV gsame = {0};                                                                   \
            for (int j = 0; j < (G); j += (LANES)) {                                         \
                FV fa, d;                                                                     \
                CV eq;                                                                        \
                __VA_ARGS__                                                                   \
                acc_a += fa * fa;                                                             \
                acc_d += d * d;                                                               \
                BV m = (BV)d & (ABS), up = m > gtop;                                          \
                gtop = (m & up) | (gtop & ~up);                                               \
                gsame -= eq;                                                                  \
            }                                                                                 \
            FT sa = HSUM##LANES(acc_a), sd = HSUM##LANES(acc_d);                              \
            if (!isfinite(sa + sd)) {                                                         \
                stats_words(a + i * (W), b + i * (W), (G), (W), (KIND), NULL, st);          \
                continue;                                                                     \
            }                                                                                 \
            st->sum_a2 += sa;                                                                 \
            st->sum_d2 += sd;                                                                 \
            BV up = gtop > top;                                                               \
            top = (gtop & up) | (top & ~up);                                                  \
            same += gsame;                                                                    \
            covered += (G);                                                                   \
        }                                                                                     \
        __typeof__(top[0]) bits = 0;                                                          \
        uint64_t equal = 0;                                                                   \
        for (int l = 0; l < (LANES); l++) {                                                   \
            bits = top[l] > bits ? top[l] : bits;                                             \
            equal += (uint64_t)same[l];                                                       \
        }                                                                                     \
        FT mx;                                                                                \
        memcpy(&mx, &bits, sizeof mx);                                                        \
        add_groups(st, mx, covered, equal);                                                   \
        stats_words(a + i * (W), b + i * (W), n - i, (W), (KIND), NULL, st);                  \
    }

/* f32: four double lanes; d is exact, as in the numpy twin */
DEFINE_STATS(stats_f32, 4, F_F32, 4, 64, double, v4d, v4l, v4i, 0x7fffffffffffffffll, HOT, {
    v4u u, v;
    memcpy(&u, a + (i + j) * 4, sizeof u);
    memcpy(&v, b + (i + j) * 4, sizeof v);
    fa = __builtin_convertvector((v4f)u, v4d);
    d = __builtin_convertvector((v4f)v, v4d) - fa;
    eq = (v4i)(u == v);
})

/* bf16: sixteen float lanes (one 512-bit register where the CPU has them),
   in groups of STATS_GROUP_BF16 words: the lanes' sums are added across
   the group once per group, so a larger group spends less on it (measured
   here, 4 MiB inputs: 18 GB/s with 8 lanes and groups of 64, 31 GB/s with
   16 and 512; each lane then sums 32 squares in float before they go to
   double, within the 1e-5 the twin is held to). The difference of two bf16 values is taken in
   float, as the numpy twin takes it (and torch does): exact unless their
   exponents lie more than 15 apart. */
DEFINE_STATS(stats_bf16, 2, F_BF16, 16, STATS_GROUP_BF16, float, v16f, v16i, v16i, 0x7fffffff, HOT512, {
    v16w h, g;
    memcpy(&h, a + 2 * (i + j), sizeof h);
    memcpy(&g, b + 2 * (i + j), sizeof g);
    v16u u = __builtin_convertvector(h, v16u) << 16, v = __builtin_convertvector(g, v16u) << 16;
    fa = (v16f)u;
    d = (v16f)v - fa;
    eq = (v16i)(u == v);
})

#endif /* WDIFF_VECTORS */

#if defined(HOT512_CLONES)
/* stats_bf16 for a CPU with AVX2 but not AVX-512: the same sixteen lanes,
   each doing the same float operations in the same order, held as two
   halves of eight (lanes 0-7 and 8-15), so that every sum, and so every
   output, is bit for bit what stats_bf16 gives. GCC's avx2 clone of
   stats_bf16 splits its 512-bit vectors lane by lane through the stack
   (measured here, 4 MiB inputs: 0.9 GB/s; this: see the commit). */
/* eight bf16 words widened to float bits in one instruction (vpmovzxwd from
   memory): __builtin_convertvector of a v8h compiles to four here */
#define BF16_HALF(P, H, U) (U = (v8u)_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(P))), 16))
__attribute__((target("avx2"))) static void stats_bf16_halves(const uint8_t *a, const uint8_t *b, size_t n,
                                                               stats_t *st)
{
    v8i top0 = {0}, top1 = {0}, same0 = {0}, same1 = {0};
    const v8i abs = {0x7fffffff, 0x7fffffff, 0x7fffffff, 0x7fffffff,
                     0x7fffffff, 0x7fffffff, 0x7fffffff, 0x7fffffff};
    size_t i = 0, covered = 0;
    const size_t G = STATS_GROUP_BF16;
    for (; i + G <= n; i += G) {
        v8f acc_a0 = {0}, acc_a1 = {0}, acc_d0 = {0}, acc_d1 = {0};
        v8i gtop0 = {0}, gtop1 = {0}, gsame0 = {0}, gsame1 = {0};
        for (size_t j = 0; j < G; j += 16) {
            v8u u0, u1, v0, v1;
            BF16_HALF(a + 2 * (i + j), h, u0);
            BF16_HALF(a + 2 * (i + j + 8), h, u1);
            BF16_HALF(b + 2 * (i + j), g, v0);
            BF16_HALF(b + 2 * (i + j + 8), g, v1);
            v8f fa0 = (v8f)u0, fa1 = (v8f)u1;
            v8f d0 = (v8f)v0 - fa0, d1 = (v8f)v1 - fa1;
            acc_a0 += fa0 * fa0;
            acc_a1 += fa1 * fa1;
            acc_d0 += d0 * d0;
            acc_d1 += d1 * d1;
            v8i m0 = (v8i)d0 & abs, m1 = (v8i)d1 & abs;
            v8i up0 = m0 > gtop0, up1 = m1 > gtop1;
            gtop0 = (m0 & up0) | (gtop0 & ~up0);
            gtop1 = (m1 & up1) | (gtop1 & ~up1);
            gsame0 -= (v8i)(u0 == v0);
            gsame1 -= (v8i)(u1 == v1);
        }
        /* HSUM16 of the sixteen lanes is HSUM8 of the first eight plus HSUM8 of the last */
        float sa = HSUM8(acc_a0) + HSUM8(acc_a1), sd = HSUM8(acc_d0) + HSUM8(acc_d1);
        if (!isfinite(sa + sd)) {
            stats_words(a + i * 2, b + i * 2, G, 2, F_BF16, NULL, st);
            continue;
        }
        st->sum_a2 += sa;
        st->sum_d2 += sd;
        v8i up0 = gtop0 > top0, up1 = gtop1 > top1;
        top0 = (gtop0 & up0) | (top0 & ~up0);
        top1 = (gtop1 & up1) | (top1 & ~up1);
        same0 += gsame0;
        same1 += gsame1;
        covered += G;
    }
    int32_t bits = 0;
    uint64_t equal = 0;
    for (int l = 0; l < 8; l++) {
        bits = top0[l] > bits ? top0[l] : bits;
        bits = top1[l] > bits ? top1[l] : bits;
        equal += (uint64_t)same0[l] + (uint64_t)same1[l];
    }
    float mx;
    memcpy(&mx, &bits, sizeof mx);
    add_groups(st, mx, covered, equal);
    stats_words(a + i * 2, b + i * 2, n - i, 2, F_BF16, NULL, st);
}
#undef BF16_HALF

/* the clone of stats_bf16 the CPU would run is the avx2 one */
static int bf16_halves(void)
{
    static int known = -1;
    if (known < 0)
        known = __builtin_cpu_supports("avx2") &&
                !(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                  __builtin_cpu_supports("avx512cd"));
    return known;
}

/* HSUM16 of the sixteen lanes of a and of d (a group's two sums), in four
   vector steps that each add the lanes 1, 2, 4 and then 8 apart: lane 0
   ends as ((a0 + a1) + (a2 + a3)) + ..., the very sums of HSUM16 in the
   same order (a float sum does not depend on which of its two terms comes
   first), and lane 2 as d's. About 60 scalar instructions taken lane by
   lane, 9 this way. */
__attribute__((target("avx512f"))) static inline void hsum16x2(__m512 a, __m512 d, float *sa, float *sd)
{
    /* 1 apart: each 128 bits (a0 + a1, a2 + a3, d0 + d1, d2 + d3) */
    __m512 v = _mm512_add_ps(_mm512_shuffle_ps(a, d, 0x88), _mm512_shuffle_ps(a, d, 0xDD));
    v = _mm512_add_ps(v, _mm512_permute_ps(v, 0xB1));       /* 2 apart */
    v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0xB1)); /* 4 apart */
    v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0x4E)); /* 8 apart */
    *sa = _mm512_cvtss_f32(v);
    *sd = _mm_cvtss_f32(_mm_permute_ps(_mm512_castps512_ps128(v), 0x02));
}

/* stats_bf16 where the CPU has AVX-512BW: the same sixteen lanes, each
   doing the same float operations in the same order, so that every output
   is bit for bit what stats_bf16 gives, in fewer instructions. GCC's
   x86-64-v4 clone of stats_bf16 widens each side's sixteen words in five
   (two 256-bit halves put together) and a shift, keeps the largest |d| in
   a compare and a blend, and counts equal words in three. Here one 64-byte
   load of each side is widened to float bits in two vpermw (a word to the
   high half of its lane, a zero to the low half), the largest |d| is a
   vpmaxsd of its bits (non-negative floats order as their bits, as in
   stats_bf16), the changed words are one compare of the raw words whose
   mask is counted on the scalar side, and the lanes of a group are summed
   by hsum16x2.

   A group with few changed words (an optimizer step: about 1% of them)
   is taken in two passes: the squares of a and the compare over every run
   of 32 words, then d in the runs with a change alone. That is all d adds
   to: where the words are equal d is 0 (its square adds nothing to a
   lane's sum, |d| nothing to its largest), unless a holds an infinity or
   a NaN, and then the sum of a's squares is not finite either and the
   group is done again word by word, as in one pass. Whether the last
   group had at most SPARSE_CHUNKS runs with a change chooses the next
   one's way, so that a dense change costs what one pass costs.

   Measured here, 4 MiB runs of adam1's words (0.74% changed): 19 GB/s for
   the clone, 34 GB/s in one pass with the lanes summed one by one, 36 with
   them summed in vectors, 38 with the two passes, 39 with hsum16x2 (0%
   changed: 36 in one pass, 53 in two; 3% to 100%: the same either way). */
#if STATS_GROUP_BF16 % 32
#error "stats_bf16_512 takes groups of whole 64-byte loads"
#endif
#ifndef SPARSE_CHUNKS
#define SPARSE_CHUNKS (STATS_GROUP_BF16 / 64) /* half of a group's runs of 32 words */
#endif
#define AVX512_STATS __attribute__((target("avx512f,avx512bw,avx2,popcnt")))
/* the 32 words at A and B: the squares of d added to acc_d (and of a to
   acc_a, where SQUARES_OF_A), the largest |d|'s bits kept in gtop */
#define BF16_RUN(A, B, SQUARES_OF_A)                                                          \
    do {                                                                                      \
        __m512i x_ = _mm512_loadu_si512(A), y_ = _mm512_loadu_si512(B);                      \
        for (int h_ = 0; h_ < 2; h_++) { /* words 0..15, then 16..31, as stats_bf16 takes them */ \
            __m512i u_ = _mm512_maskz_permutexvar_epi16(odd, h_ ? hi : lo, x_);              \
            __m512i v_ = _mm512_maskz_permutexvar_epi16(odd, h_ ? hi : lo, y_);              \
            __m512 fa_ = _mm512_castsi512_ps(u_);                                             \
            __m512 d_ = _mm512_sub_ps(_mm512_castsi512_ps(v_), fa_);                          \
            if (SQUARES_OF_A)                                                                 \
                acc_a = _mm512_add_ps(acc_a, _mm512_mul_ps(fa_, fa_));                        \
            acc_d = _mm512_add_ps(acc_d, _mm512_mul_ps(d_, d_));                              \
            gtop = _mm512_max_epi32(gtop, _mm512_and_si512(_mm512_castps_si512(d_), abs));   \
        }                                                                                     \
    } while (0)
AVX512_STATS static void stats_bf16_512(const uint8_t *a, const uint8_t *b, size_t n, stats_t *st)
{
    const __m512i abs = _mm512_set1_epi32(0x7fffffff);
    /* lane l of the low half takes word l, of the high half word 16 + l */
    const __m512i lo = _mm512_set_epi16(15, 0, 14, 0, 13, 0, 12, 0, 11, 0, 10, 0, 9, 0, 8, 0,
                                        7, 0, 6, 0, 5, 0, 4, 0, 3, 0, 2, 0, 1, 0, 0, 0);
    const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    const __mmask32 odd = 0xAAAAAAAAu; /* the high word of each lane; the low one is zeroed */
    __m512i top = _mm512_setzero_si512();
    size_t i = 0, covered = 0;
    uint64_t equal = 0;
    const size_t G = STATS_GROUP_BF16;
    int sparse = 1;
    for (; i + G <= n; i += G) {
        __m512 acc_a = _mm512_setzero_ps(), acc_d = _mm512_setzero_ps();
        __m512i gtop = _mm512_setzero_si512();
        uint64_t changed = 0;
        size_t runs = 0; /* runs of 32 words with a change */
        if (sparse) {
            uint32_t listed[STATS_GROUP_BF16 / 32];
            for (size_t j = 0; j < G; j += 32) {
                __m512i x = _mm512_loadu_si512(a + 2 * (i + j)), y = _mm512_loadu_si512(b + 2 * (i + j));
                __m512 f0 = _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(odd, lo, x));
                __m512 f1 = _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(odd, hi, x));
                acc_a = _mm512_add_ps(acc_a, _mm512_mul_ps(f0, f0));
                acc_a = _mm512_add_ps(acc_a, _mm512_mul_ps(f1, f1));
                __mmask32 ne = _mm512_cmpneq_epi16_mask(x, y);
                changed += (uint64_t)__builtin_popcount(ne);
                listed[runs] = (uint32_t)j; /* kept only where the run has a change: no branch */
                runs += ne != 0;
            }
            for (size_t r = 0; r < runs; r++)
                BF16_RUN(a + 2 * (i + listed[r]), b + 2 * (i + listed[r]), 0);
        } else {
            for (size_t j = 0; j < G; j += 32) {
                BF16_RUN(a + 2 * (i + j), b + 2 * (i + j), 1);
                __mmask32 ne = _mm512_cmpneq_epi16_mask(_mm512_loadu_si512(a + 2 * (i + j)),
                                                        _mm512_loadu_si512(b + 2 * (i + j)));
                changed += (uint64_t)__builtin_popcount(ne);
                runs += ne != 0;
            }
        }
        sparse = runs <= SPARSE_CHUNKS;
        float sa, sd;
        hsum16x2(acc_a, acc_d, &sa, &sd);
        if (!isfinite(sa + sd)) {
            stats_words(a + i * 2, b + i * 2, G, 2, F_BF16, NULL, st);
            continue;
        }
        st->sum_a2 += sa;
        st->sum_d2 += sd;
        top = _mm512_max_epi32(top, gtop);
        equal += G - changed;
        covered += G;
    }
    int32_t bits = _mm512_reduce_max_epi32(top);
    float mx;
    memcpy(&mx, &bits, sizeof mx);
    add_groups(st, mx, covered, equal);
    stats_words(a + i * 2, b + i * 2, n - i, 2, F_BF16, NULL, st);
}
#undef BF16_RUN
#undef AVX512_STATS
#endif

static void stats_range(const uint8_t *pa, const uint8_t *pb, size_t n, int w, int kind, const double *tab,
                        stats_t *st)
{
#ifdef WDIFF_VECTORS
    if (kind == F_BF16) {
#if defined(HOT512_CLONES)
        if (cpu_avx512bw && simd_on >= 2) { /* use_simd(1): the clone, for the tests */
            stats_bf16_512(pa, pb, n, st);
            return;
        }
        if (bf16_halves()) {
            stats_bf16_halves(pa, pb, n, st);
            return;
        }
#endif
        stats_bf16(pa, pb, n, st);
        return;
    }
    if (kind == F_F32) {
        stats_f32(pa, pb, n, st);
        return;
    }
#endif
    for (size_t lo = 0; lo < n; lo += TILE) {
        size_t m = n - lo < TILE ? n - lo : TILE;
        stats_words(pa + lo * w, pb + lo * w, m, w, kind, tab, st);
    }
}

static int check_stats_args(Py_buffer *a, Py_buffer *b, int w, int kind, PyObject *lut_obj, Py_buffer *lut)
{
    if (check_word(w) < 0)
        return -1;
    if (a->len != b->len || a->len % w) {
        PyErr_SetString(PyExc_ValueError, "inputs must be equal and hold whole words");
        return -1;
    }
    if (lut_obj != Py_None && PyObject_GetBuffer(lut_obj, lut, PyBUF_SIMPLE) < 0)
        return -1;
    size_t lut_need = w == 1 ? 256 : 65536;
    if (kind < F_NONE || kind > F_LUT || (kind == F_BF16 && w != 2) || (kind == F_F32 && w != 4) ||
        (kind == F_F64 && w != 8) ||
        (kind == F_LUT && (w > 2 || lut->buf == NULL || (size_t)lut->len != lut_need * sizeof(double)))) {
        PyErr_SetString(PyExc_ValueError, "bad float kind for this word size");
        return -1;
    }
    return 0;
}

static PyObject *stats_tuple(const stats_t *st)
{
    return Py_BuildValue("Kddd", (unsigned long long)st->changed, st->max_abs < 0 ? NAN : st->max_abs, st->sum_d2,
                         st->sum_a2);
}

/* diff_stats(a, b, word, kind, lut, spans) -> [(changed, max_abs, sum_d2, sum_a2)]
   One tuple per span: spans is an int64 buffer of (first word, end word)
   pairs, or None for one span over everything. lut is None or the float64
   value of each code (256 of them for 1-byte words, 65536 for 2). max_abs
   is NaN when no changed pair has a finite difference. */
PyObject *diff_stats(PyObject *self, PyObject *args)
{
    Py_buffer a, b, lut = {0}, spans = {0};
    PyObject *lut_obj, *spans_obj, *res = NULL;
    int w, kind;
    if (!PyArg_ParseTuple(args, "y*y*iiOO", &a, &b, &w, &kind, &lut_obj, &spans_obj))
        return NULL;
    if (check_stats_args(&a, &b, w, kind, lut_obj, &lut) < 0)
        goto done;
    size_t n = (size_t)a.len / w, m = 1;
    const int64_t *sp = NULL;
    if (spans_obj != Py_None) {
        if (PyObject_GetBuffer(spans_obj, &spans, PyBUF_SIMPLE) < 0)
            goto done;
        m = (size_t)spans.len / 16;
        sp = spans.buf;
        if (spans.len % 16) {
            PyErr_SetString(PyExc_ValueError, "spans must be int64 pairs");
            goto done;
        }
        for (size_t i = 0; i < m; i++) {
            if (sp[2 * i] < 0 || sp[2 * i] > sp[2 * i + 1] || (size_t)sp[2 * i + 1] > n) {
                PyErr_SetString(PyExc_ValueError, "span out of range");
                goto done;
            }
        }
    }
    stats_t *st = PyMem_Calloc(m, sizeof(stats_t));
    if (!st) {
        PyErr_NoMemory();
        goto done;
    }
    const uint8_t *pa = a.buf, *pb = b.buf;
    const double *tab = lut.buf;
    Py_BEGIN_ALLOW_THREADS
    for (size_t i = 0; i < m; i++) {
        size_t lo = sp ? (size_t)sp[2 * i] : 0, hi = sp ? (size_t)sp[2 * i + 1] : n;
        st[i].max_abs = -1.0;
        stats_range(pa + lo * w, pb + lo * w, hi - lo, w, kind, tab, &st[i]);
    }
    Py_END_ALLOW_THREADS
    res = PyList_New((Py_ssize_t)m);
    for (size_t i = 0; res && i < m; i++) {
        PyObject *t = stats_tuple(&st[i]);
        if (!t) {
            Py_CLEAR(res);
            break;
        }
        PyList_SET_ITEM(res, (Py_ssize_t)i, t);
    }
    PyMem_Free(st);
done:
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    if (lut.buf)
        PyBuffer_Release(&lut);
    if (spans.buf)
        PyBuffer_Release(&spans);
    return res;
}
