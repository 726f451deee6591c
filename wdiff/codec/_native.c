/*
 * wdiff.codec._native: single-pass kernels for the hot loops of diff, pack and
 * apply. Optional: wdiff/codec/kernels.py falls back to numpy when this module is
 * not built, and every function here has a numpy twin there that produces
 * the same bytes (tests/test_kernels.py checks that they agree).
 *
 * Why C: numpy makes one memory pass per operation (compare, nonzero,
 * gather, convert, square, sum, transpose), and on a checkpoint the data
 * does not fit in any cache, so each pass costs a trip through memory.
 * These kernels touch each byte once, skip runs of unchanged words sixteen
 * at a time, and release the GIL so that threads run them side by side.
 *
 * Words are little-endian unsigned integers of 1, 2, 4 or 8 bytes, loaded
 * with memcpy so that no alignment is assumed.
 *
 * Portable C11 builds everything; GNU C (gcc, clang) adds vector lanes
 * (WDIFF_VECTORS: the statistics and the two-byte planes) and, on x86-64,
 * AVX2 kernels chosen at import (HAVE_AVX2_SCAN). Without them the same
 * functions run their scalar loops, with the same results. FEATURES says
 * which are built. The constants the Python side relies on (MAX_RICE, the
 * float kinds, the Rice error codes, the largest word count) are exported
 * and checked by kernels.py at import.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

/* WDIFF_PORTABLE=1 builds the portable subset alone, as a compiler without
   GNU C would (tests/test_build.py checks that it compiles) */
#if (defined(__GNUC__) || defined(__clang__)) && !defined(WDIFF_PORTABLE)
#define WDIFF_VECTORS 1 /* GNU C vector extensions: __attribute__((vector_size)), __builtin_convertvector */
#endif

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && !defined(WDIFF_PORTABLE)
/* one build runs everywhere; AVX2 where the CPU has it */
#define HOT __attribute__((target_clones("avx2", "default")))
/* the bf16 statistics: 512-bit lanes where the CPU has them (x86-64-v4) */
#define HOT512 __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#define HOT512_CLONES 1
#else
#define HOT
#define HOT512
#endif

/* a hint that the line holding p is read (rw 0) or written (1) soon; nothing without GNU C */
#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p, rw) __builtin_prefetch((p), (rw))
#else
#define PREFETCH(p, rw) ((void)0)
#endif


static inline uint64_t load(const uint8_t *p, int w)
{
    switch (w) {
    case 1: return p[0];
    case 2: { uint16_t v; memcpy(&v, p, 2); return v; }
    case 4: { uint32_t v; memcpy(&v, p, 4); return v; }
    default: { uint64_t v; memcpy(&v, p, 8); return v; }
    }
}

static inline void store(uint8_t *p, int w, uint64_t v)
{
    switch (w) {
    case 1: p[0] = (uint8_t)v; break;
    case 2: { uint16_t x = (uint16_t)v; memcpy(p, &x, 2); break; }
    case 4: { uint32_t x = (uint32_t)v; memcpy(p, &x, 4); break; }
    default: memcpy(p, &v, 8); break;
    }
}

/* nonzero when any byte of a[0:len] differs from b[0:len]; vectorizes */
static inline int differ(const uint8_t *a, const uint8_t *b, size_t len)
{
    uint64_t acc = 0;
    for (size_t i = 0; i < len; i += 8) {
        uint64_t x, y;
        memcpy(&x, a + i, 8);
        memcpy(&y, b + i, 8);
        acc |= x ^ y;
    }
    return acc != 0;
}

static int check_word(int w)
{
    if (w != 1 && w != 2 && w != 4 && w != 8) {
        PyErr_SetString(PyExc_ValueError, "word must be 1, 2, 4 or 8");
        return -1;
    }
    return 0;
}

/* ---- diff statistics ---------------------------------------------------- */

enum { F_NONE = 0, F_BF16 = 1, F_F32 = 2, F_F64 = 3, F_LUT = 4 };

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

/* Visit the words of a and b (n words of W bytes) that may differ: 64
   bytes are compared at once, then each 8-byte piece of a 64-byte run that
   differs; BODY runs for every word of a piece that differs, and for every
   word of the tail, with j (the word's index), x and y (its old and new
   values) in scope. BODY itself tests x != y, with a branch or without. */
#define FOR_EACH_CANDIDATE(W, a, b, n, BODY)                                        \
    do {                                                                            \
        const size_t nb_ = (n) * (W);                                               \
        size_t off_ = 0;                                                            \
        for (; off_ + 64 <= nb_; off_ += 64) {                                      \
            if (!differ((a) + off_, (b) + off_, 64))                                \
                continue;                                                           \
            for (size_t c_ = off_; c_ < off_ + 64; c_ += 8) {                       \
                uint64_t p_, q_;                                                    \
                memcpy(&p_, (a) + c_, 8);                                           \
                memcpy(&q_, (b) + c_, 8);                                           \
                if (p_ == q_)                                                       \
                    continue;                                                       \
                for (size_t j = c_ / (W); j < (c_ + 8) / (W); j++) {                \
                    uint64_t x = load((a) + j * (W), (W)), y = load((b) + j * (W), (W)); \
                    BODY;                                                           \
                }                                                                   \
            }                                                                       \
        }                                                                           \
        for (size_t j = off_ / (W); j < (n); j++) {                                 \
            uint64_t x = load((a) + j * (W), (W)), y = load((b) + j * (W), (W));    \
            BODY;                                                                   \
        }                                                                           \
    } while (0)

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
#include <immintrin.h>
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
#endif

static void stats_range(const uint8_t *pa, const uint8_t *pb, size_t n, int w, int kind, const double *tab,
                        stats_t *st)
{
#ifdef WDIFF_VECTORS
    if (kind == F_BF16) {
#if defined(HOT512_CLONES)
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
static PyObject *diff_stats(PyObject *self, PyObject *args)
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

/* ---- delta scan: positions and XOR of changed words --------------------- */

/* Every candidate word is stored without a branch (the store is
   overwritten when the word did not change): at a few percent of changed
   words, a branch per word is mispredicted often enough to double the time. */
#define DEFINE_SCAN(W)                                                                           \
    HOT static size_t scan_##W(const uint8_t *a, const uint8_t *b, size_t n, uint32_t *pos,       \
                               uint8_t *val)                                                     \
    {                                                                                            \
        size_t k = 0;                                                                            \
        FOR_EACH_CANDIDATE(W, a, b, n, {                                                         \
            pos[k] = (uint32_t)j;                                                                \
            store(val + k * (W), (W), x ^ y);                                                    \
            k += x != y;                                                                         \
        });                                                                                      \
        return k;                                                                                \
    }
DEFINE_SCAN(1)
DEFINE_SCAN(2)
DEFINE_SCAN(4)
DEFINE_SCAN(8)

#if defined(__GNUC__) && defined(__x86_64__) && !defined(WDIFF_PORTABLE)
#include <immintrin.h>
#define HAVE_AVX2_SCAN 1
static int cpu_avx2, simd_on = 1;

/* AVX2: 32 bytes at a time, one bit per changed word from a comparison of
   whole words, then a visit of the set bits only */
#define DEFINE_SCAN_AVX2(W, CMP, MASK, SHIFT)                                                    \
    __attribute__((target("avx2,bmi"))) static size_t scan_avx2_##W(                            \
        const uint8_t *a, const uint8_t *b, size_t n, uint32_t *pos, uint8_t *val)               \
    {                                                                                            \
        size_t k = 0, i = 0;                                                                     \
        for (; i + 32 / (W) <= n; i += 32 / (W)) {                                               \
            __m256i x = _mm256_loadu_si256((const __m256i *)(a + i * (W)));                      \
            __m256i y = _mm256_loadu_si256((const __m256i *)(b + i * (W)));                      \
            uint32_t m = ~(uint32_t)MASK(CMP(x, y));                                             \
            m &= (W) == 2 ? 0x55555555u : (W) == 1 ? 0xffffffffu : (1u << (32 / (W))) - 1;       \
            if (!m)                                                                              \
                continue;                                                                        \
            uint8_t xs[32];                                                                      \
            _mm256_storeu_si256((__m256i *)xs, _mm256_xor_si256(x, y));                          \
            do {                                                                                 \
                unsigned t = (unsigned)__builtin_ctz(m) >> (SHIFT);                              \
                pos[k] = (uint32_t)(i + t);                                                      \
                memcpy(val + k * (W), xs + t * (W), (W));                                        \
                k++;                                                                             \
                m &= m - 1;                                                                      \
            } while (m);                                                                         \
        }                                                                                        \
        for (; i < n; i++) {                                                                     \
            uint64_t x = load(a + i * (W), (W)), y = load(b + i * (W), (W));                     \
            pos[k] = (uint32_t)i;                                                                \
            store(val + k * (W), (W), x ^ y);                                                    \
            k += x != y;                                                                         \
        }                                                                                        \
        return k;                                                                                \
    }
#define MASK_EPI8(v) _mm256_movemask_epi8(v)
#define MASK_PS(v) _mm256_movemask_ps(_mm256_castsi256_ps(v))
#define MASK_PD(v) _mm256_movemask_pd(_mm256_castsi256_pd(v))
DEFINE_SCAN_AVX2(1, _mm256_cmpeq_epi8, MASK_EPI8, 0)
DEFINE_SCAN_AVX2(4, _mm256_cmpeq_epi32, MASK_PS, 0)
DEFINE_SCAN_AVX2(8, _mm256_cmpeq_epi64, MASK_PD, 0)

/* Two-byte words (bf16, f16), the common case, without a loop over the
   changed words: for each 8 words, a table indexed by the 8-bit mask of
   those that changed packs their XOR values (one byte shuffle) and their
   positions (one lane permutation) to the front, both are stored whole,
   and k advances by the mask's population count. The stores run past k
   but never past word i + 8 <= n, so they stay inside the buffers. */
static uint8_t pack_bytes[256][16]; /* byte shuffle: the set words' two bytes, in order */
static uint32_t pack_lanes[256][8]; /* lane permutation: the set words' indices, in order */

static void init_pack_tables(void)
{
    for (int m = 0; m < 256; m++) {
        int c = 0;
        for (int j = 0; j < 8; j++) {
            if (m >> j & 1) {
                pack_bytes[m][2 * c] = (uint8_t)(2 * j);
                pack_bytes[m][2 * c + 1] = (uint8_t)(2 * j + 1);
                pack_lanes[m][c] = (uint32_t)j;
                c++;
            }
        }
        for (int j = c; j < 8; j++) {
            pack_bytes[m][2 * j] = pack_bytes[m][2 * j + 1] = 0x80; /* zero */
            pack_lanes[m][j] = 0;
        }
    }
}

/* a bit per two-byte word of x and y (16 of them) that differs, word 0
   lowest: the compare's 0xffff per equal word, packed to a byte each */
__attribute__((target("avx2"))) static inline unsigned changed_16(__m256i x, __m256i y)
{
    __m256i eq = _mm256_cmpeq_epi16(x, y);
    return ~(unsigned)_mm_movemask_epi8(_mm_packs_epi16(_mm256_castsi256_si128(eq), _mm256_extracti128_si256(eq, 1))) &
           0xffffu;
}

__attribute__((target("avx2,popcnt"))) static size_t scan_avx2_2(const uint8_t *a, const uint8_t *b,
                                                               size_t n, uint32_t *pos, uint8_t *val)
{
    size_t k = 0, i = 0;
    const __m256i steps = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (; i + 256 <= n; i += 256) {
        /* a block of 256 words that did not change costs one look */
        __m256i any = _mm256_setzero_si256();
        for (size_t j = 0; j < 256; j += 16)
            any = _mm256_or_si256(any, _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(a + 2 * (i + j))),
                                                        _mm256_loadu_si256((const __m256i *)(b + 2 * (i + j)))));
        if (_mm256_testz_si256(any, any))
            continue;
        for (size_t j = i; j < i + 256; j += 16) {
            __m256i x = _mm256_loadu_si256((const __m256i *)(a + 2 * j));
            __m256i y = _mm256_loadu_si256((const __m256i *)(b + 2 * j));
            unsigned bits = changed_16(x, y);
            __m256i d = _mm256_xor_si256(x, y);
            for (int h = 0; h < 2; h++) {
                unsigned m = (bits >> (8 * h)) & 0xffu;
                __m128i v = h ? _mm256_extracti128_si256(d, 1) : _mm256_castsi256_si128(d);
                __m128i packed = _mm_shuffle_epi8(v, _mm_loadu_si128((const __m128i *)pack_bytes[m]));
                __m256i idx = _mm256_add_epi32(_mm256_set1_epi32((int)(j + 8 * h)), steps);
                __m256i where =
                    _mm256_permutevar8x32_epi32(idx, _mm256_loadu_si256((const __m256i *)pack_lanes[m]));
                _mm_storeu_si128((__m128i *)(val + 2 * k), packed);
                _mm256_storeu_si256((__m256i *)(pos + k), where);
                k += (size_t)__builtin_popcount(m);
            }
        }
    }
    for (; i < n; i++) {
        uint16_t x = (uint16_t)load(a + 2 * i, 2), y = (uint16_t)load(b + 2 * i, 2);
        pos[k] = (uint32_t)i;
        store(val + 2 * k, 2, x ^ y);
        k += x != y;
    }
    return k;
}
#endif

static size_t scan_words(const uint8_t *a, const uint8_t *b, size_t n, int w, uint32_t *pos, uint8_t *val)
{
#ifdef HAVE_AVX2_SCAN
    if (cpu_avx2 && simd_on) {
        switch (w) {
        case 1: return scan_avx2_1(a, b, n, pos, val);
        case 2: return scan_avx2_2(a, b, n, pos, val);
        case 4: return scan_avx2_4(a, b, n, pos, val);
        default: return scan_avx2_8(a, b, n, pos, val);
        }
    }
#endif
    switch (w) {
    case 1: return scan_1(a, b, n, pos, val);
    case 2: return scan_2(a, b, n, pos, val);
    case 4: return scan_4(a, b, n, pos, val);
    default: return scan_8(a, b, n, pos, val);
    }
}

/* delta_scan(old, new, word, positions_out, values_out) -> k
   positions_out: uint32 buffer of at least n entries; values_out: at least
   n * word bytes. Writes the positions of the k changed words and their
   XOR (old ^ new). */
static PyObject *delta_scan(PyObject *self, PyObject *args)
{
    Py_buffer a, b, pos, val;
    int w;
    if (!PyArg_ParseTuple(args, "y*y*iw*w*", &a, &b, &w, &pos, &val))
        return NULL;
    PyObject *res = NULL;
    if (check_word(w) < 0)
        goto done;
    size_t n = (size_t)a.len / w;
    if (a.len != b.len || a.len % w || n >= UINT32_MAX || (size_t)pos.len < 4 * n ||
        (size_t)val.len < w * n) {
        PyErr_SetString(PyExc_ValueError, "delta_scan: bad buffer sizes");
        goto done;
    }
    size_t k;
    Py_BEGIN_ALLOW_THREADS
    k = scan_words(a.buf, b.buf, n, w, pos.buf, val.buf);
    Py_END_ALLOW_THREADS
    res = PyLong_FromSize_t(k);
done:
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    PyBuffer_Release(&pos);
    PyBuffer_Release(&val);
    return res;
}

/* ---- byte planes -------------------------------------------------------- */

#ifdef WDIFF_VECTORS
typedef uint16_t v16h __attribute__((vector_size(32)));
typedef int16_t v16s __attribute__((vector_size(32)));
typedef uint8_t v16b __attribute__((vector_size(16)));
#endif

/* plane j holds byte (w - 1 - j) of every word: most significant first.
   With xor_with, the planes of src ^ xor_with, and the count of its
   nonzero words is returned (0 without). */
HOT static size_t to_planes(const uint8_t *src, const uint8_t *xor_with, size_t n, int w, uint8_t *dst)
{
    size_t nz = 0;
    if (w == 2) {
        uint8_t *hi = dst, *lo = dst + n;
        if (xor_with) {
            size_t i = 0;
#ifdef WDIFF_VECTORS
            /* sixteen words at a time; the count in 16-bit lanes, emptied
               before they can overflow */
            while (i + 16 <= n) {
                v16s lanes = {0};
                for (size_t end = i + 16 * 2048 < n ? i + 16 * 2048 : n; i + 16 <= end; i += 16) {
                    v16h x, y;
                    memcpy(&x, src + 2 * i, sizeof x);
                    memcpy(&y, xor_with + 2 * i, sizeof y);
                    x ^= y;
                    v16b h = __builtin_convertvector(x >> 8, v16b), l = __builtin_convertvector(x & 0xff, v16b);
                    memcpy(hi + i, &h, sizeof h);
                    memcpy(lo + i, &l, sizeof l);
                    lanes -= (v16s)(x != 0);
                }
                for (int l = 0; l < 16; l++)
                    nz += (uint16_t)lanes[l];
            }
#endif
            for (; i < n; i++) {
                hi[i] = src[2 * i + 1] ^ xor_with[2 * i + 1];
                lo[i] = src[2 * i] ^ xor_with[2 * i];
                nz += (hi[i] | lo[i]) != 0;
            }
        } else {
            for (size_t i = 0; i < n; i++) {
                hi[i] = src[2 * i + 1];
                lo[i] = src[2 * i];
            }
        }
        return nz;
    }
    for (int j = 0; j < w; j++) {
        uint8_t *d = dst + (size_t)j * n;
        const uint8_t *s = src + (w - 1 - j);
        if (xor_with) {
            const uint8_t *x = xor_with + (w - 1 - j);
            for (size_t i = 0; i < n; i++)
                d[i] = s[(size_t)i * w] ^ x[(size_t)i * w];
        } else {
            for (size_t i = 0; i < n; i++)
                d[i] = s[(size_t)i * w];
        }
    }
    if (xor_with)
        for (size_t i = 0; i < n; i++)
            nz += load(src + i * w, w) != load(xor_with + i * w, w);
    return nz;
}

/* planes(src, word, dst): dst gets the byte planes of src's words */
static PyObject *planes(PyObject *self, PyObject *args)
{
    Py_buffer src, dst;
    int w;
    if (!PyArg_ParseTuple(args, "y*iw*", &src, &w, &dst))
        return NULL;
    PyObject *res = NULL;
    if (check_word(w) < 0)
        goto done;
    if (src.len % w || dst.len < src.len) {
        PyErr_SetString(PyExc_ValueError, "planes: bad buffer sizes");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    to_planes(src.buf, NULL, (size_t)src.len / w, w, dst.buf);
    Py_END_ALLOW_THREADS
    res = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return res;
}

/* xor_planes(old, new, word, dst) -> words that differ; dst gets the byte
   planes of old ^ new */
static PyObject *xor_planes(PyObject *self, PyObject *args)
{
    Py_buffer a, b, dst;
    int w;
    if (!PyArg_ParseTuple(args, "y*y*iw*", &a, &b, &w, &dst))
        return NULL;
    PyObject *res = NULL;
    if (check_word(w) < 0)
        goto done;
    if (a.len != b.len || a.len % w || dst.len < a.len) {
        PyErr_SetString(PyExc_ValueError, "xor_planes: bad buffer sizes");
        goto done;
    }
    size_t n = (size_t)a.len / w, k = 0;
    Py_BEGIN_ALLOW_THREADS
    k = to_planes(a.buf, b.buf, n, w, dst.buf);
    Py_END_ALLOW_THREADS
    res = PyLong_FromSize_t(k);
done:
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    PyBuffer_Release(&dst);
    return res;
}

/* unplanes(src, word, dst, xor) -> nonzero words of src. Rebuilds words from
   byte planes into dst, or XORs them into dst's words when xor is true. */
HOT static size_t from_planes(const uint8_t *src, size_t n, int w, uint8_t *dst, int xor)
{
    size_t nz = 0;
    if (w == 2) {
        const uint8_t *hi = src, *lo = src + n;
        for (size_t i = 0; i < n; i++) {
            nz += (hi[i] | lo[i]) != 0;
            if (xor) {
                dst[2 * i] ^= lo[i];
                dst[2 * i + 1] ^= hi[i];
            } else {
                dst[2 * i] = lo[i];
                dst[2 * i + 1] = hi[i];
            }
        }
        return nz;
    }
    for (size_t i = 0; i < n; i++) {
        uint64_t v = 0;
        for (int j = 0; j < w; j++)
            v |= (uint64_t)src[(size_t)j * n + i] << (8 * (w - 1 - j));
        nz += v != 0;
        if (xor)
            v ^= load(dst + i * w, w);
        store(dst + i * w, w, v);
    }
    return nz;
}

static PyObject *unplanes(PyObject *self, PyObject *args)
{
    Py_buffer src, dst;
    int w, xor;
    if (!PyArg_ParseTuple(args, "y*iw*p", &src, &w, &dst, &xor))
        return NULL;
    PyObject *res = NULL;
    if (check_word(w) < 0)
        goto done;
    if (src.len % w || dst.len != src.len) {
        PyErr_SetString(PyExc_ValueError, "unplanes: bad buffer sizes");
        goto done;
    }
    size_t nz;
    Py_BEGIN_ALLOW_THREADS
    nz = from_planes(src.buf, (size_t)src.len / w, w, dst.buf, xor);
    Py_END_ALLOW_THREADS
    res = PyLong_FromSize_t(nz);
done:
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return res;
}

/* scatter_xor(buf, word, positions, values) -> True when every value is
   nonzero. XORs value i into word positions[i] of buf; positions must be
   < the number of words in buf (checked). */
static PyObject *scatter_xor(PyObject *self, PyObject *args)
{
    Py_buffer buf, pos, val;
    int w;
    if (!PyArg_ParseTuple(args, "w*iy*y*", &buf, &w, &pos, &val))
        return NULL;
    PyObject *res = NULL;
    if (check_word(w) < 0)
        goto done;
    size_t k = (size_t)pos.len / 4, n = (size_t)buf.len / w;
    if (pos.len % 4 || (size_t)val.len != k * w) {
        PyErr_SetString(PyExc_ValueError, "scatter_xor: bad buffer sizes");
        goto done;
    }
    int ok = 1, inside = 1;
    Py_BEGIN_ALLOW_THREADS
    const uint32_t *p = pos.buf;
    const uint8_t *v = val.buf;
    uint8_t *d = buf.buf;
    for (size_t i = 0; i < k; i++) {
        if (p[i] >= n) {
            inside = 0;
            break;
        }
        uint64_t x = load(v + i * w, w);
        ok &= x != 0;
        store(d + (size_t)p[i] * w, w, load(d + (size_t)p[i] * w, w) ^ x);
    }
    Py_END_ALLOW_THREADS
    if (!inside) {
        PyErr_SetString(PyExc_ValueError, "scatter_xor: position out of range");
        goto done;
    }
    res = PyBool_FromLong(ok);
done:
    PyBuffer_Release(&buf);
    PyBuffer_Release(&pos);
    PyBuffer_Release(&val);
    return res;
}

/* out (len bytes) gets a one bit, MSB first, at each of k positions, all
   below 8 * len, and zeros elsewhere */
static void set_bits(uint8_t *restrict out, size_t len, const uint32_t *restrict p, size_t k)
{
    memset(out, 0, len);
    for (size_t i = 0; i < k; i++) {
        uint32_t x = p[i];
        out[x >> 3] |= (uint8_t)(0x80u >> (x & 7));
    }
}

/* The bitmap of the words of a and b (n words of W bytes) that differ, a
   bit per word, MSB first, from the words themselves: no positions
   needed, and no store per changed word. */
HOT static void change_bits(const uint8_t *a, const uint8_t *b, size_t n, int w, uint8_t *out)
{
    size_t i = 0, o = 0;
    for (; i + 8 <= n; i += 8, o++) {
        unsigned byte = 0;
        for (int j = 0; j < 8; j++)
            byte |= (unsigned)(load(a + (i + j) * w, w) != load(b + (i + j) * w, w)) << (7 - j);
        out[o] = (uint8_t)byte;
    }
    if (i < n) {
        unsigned byte = 0;
        for (int j = 0; i + j < n; j++)
            byte |= (unsigned)(load(a + (i + j) * w, w) != load(b + (i + j) * w, w)) << (7 - j);
        out[o] = (uint8_t)byte;
    }
}

#ifdef HAVE_AVX2_SCAN
static uint8_t reversed[256]; /* each byte with its bits in the other order */

__attribute__((target("avx2"))) static void change_bits_avx2_2(const uint8_t *a, const uint8_t *b, size_t n,
                                                              uint8_t *out)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        unsigned m = changed_16(_mm256_loadu_si256((const __m256i *)(a + 2 * i)),
                                _mm256_loadu_si256((const __m256i *)(b + 2 * i)));
        /* the bitmap wants word 0 highest */
        out[i / 8] = reversed[m & 0xff];
        out[i / 8 + 1] = reversed[(m >> 8) & 0xff];
    }
    change_bits(a + 2 * i, b + 2 * i, n - i, 2, out + i / 8);
}
#endif

/* change_bitmap(old, new, word) -> bytes: a bit per word, MSB first, set
   where old and new differ */
static PyObject *change_bitmap(PyObject *self, PyObject *args)
{
    Py_buffer a, b;
    int w;
    if (!PyArg_ParseTuple(args, "y*y*i", &a, &b, &w))
        return NULL;
    PyObject *res = NULL;
    if (check_word(w) < 0)
        goto done;
    if (a.len != b.len || a.len % w) {
        PyErr_SetString(PyExc_ValueError, "change_bitmap: inputs must be equal and hold whole words");
        goto done;
    }
    size_t n = (size_t)a.len / w;
    res = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)((n + 7) / 8));
    if (!res)
        goto done;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(res);
    Py_BEGIN_ALLOW_THREADS
#ifdef HAVE_AVX2_SCAN
    if (w == 2 && cpu_avx2 && simd_on)
        change_bits_avx2_2(a.buf, b.buf, n, out);
    else
#endif
        change_bits(a.buf, b.buf, n, w, out);
    Py_END_ALLOW_THREADS
done:
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    return res;
}

/* ---- Rice-coded gaps ---------------------------------------------------- */

#define MAX_RICE 40

/* what rice_decode reports; kernels.RICE_ERRORS holds the messages */
enum { RICE_OK = 0, RICE_BAD_COUNT = 1, RICE_BAD_REMAINDER_LENGTH = 2, RICE_OUT_OF_RANGE = 3, RICE_BAD_PADDING = 4 };

/* MSB-first bit writer: whole 32-bit words are stored as soon as they are
   complete, so the output is exactly as long as the bits it holds */
typedef struct {
    uint8_t *p;
    uint64_t acc; /* pending bits, right-aligned; bits above them are stale */
    int n;        /* how many: below 32 between calls */
} bitw_t;

static inline void put_bits(bitw_t *w, uint64_t v, int n) /* n <= 32, v < 2^n */
{
    w->acc = (w->acc << n) | v;
    w->n += n;
    if (w->n >= 32) {
        w->n -= 32;
        uint32_t x = __builtin_bswap32((uint32_t)(w->acc >> w->n));
        memcpy(w->p, &x, 4);
        w->p += 4;
    }
}

static inline void put_zeros(bitw_t *w, uint64_t n)
{
    while (n > 32) {
        put_bits(w, 0, 32);
        n -= 32;
    }
    put_bits(w, 0, (int)n);
}

static inline void flush_bits(bitw_t *w)
{
    while (w->n >= 8) {
        w->n -= 8;
        *w->p++ = (uint8_t)(w->acc >> w->n);
    }
    if (w->n)
        *w->p++ = (uint8_t)(w->acc << (8 - w->n));
    w->n = 0;
}

/* the sums of gap >> r for r = lo, lo + 1, lo + 2, over the gaps of k
   increasing positions; written so that it vectorizes */
HOT static void rice_sums(const uint32_t *pos, size_t k, int lo, uint64_t sum[3])
{
    uint64_t first = pos[0], s0 = first >> lo, s1 = first >> (lo + 1), s2 = first >> (lo + 2);
    for (size_t i = 1; i < k; i++) {
        uint64_t gap = pos[i] - pos[i - 1] - 1;
        s0 += gap >> lo;
        s1 += gap >> (lo + 1);
        s2 += gap >> (lo + 2);
    }
    sum[0] = s0, sum[1] = s1, sum[2] = s2;
}

/* the Rice parameter of wdiff-format(5): floor(log2(max(mean * 0.69, 1)))
   capped at 40, then the cheapest of it and its two neighbours, exactly;
   *bits gets the size of both streams at that parameter. The gaps sum to
   pos[k-1] + 1 - k, so the mean costs no pass. */
static int rice_param(const uint32_t *pos, size_t k, uint64_t *bits)
{
    double x = (double)((uint64_t)pos[k - 1] + 1 - k) / (double)k * 0.69;
    if (x < 1.0)
        x = 1.0;
    int e;
    frexp(x, &e);
    int guess = e - 1 < MAX_RICE ? e - 1 : MAX_RICE;
    int lo = guess > 0 ? guess - 1 : 0, hi = guess + 1 < MAX_RICE ? guess + 1 : MAX_RICE;
    uint64_t sum[3];
    rice_sums(pos, k, lo, sum);
    int best_r = -1;
    for (int r = lo; r <= hi; r++) {
        uint64_t b = (uint64_t)k * (r + 1) + sum[r - lo];
        if (best_r < 0 || b < *bits) {
            *bits = b;
            best_r = r;
        }
    }
    return best_r;
}

/* rice_encode(positions uint32, strictly increasing) -> (r, unary, remainder) */
static PyObject *rice_encode(PyObject *self, PyObject *args)
{
    Py_buffer pos;
    if (!PyArg_ParseTuple(args, "y*", &pos))
        return NULL;
    PyObject *res = NULL, *un = NULL, *rem = NULL;
    size_t k = (size_t)pos.len / 4;
    const uint32_t *p = pos.buf;
    if (pos.len % 4) {
        PyErr_SetString(PyExc_ValueError, "rice_encode: positions must be uint32");
        goto done;
    }
    if (k == 0) {
        res = Py_BuildValue("iy#y#", 0, "", (Py_ssize_t)0, "", (Py_ssize_t)0);
        goto done;
    }
    int increasing = 1, r = 0;
    uint64_t bits = 0;
    Py_BEGIN_ALLOW_THREADS
    for (size_t i = 1; i < k; i++)
        increasing &= p[i] > p[i - 1];
    if (increasing)
        r = rice_param(p, k, &bits);
    Py_END_ALLOW_THREADS
    if (!increasing) {
        PyErr_SetString(PyExc_ValueError, "rice_encode: positions must increase");
        goto done;
    }
    uint64_t rbits = (uint64_t)k * r, ubits = bits - rbits;
    un = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)((ubits + 7) / 8));
    rem = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)((rbits + 7) / 8));
    if (!un || !rem)
        goto done;
    uint8_t *up = (uint8_t *)PyBytes_AS_STRING(un), *rp = (uint8_t *)PyBytes_AS_STRING(rem);
    if (r == 0) {
        /* gap zeros then a one, for every position: the unary stream is
           the bitmap of the positions, up to the last one */
        Py_BEGIN_ALLOW_THREADS
        set_bits(up, (size_t)PyBytes_GET_SIZE(un), p, k);
        Py_END_ALLOW_THREADS
        res = Py_BuildValue("iOO", r, un, rem);
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    bitw_t u = {up, 0, 0}, rb = {rp, 0, 0};
    const uint64_t low = r ? (((uint64_t)1 << r) - 1) : 0;
    uint32_t prev = (uint32_t)-1;
    for (size_t i = 0; i < k; i++) {
        uint64_t gap = (uint32_t)(p[i] - prev - 1), q = gap >> r;
        prev = p[i];
        if (q < 32) {
            put_bits(&u, 1, (int)q + 1);
        } else {
            put_zeros(&u, q);
            put_bits(&u, 1, 1);
        }
        if (r > 32) {
            put_bits(&rb, (gap & low) >> 32, r - 32);
            put_bits(&rb, gap & 0xffffffffu, 32);
        } else if (r) {
            put_bits(&rb, gap & low, r);
        }
    }
    flush_bits(&u);
    flush_bits(&rb);
    Py_END_ALLOW_THREADS
    res = Py_BuildValue("iOO", r, un, rem);
done:
    Py_XDECREF(un);
    Py_XDECREF(rem);
    PyBuffer_Release(&pos);
    return res;
}

/* rice_size(positions uint32, strictly increasing, at least one) -> (r,
   unary bytes, remainder bytes): what rice_encode would write, without
   writing it. Positions are not checked here. */
static PyObject *rice_size(PyObject *self, PyObject *args)
{
    Py_buffer pos;
    if (!PyArg_ParseTuple(args, "y*", &pos))
        return NULL;
    PyObject *res = NULL;
    size_t k = (size_t)pos.len / 4;
    if (pos.len % 4 || k == 0) {
        PyErr_SetString(PyExc_ValueError, "rice_size: positions must be uint32, at least one");
        goto done;
    }
    uint64_t bits = 0;
    int r;
    Py_BEGIN_ALLOW_THREADS
    r = rice_param(pos.buf, k, &bits);
    Py_END_ALLOW_THREADS
    uint64_t rbits = (uint64_t)k * r;
    res = Py_BuildValue("iKK", r, (unsigned long long)((bits - rbits + 7) / 8), (unsigned long long)((rbits + 7) / 8));
done:
    PyBuffer_Release(&pos);
    return res;
}

/* MSB-first reader of a remainder stream: the next r bits (r <= MAX_RICE);
   the caller has checked that the stream holds them */
typedef struct {
    const uint8_t *p;
    size_t next;
    uint64_t acc;
    int have; /* bits in acc, right-aligned */
} bitr_t;

static inline uint64_t get_bits(bitr_t *br, int r)
{
    uint64_t low = 0;
    for (int need = r; need > 0;) {
        if (br->have == 0) {
            br->acc = br->p[br->next++];
            br->have = 8;
        }
        int take = need < br->have ? need : br->have;
        low = (low << take) | ((br->acc >> (br->have - take)) & ((1u << take) - 1));
        br->have -= take;
        need -= take;
    }
    return low;
}

/* the quotients of a unary stream (a run of zeros closed by a one, MSB
   first): the first `room` into q (a run beyond 2^32 - 1 is stored as that);
   *ones: how many there are, *last: the byte of the last one, *qmax: the
   largest of the first `room` */
static void unary_quotients(const uint8_t *u, size_t len, uint32_t *q, uint64_t room, uint64_t *ones,
                            size_t *last, uint64_t *qmax)
{
    uint64_t run = 0, c = 0, top = 0;
    size_t at = 0;
    for (size_t i = 0; i < len; i++) {
        uint8_t byte = u[i];
        if (!byte) {
            run += 8;
            continue;
        }
        for (int bit = 7; bit >= 0; bit--) {
            if ((byte >> bit) & 1) {
                if (c < room) {
                    if (run > top)
                        top = run;
                    q[c] = run > UINT32_MAX ? UINT32_MAX : (uint32_t)run;
                }
                c++;
                at = i;
                run = 0;
            } else {
                run++;
            }
        }
    }
    *ones = c;
    *last = at;
    *qmax = top;
}

/* rice_decode(r, unary, remainder, k, n, positions_out uint32[k]) -> error
   code: 0 ok, 1 the unary stream does not hold exactly k entries, 2 the
   remainder stream has the wrong length, 3 a position is out of range, 4
   nonzero padding in the remainder stream. Checks in the numpy twin's order. */
static PyObject *rice_decode(PyObject *self, PyObject *args)
{
    int r;
    Py_buffer un, rem, out;
    unsigned long long k, n;
    if (!PyArg_ParseTuple(args, "iy*y*KKw*", &r, &un, &rem, &k, &n, &out))
        return NULL;
    PyObject *res = NULL;
    if (r < 0 || r > MAX_RICE || (size_t)out.len < 4 * k || n > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "rice_decode: bad arguments");
        goto done;
    }
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    const uint8_t *u = un.buf;
    uint32_t *q = out.buf; /* first the quotients, then the positions */
    size_t len = (size_t)un.len, last = 0;
    uint64_t ones = 0, qmax = 0;
    unary_quotients(u, len, q, k, &ones, &last, &qmax);
    if (ones != k || (k && len != last + 1))
        err = RICE_BAD_COUNT;
    else if ((uint64_t)rem.len != (k * (uint64_t)r + 7) / 8)
        err = RICE_BAD_REMAINDER_LENGTH;
    else if (k && qmax > (n >> r))
        err = RICE_OUT_OF_RANGE;
    else {
        const uint8_t *rp = rem.buf;
        uint64_t tail = k * (uint64_t)r;
        for (uint64_t b = tail; b < (uint64_t)rem.len * 8; b++)
            if ((rp[b >> 3] >> (7 - (b & 7))) & 1)
                err = RICE_BAD_PADDING;
        uint64_t p = (uint64_t)-1;
        bitr_t br = {rp, 0, 0, 0};
        for (size_t i = 0; i < k && !err; i++) {
            uint64_t gap = ((uint64_t)q[i] << r) | get_bits(&br, r);
            p += gap + 1;
            if (p >= n)
                err = RICE_OUT_OF_RANGE;
            else
                q[i] = (uint32_t)p;
        }
    }
    Py_END_ALLOW_THREADS
    res = PyLong_FromLong(err);
done:
    PyBuffer_Release(&un);
    PyBuffer_Release(&rem);
    PyBuffer_Release(&out);
    return res;
}

/* ---- buckets of base words (codec v2: CSPARSE) -------------------------------
   bucket(word) = (word >> shift) & mask, at most MAX_BUCKETS buckets; the
   movers (changed words whose bucket differs between old and new) belong to
   no bucket and are counted apart. Four interleaved count tables, so that a
   run of words of one bucket does not wait on one counter. */

#define MAX_BUCKETS 2048

#define BUCKET_AT(W, p, i, shift, mask) ((uint32_t)((load_##W((p) + (size_t)(i) * (W)) >> (shift)) & (mask)))

static inline uint64_t load_2(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint64_t load_4(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t load_8(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
#define WORD_MASK(W) ((W) == 8 ? ~(uint64_t)0 : (((uint64_t)1 << (8 * (W))) - 1))
/* new - old of word i, modulo 2^(8 W) (the kernels' arrays are named old and new_) */
#define DIFF_AT(W, i) ((load_##W(new_ + (size_t)(i) * (W)) - load_##W(old + (size_t)(i) * (W))) & WORD_MASK(W))

/* the ranks: for each changed position (strictly increasing, below n) its
   bucket (nb for a mover) and its rank among the non-mover words of its
   bucket that come before it (for a mover: its rank among the movers);
   counts[b]: the non-mover words of bucket b, counts[nb]: the movers;
   dv (or NULL): each changed word's new - old, modulo 2^(8 W), taken while
   the word is in cache (gathered afterwards, the loads miss it).
   Returns 0, or 1 when the positions are not strictly increasing below n. */
#define DEFINE_RANKS(W)                                                                              \
    HOT static int ranks_##W(const uint8_t *old, const uint8_t *new_, size_t n, int shift, uint64_t mask, \
                             const uint32_t *pos, size_t k, uint16_t *ob, uint32_t *orank, uint32_t *t, \
                             uint64_t *dv)                                                   \
    {                                                                                                \
        uint32_t nb = (uint32_t)mask + 1;                                                            \
        uint32_t *c0 = t, *c1 = t + nb, *c2 = t + 2 * nb, *c3 = t + 3 * nb;                            \
        uint32_t movers = 0;                                                                          \
        size_t i = 0, j = 0;                                                                          \
        while (1) {                                                                                   \
            size_t stop = j < k ? pos[j] : n;                                                         \
            if (stop < i || stop > n || (j < k && stop == n))                                         \
                return 1;                                                                             \
            for (; i + 4 <= stop; i += 4) {                                                           \
                c0[BUCKET_AT(W, old, i, shift, mask)]++;                                              \
                c1[BUCKET_AT(W, old, i + 1, shift, mask)]++;                                          \
                c2[BUCKET_AT(W, old, i + 2, shift, mask)]++;                                          \
                c3[BUCKET_AT(W, old, i + 3, shift, mask)]++;                                          \
            }                                                                                         \
            for (; i < stop; i++)                                                                     \
                c0[BUCKET_AT(W, old, i, shift, mask)]++;                                              \
            if (j >= k)                                                                               \
                break;                                                                                \
            uint32_t bo = BUCKET_AT(W, old, i, shift, mask), bn = BUCKET_AT(W, new_, i, shift, mask); \
            if (dv)                                                                                   \
                dv[j] = DIFF_AT(W, i);                                                                \
            if (bo != bn) {                                                                           \
                ob[j] = (uint16_t)nb;                                                                 \
                orank[j] = movers++;                                                                  \
            } else {                                                                                  \
                ob[j] = (uint16_t)bo;                                                                 \
                orank[j] = c0[bo] + c1[bo] + c2[bo] + c3[bo];                                         \
                c0[bo]++;                                                                             \
            }                                                                                         \
            i++;                                                                                      \
            j++;                                                                                      \
        }                                                                                             \
        for (uint32_t b = 0; b < nb; b++)                                                             \
            c0[b] += c1[b] + c2[b] + c3[b];                                                           \
        c0[nb] = movers;                                                                              \
        return 0;                                                                                     \
    }

/* ranks_W without a position list: the changed words are found in the same
   pass, sixteen at a time (a block where old and new agree is counted
   straight into the tables), and their positions, buckets and ranks
   written to g's arrays, which grow as needed (to at most n entries: a
   buffer for every word is cleared or faulted in for nothing). Returns k,
   or sets g->oom. One pass over old and new instead of delta_scan's and
   then this one. */
typedef struct {
    uint32_t *pos, *orank;
    uint16_t *ob;
    size_t cap;
    int oom;
    uint64_t *dv; /* new - old of each changed word, as ranks_W's dv */
} sgrow_t;

static int sgrow(sgrow_t *g, size_t n)
{
    size_t cap = g->cap * 2 < n ? g->cap * 2 : n;
    uint32_t *p = PyMem_RawRealloc(g->pos, 4 * cap + 4);
    if (p)
        g->pos = p;
    uint32_t *r = PyMem_RawRealloc(g->orank, 4 * cap + 4);
    if (r)
        g->orank = r;
    uint16_t *b = PyMem_RawRealloc(g->ob, 2 * cap + 2);
    if (b)
        g->ob = b;
    uint64_t *d = PyMem_RawRealloc(g->dv, 8 * cap + 8);
    if (d)
        g->dv = d;
    if (!p || !r || !b || !d) {
        g->oom = 1;
        return 0;
    }
    g->cap = cap;
    return 1;
}

#define SRANK_WORD(W, u, tab)                                                                        \
    do {                                                                                             \
        size_t ii_ = i + (u);                                                                        \
        uint32_t bo_ = BUCKET_AT(W, old, ii_, shift, mask);                                          \
        if (load_##W(old + ii_ * (W)) != load_##W(new_ + ii_ * (W))) {                               \
            if (k == g->cap && !sgrow(g, n))                                                         \
                return k;                                                                            \
            uint32_t bn_ = BUCKET_AT(W, new_, ii_, shift, mask);                                     \
            g->pos[k] = (uint32_t)ii_;                                                               \
            g->dv[k] = DIFF_AT(W, ii_);                                                              \
            if (bo_ != bn_) {                                                                        \
                g->ob[k] = (uint16_t)nb;                                                             \
                g->orank[k] = movers++;                                                              \
            } else {                                                                                 \
                g->ob[k] = (uint16_t)bo_;                                                            \
                g->orank[k] = c0[bo_] + c1[bo_] + c2[bo_] + c3[bo_];                                 \
                tab[bo_]++;                                                                          \
            }                                                                                        \
            k++;                                                                                     \
        } else {                                                                                     \
            tab[bo_]++;                                                                              \
        }                                                                                            \
    } while (0)
#define DEFINE_SRANKS(NAME, W, ATTR, SAME16)                                                         \
    ATTR static size_t NAME(const uint8_t *old, const uint8_t *new_, size_t n, int shift, uint64_t mask, \
                            sgrow_t *g, uint32_t *t)                                                  \
    {                                                                                                \
        uint32_t nb = (uint32_t)mask + 1;                                                            \
        uint32_t *c0 = t, *c1 = t + nb, *c2 = t + 2 * nb, *c3 = t + 3 * nb;                            \
        uint32_t movers = 0;                                                                          \
        size_t k = 0, i = 0;                                                                          \
        for (; i + 16 <= n; i += 16) {                                                                \
            if (SAME16(old, new_, i)) {                                                               \
                for (size_t u = 0; u < 16; u += 4) {                                                  \
                    c0[BUCKET_AT(W, old, i + u, shift, mask)]++;                                      \
                    c1[BUCKET_AT(W, old, i + u + 1, shift, mask)]++;                                  \
                    c2[BUCKET_AT(W, old, i + u + 2, shift, mask)]++;                                  \
                    c3[BUCKET_AT(W, old, i + u + 3, shift, mask)]++;                                  \
                }                                                                                     \
                continue;                                                                             \
            }                                                                                         \
            for (size_t u = 0; u < 16; u += 4) {                                                      \
                SRANK_WORD(W, u, c0);                                                                 \
                SRANK_WORD(W, u + 1, c1);                                                             \
                SRANK_WORD(W, u + 2, c2);                                                             \
                SRANK_WORD(W, u + 3, c3);                                                             \
            }                                                                                         \
        }                                                                                             \
        for (size_t u = 0; i + u < n; u++)                                                            \
            SRANK_WORD(W, u, c0);                                                                     \
        for (uint32_t b = 0; b < nb; b++)                                                             \
            c0[b] += c1[b] + c2[b] + c3[b];                                                           \
        c0[nb] = movers;                                                                              \
        return k;                                                                                     \
    }
#define SAME16_W(W) (!differ(old + i * (W), new_ + i * (W), 16 * (W)))
#define SAME16_2(o, nw, i) SAME16_W(2)
#define SAME16_4(o, nw, i) SAME16_W(4)
#define SAME16_8(o, nw, i) SAME16_W(8)
DEFINE_SRANKS(sranks_2, 2, HOT, SAME16_2)
DEFINE_SRANKS(sranks_4, 4, HOT, SAME16_4)
DEFINE_SRANKS(sranks_8, 8, HOT, SAME16_8)
#ifdef HAVE_AVX2_SCAN

/* Counting two-byte words into their buckets without a store per word:
   the buckets lo..lo+15 (the window: the sixteen that a sample of the
   chunk hits most; an optimizer's weights fall into a few neighbouring
   exponents, 99.99% of a bf16 N(0, 0.02) chunk into sixteen) are counted
   in byte lanes, 32 words per step, one compare and one subtract per
   bucket, and added to the tables every 255 steps (before a lane can wrap);
   where fewer words than the steps hold were counted, the steps with a
   word outside the window count those words one by one. Each word's
   bucket less lo is written to tb[i - i0] (in word order; at least
   COUNT_SPAN outside the window) or, without tb, to a buffer of the
   call's, and counted from there.
   The tables get exactly what one word at a time gives them; only the
   time differs. Used by the decoder's pass (csparse_select), per tile: a
   4 MiB bf16 chunk of an optimizer step decodes its positions in 0.90 ms
   instead of 1.12 at 0.5%, 1.31 instead of 1.56 at 1%, 3.2 instead of 3.5
   at 3% (medians of 7 processes' best of 200; 0.48 against 0.68 ms where
   nearly nothing changed, the count alone), and by the encoder's scan
   (sranks_avx2_2), tile by tile. On AVX-512BW, 64 words a step
   (count_words_avx512): 0.33 ms for that count. */
#define COUNT_SPAN 16

static uint32_t count_window_2(const uint8_t *ref, size_t n, int shift, uint64_t mask)
{
    uint32_t h[256] = {0};
    if (mask > 0xFF || n == 0)
        return 0;
    size_t step = n / 512 ? n / 512 : 1;
    for (size_t i = 0; i < n; i += step)
        h[BUCKET_AT(2, ref, i, shift, mask)]++;
    uint32_t best = 0, lo = 0, sum = 0;
    for (uint32_t b = 0; b < 256; b++) {
        sum += h[b] - (b >= COUNT_SPAN ? h[b - COUNT_SPAN] : 0);
        if (sum > best) {
            best = sum;
            lo = b + 1 >= COUNT_SPAN ? b + 1 - COUNT_SPAN : 0;
        }
    }
    return lo;
}

/* the words [i, i + len) of a step that fall outside the window, counted
   one by one */
static inline void count_outside_2(const uint8_t *ref, size_t i, size_t len, int shift, uint64_t mask, uint32_t lo,
                                   uint32_t *c)
{
    for (size_t u = 0; u < len; u++) {
        uint32_t b = BUCKET_AT(2, ref, i + u, shift, mask);
        if (b - lo >= COUNT_SPAN)
            c[b]++;
    }
}

/* count_words_avx2's steps on 64 words at a time, in mask registers
   (AVX-512BW): words [i, end) up to the last whole step; returns where it
   stopped */
static int cpu_avx512bw;
__attribute__((target("avx512f,avx512bw,avx2"))) static size_t count_words_avx512(const uint8_t *ref, size_t i,
                                                                                 size_t end, int shift,
                                                                                 uint64_t mask, uint32_t lo,
                                                                                 uint32_t *c, uint8_t *tb,
                                                                                 size_t i0)
{
    const uint32_t nb = (uint32_t)mask + 1;
    const __m512i msk = _mm512_set1_epi16((short)mask), base = _mm512_set1_epi16((short)lo);
    const __m512i top = _mm512_set1_epi16(0xFF), last = _mm512_set1_epi8(COUNT_SPAN - 1);
    const __m512i order = _mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), one = _mm512_set1_epi8(1);
    const __m128i sh = _mm_cvtsi32_si128(shift);
    while (end - i >= 64) {
        size_t steps = (end - i) / 64;
        steps = steps < 255 ? steps : 255;
        __m512i acc[COUNT_SPAN];
        for (int k = 0; k < COUNT_SPAN; k++)
            acc[k] = _mm512_setzero_si512();
        for (size_t t = 0; t < steps; t++, i += 64) {
            __m512i x0 = _mm512_loadu_si512((const void *)(ref + 2 * i));
            __m512i x1 = _mm512_loadu_si512((const void *)(ref + 2 * i + 64));
            x0 = _mm512_min_epu16(_mm512_sub_epi16(_mm512_and_si512(_mm512_srl_epi16(x0, sh), msk), base), top);
            x1 = _mm512_min_epu16(_mm512_sub_epi16(_mm512_and_si512(_mm512_srl_epi16(x1, sh), msk), base), top);
            const __m512i v = _mm512_packus_epi16(x0, x1);
            if (tb)
                _mm512_storeu_si512((void *)(tb + (i - i0)), _mm512_permutexvar_epi64(order, v));
            for (int k = 0; k < COUNT_SPAN; k++)
                acc[k] = _mm512_mask_add_epi8(acc[k], _mm512_cmpeq_epi8_mask(v, _mm512_set1_epi8((char)k)), acc[k], one);
            if (_mm512_cmpgt_epu8_mask(v, last))
                count_outside_2(ref, i, 64, shift, mask, lo, c);
        }
        for (int k = 0; k < COUNT_SPAN; k++) {
            if (lo + (uint32_t)k >= nb)
                break;
            c[lo + k] += (uint32_t)_mm512_reduce_add_epi64(_mm512_sad_epu8(acc[k], _mm512_setzero_si512()));
        }
    }
    return i;
}

/* the bucket bytes first, then their counts four buckets at a time:
   sixteen accumulators, the data and the constants do not fit in AVX2's
   sixteen registers, and the compiler's spills put a store and a load of
   an accumulator in every step (the encoder's kernel on 4 MiB bf16 chunks
   of the benchmark's 1% step, just hashed: 1.40 instead of 1.73 ms a
   chunk; its decoder 2.56 instead of 2.75) */
#define COUNT_GROUP 4
__attribute__((target("avx2"))) static void count_words_avx2(const uint8_t *ref, size_t i, size_t end, int shift,
                                                             uint64_t mask, uint32_t lo, uint32_t *c, uint8_t *tb)
{
    const size_t i0 = i;
    const uint32_t nb = (uint32_t)mask + 1;
    if (mask <= 0xFF && cpu_avx512bw && simd_on)
        i = count_words_avx512(ref, i, end, shift, mask, lo, c, tb, i0);
    if (mask <= 0xFF) {
        const __m256i msk = _mm256_set1_epi16((short)mask), base = _mm256_set1_epi16((short)lo);
        const __m256i top = _mm256_set1_epi16(0xFF), last = _mm256_set1_epi8(COUNT_SPAN - 1);
        const __m128i sh = _mm_cvtsi32_si128(shift);
        uint8_t own[255 * 32] __attribute__((aligned(32)));
        while (end - i >= 32) {
            size_t steps = (end - i) / 32;
            steps = steps < 255 ? steps : 255; /* a byte lane counts at most 255 */
            uint8_t *bb = tb ? tb + (i - i0) : own;
            for (size_t t = 0; t < steps; t++) {
                const size_t at = i + 32 * t;
                __m256i x0 = _mm256_loadu_si256((const __m256i *)(ref + 2 * at));
                __m256i x1 = _mm256_loadu_si256((const __m256i *)(ref + 2 * at + 32));
                /* bucket - lo, as an unsigned 16-bit lane, then at most 255 */
                x0 = _mm256_min_epu16(_mm256_sub_epi16(_mm256_and_si256(_mm256_srl_epi16(x0, sh), msk), base), top);
                x1 = _mm256_min_epu16(_mm256_sub_epi16(_mm256_and_si256(_mm256_srl_epi16(x1, sh), msk), base), top);
                /* the bucket bytes in word order */
                const __m256i v = _mm256_permute4x64_epi64(_mm256_packus_epi16(x0, x1), 0xD8);
                _mm256_storeu_si256((__m256i *)(bb + 32 * t), v);
            }
            size_t inside = 0;
            for (uint32_t k0 = 0; k0 < COUNT_SPAN && lo + k0 < nb; k0 += COUNT_GROUP) {
                const __m256i e0 = _mm256_set1_epi8((char)k0), e1 = _mm256_set1_epi8((char)(k0 + 1));
                const __m256i e2 = _mm256_set1_epi8((char)(k0 + 2)), e3 = _mm256_set1_epi8((char)(k0 + 3));
                __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
                for (size_t t = 0; t < steps; t++) {
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(bb + 32 * t));
                    a0 = _mm256_sub_epi8(a0, _mm256_cmpeq_epi8(v, e0));
                    a1 = _mm256_sub_epi8(a1, _mm256_cmpeq_epi8(v, e1));
                    a2 = _mm256_sub_epi8(a2, _mm256_cmpeq_epi8(v, e2));
                    a3 = _mm256_sub_epi8(a3, _mm256_cmpeq_epi8(v, e3));
                }
                /* the four sums of eight lanes of each, at most 8 * 255, side by
                   side in 16-bit fields: one horizontal sum for the group */
                const __m256i z = _mm256_setzero_si256();
                __m256i s4 = _mm256_add_epi64(
                    _mm256_add_epi64(_mm256_sad_epu8(a0, z), _mm256_slli_epi64(_mm256_sad_epu8(a1, z), 16)),
                    _mm256_add_epi64(_mm256_slli_epi64(_mm256_sad_epu8(a2, z), 32),
                                     _mm256_slli_epi64(_mm256_sad_epu8(a3, z), 48)));
                __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(s4), _mm256_extracti128_si256(s4, 1));
                const uint64_t got = (uint64_t)_mm_cvtsi128_si64(s2) + (uint64_t)_mm_extract_epi64(s2, 1);
                for (uint32_t k = 0; k < COUNT_GROUP; k++) {
                    const uint32_t ck = (uint32_t)(got >> (16 * k)) & 0xFFFF;
                    inside += ck; /* no word has a bucket of nb or more */
                    if (lo + k0 + k < nb)
                        c[lo + k0 + k] += ck;
                }
            }
            if (inside != 32 * steps) /* the words outside the window: their bytes are above 15 */
                for (size_t t = 0; t < steps; t++) {
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(bb + 32 * t));
                    uint32_t out = ~(uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_min_epu8(v, last), v));
                    for (; out; out &= out - 1)
                        c[BUCKET_AT(2, ref, i + 32 * t + (uint32_t)__builtin_ctz(out), shift, mask)]++;
                }
            i += 32 * steps;
        }
    }
    for (; i < end; i++) {
        uint32_t b = BUCKET_AT(2, ref, i, shift, mask);
        c[b]++;
        if (tb)
            tb[i - i0] = (uint8_t)(b - lo < COUNT_SPAN ? b - lo : 0xFF);
    }
}

/* The words of bucket b among [q, len) of a tile (tb: its bucket bytes, as
   count_words_avx2 writes them, in a buffer of whole 32-byte blocks;
   ref + 2 * t0: its words): whole blocks, the bits outside [q, len) of
   the first and the last masked off. */
__attribute__((target("avx2,bmi,popcnt"))) static inline uint32_t tile_bucket_from(const uint8_t *ref, const uint8_t *tb,
                                                                                  size_t t0, size_t q, size_t len,
                                                                                  int shift, uint64_t mask,
                                                                                  uint32_t lo, uint32_t b)
{
    uint32_t c = 0;
    if (b - lo < COUNT_SPAN) {
        const __m256i want = _mm256_set1_epi8((char)(b - lo));
        for (size_t at = q & ~(size_t)31; at < len; at += 32) {
            uint32_t m = (uint32_t)_mm256_movemask_epi8(
                _mm256_cmpeq_epi8(_mm256_loadu_si256((const __m256i *)(tb + at)), want));
            if (at < q)
                m &= ~0u << (q - at);
            if (len - at < 32)
                m &= (1u << (len - at)) - 1;
            c += (uint32_t)__builtin_popcount(m);
        }
        return c;
    }
    for (; q < len; q++)
        c += BUCKET_AT(2, ref, t0 + q, shift, mask) == b;
    return c;
}

/* sranks_2 tile by tile (SR_TILE words): the tile's changed words found
   sixteen at a time, its words counted by count_words_avx2 (which keeps
   their bucket bytes), then each changed word's rank is its bucket's
   count after the tile less the words of its bucket from it to the end of
   the tile (one compare of 32 bucket bytes at a time) and the movers among
   them, or, for a word in the first half of the tile and a bucket of the
   window, its count before the tile plus those from the tile's start to
   it: no store per word. Same contract and the same ranks as sranks_2
   (a 4 MiB bf16 chunk: 0.39 ms where nearly nothing changed, against
   0.68; about as fast as before from 1% on, where the changed words'
   own work dominates). */
#define SR_TILE 512
__attribute__((target("avx2,bmi,popcnt"))) static size_t sranks_avx2_2(const uint8_t *old, const uint8_t *new_, size_t n,
                                                                       int shift, uint64_t mask, sgrow_t *g,
                                                                       uint32_t *t)
{
    const uint32_t nb = (uint32_t)mask + 1;
    const uint32_t lo = count_window_2(old, n, shift, mask);
    uint8_t tb[SR_TILE];
    uint32_t mvb[SR_TILE], mvp[SR_TILE], before[COUNT_SPAN] = {0};
    uint32_t movers = 0;
    size_t k = 0;
    for (size_t t0 = 0; t0 < n; t0 += SR_TILE) {
        const size_t end = n - t0 < SR_TILE ? n : t0 + SR_TILE, k0 = k;
        /* room for every word of the tile (k <= t0, so never more than n) */
        while (g->cap < k + (end - t0))
            if (!sgrow(g, n))
                return k;
        size_t i = t0;
        for (; i + 16 <= end; i += 16) {
            const __m256i x = _mm256_loadu_si256((const __m256i *)(old + 2 * i));
            const __m256i y = _mm256_loadu_si256((const __m256i *)(new_ + 2 * i));
            for (unsigned d = changed_16(x, y); d; d &= d - 1) {
                const size_t at = i + (uint32_t)__builtin_ctz(d);
                g->dv[k] = DIFF_AT(2, at);
                g->pos[k++] = (uint32_t)at;
            }
        }
        for (; i < end; i++) {
            if (load_2(old + 2 * i) != load_2(new_ + 2 * i)) {
                g->dv[k] = DIFF_AT(2, i);
                g->pos[k++] = (uint32_t)i;
            }
        }
        if (k > k0) /* the window's counts before the tile */
            for (uint32_t c = 0; c < COUNT_SPAN && lo + c < nb; c++)
                before[c] = t[lo + c];
        count_words_avx2(old, t0, end, shift, mask, lo, t, tb);
        if (k == k0)
            continue;
        size_t nm = 0;
        for (size_t x = k0; x < k; x++) {
            const uint32_t p = g->pos[x], bo = BUCKET_AT(2, old, p, shift, mask);
            if (bo != BUCKET_AT(2, new_, p, shift, mask)) {
                t[bo]--; /* a mover is in no bucket */
                g->ob[x] = (uint16_t)nb;
                g->orank[x] = movers++;
                mvb[nm] = bo;
                mvp[nm++] = p;
            } else {
                g->ob[x] = (uint16_t)bo;
            }
        }
        for (size_t x = k0; x < k; x++) {
            const uint32_t b = g->ob[x], p = g->pos[x];
            if (b == nb)
                continue;
            if (b - lo < COUNT_SPAN && p - t0 < end - p) { /* counted from the tile's start */
                uint32_t head = tile_bucket_from(old, tb, t0, 0, p - t0, shift, mask, lo, b);
                for (size_t y = 0; y < nm; y++)
                    head -= mvp[y] < p && mvb[y] == b;
                g->orank[x] = before[b - lo] + head;
                continue;
            }
            uint32_t rest = tile_bucket_from(old, tb, t0, p - t0, end - t0, shift, mask, lo, b);
            for (size_t y = 0; y < nm; y++)
                rest -= mvp[y] > p && mvb[y] == b;
            g->orank[x] = t[b] - rest;
        }
    }
    t[nb] = movers;
    return k;
}
#endif

/* the counts of the non-mover words of each bucket of ref, given the movers
   (strictly increasing, below n; checked: returns 1 otherwise) */
#define DEFINE_COUNTS(W)                                                                             \
    HOT static int counts_##W(const uint8_t *ref, size_t n, int shift, uint64_t mask, const uint32_t *mv, \
                              size_t km, uint32_t *t)                                                \
    {                                                                                                \
        uint32_t nb = (uint32_t)mask + 1;                                                            \
        uint32_t *c0 = t, *c1 = t + nb, *c2 = t + 2 * nb, *c3 = t + 3 * nb;                            \
        size_t i = 0, j = 0;                                                                          \
        while (1) {                                                                                   \
            size_t stop = j < km ? mv[j] : n;                                                         \
            if (stop < i || stop > n || (j < km && stop == n))                                        \
                return 1;                                                                             \
            for (; i + 4 <= stop; i += 4) {                                                           \
                c0[BUCKET_AT(W, ref, i, shift, mask)]++;                                              \
                c1[BUCKET_AT(W, ref, i + 1, shift, mask)]++;                                          \
                c2[BUCKET_AT(W, ref, i + 2, shift, mask)]++;                                          \
                c3[BUCKET_AT(W, ref, i + 3, shift, mask)]++;                                          \
            }                                                                                         \
            for (; i < stop; i++)                                                                     \
                c0[BUCKET_AT(W, ref, i, shift, mask)]++;                                              \
            if (j >= km)                                                                              \
                break;                                                                                \
            i++;                                                                                      \
            j++;                                                                                      \
        }                                                                                             \
        for (uint32_t b = 0; b < nb; b++)                                                             \
            c0[b] += c1[b] + c2[b] + c3[b];                                                           \
        c0[nb] = (uint32_t)km;                                                                        \
        return 0;                                                                                     \
    }

/* the positions of the wanted ranks: want[off[b]:off[b+1]] are increasing
   ranks among the non-mover words of bucket b; out[x] is the position of the
   word of rank want[x]. Returns 0, or 1 when some rank is not found. */
#define DEFINE_SELECT(W)                                                                             \
    HOT static int select_##W(const uint8_t *ref, size_t n, int shift, uint64_t mask, const uint32_t *mv, \
                              size_t km, const uint32_t *want, const int64_t *off, uint32_t *out,       \
                              uint32_t *cnt, int64_t *cur, uint32_t *next)                              \
    {                                                                                                \
        uint32_t nb = (uint32_t)mask + 1;                                                            \
        /* cnt: four tables (word i counts in table i % 4); a word's rank is \
           the sum of its bucket's four counts */                                                    \
        uint32_t *c[4] = {cnt, cnt + nb, cnt + 2 * nb, cnt + 3 * nb};                                 \
        for (uint32_t b = 0; b < nb; b++) {                                                           \
            cur[b] = off[b];                                                                          \
            next[b] = off[b] < off[b + 1] ? want[off[b]] : UINT32_MAX;                                \
        }                                                                                             \
        size_t j = 0, nextm = km ? mv[0] : n;                                                         \
        for (size_t i = 0; i < n; i++) {                                                              \
            if (i == nextm) {                                                                         \
                j++;                                                                                  \
                nextm = j < km ? mv[j] : n;                                                           \
                continue;                                                                             \
            }                                                                                         \
            uint32_t b = BUCKET_AT(W, ref, i, shift, mask);                                           \
            uint32_t r = c[0][b] + c[1][b] + c[2][b] + c[3][b];                                       \
            c[i & 3][b]++;                                                                            \
            if (r == next[b]) {                                                                       \
                int64_t x = cur[b]++;                                                                 \
                out[x] = (uint32_t)i;                                                                 \
                next[b] = x + 1 < off[b + 1] ? want[x + 1] : UINT32_MAX;                              \
            }                                                                                         \
        }                                                                                             \
        for (uint32_t b = 0; b < nb; b++)                                                             \
            if (cur[b] != off[b + 1])                                                                 \
                return 1;                                                                             \
        return 0;                                                                                     \
    }

DEFINE_RANKS(2)
DEFINE_RANKS(4)
DEFINE_RANKS(8)
DEFINE_COUNTS(2)
DEFINE_COUNTS(4)
DEFINE_COUNTS(8)
DEFINE_SELECT(2)
DEFINE_SELECT(4)
DEFINE_SELECT(8)

static int check_bucket_fn(int w, int shift, unsigned long long mask)
{
    if ((w != 2 && w != 4 && w != 8) || shift < 0 || shift >= 8 * w || mask == 0 || mask >= MAX_BUCKETS ||
        (mask & (mask + 1))) {
        PyErr_SetString(PyExc_ValueError, "bad bucket function");
        return -1;
    }
    return 0;
}

/* bucket_ranks(old, new, word, shift, mask, positions, buckets_out, ranks_out, counts_out) -> error
   positions: uint32, k entries; buckets_out: uint16, k; ranks_out: uint32, k;
   counts_out: uint32, at least 4 * (mask + 1) + 1 entries, zeroed by the
   caller (the first mask + 2 hold the counts afterwards) */
static PyObject *bucket_ranks(PyObject *self, PyObject *args)
{
    Py_buffer a, b, pos, ob, orank, cnt;
    int w, shift;
    unsigned long long mask;
    if (!PyArg_ParseTuple(args, "y*y*iiKy*w*w*w*", &a, &b, &w, &shift, &mask, &pos, &ob, &orank, &cnt))
        return NULL;
    PyObject *res = NULL;
    if (check_bucket_fn(w, shift, mask) < 0)
        goto done;
    size_t n = (size_t)a.len / w, k = (size_t)pos.len / 4;
    if (a.len != b.len || a.len % w || n >= UINT32_MAX || pos.len % 4 || (size_t)ob.len < 2 * k ||
        (size_t)orank.len < 4 * k || (size_t)cnt.len < 4 * (4 * (mask + 1) + 1)) {
        PyErr_SetString(PyExc_ValueError, "bucket_ranks: bad buffer sizes");
        goto done;
    }
    int err;
    Py_BEGIN_ALLOW_THREADS
    switch (w) {
    case 2: err = ranks_2(a.buf, b.buf, n, shift, mask, pos.buf, k, ob.buf, orank.buf, cnt.buf, NULL); break;
    case 4: err = ranks_4(a.buf, b.buf, n, shift, mask, pos.buf, k, ob.buf, orank.buf, cnt.buf, NULL); break;
    default: err = ranks_8(a.buf, b.buf, n, shift, mask, pos.buf, k, ob.buf, orank.buf, cnt.buf, NULL); break;
    }
    Py_END_ALLOW_THREADS
    res = PyLong_FromLong(err);
done:
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    PyBuffer_Release(&pos);
    PyBuffer_Release(&ob);
    PyBuffer_Release(&orank);
    PyBuffer_Release(&cnt);
    return res;
}

/* bucket_counts(ref, word, shift, mask, movers, counts_out) -> error
   counts_out as for bucket_ranks */
static PyObject *bucket_counts(PyObject *self, PyObject *args)
{
    Py_buffer a, mv, cnt;
    int w, shift;
    unsigned long long mask;
    if (!PyArg_ParseTuple(args, "y*iiKy*w*", &a, &w, &shift, &mask, &mv, &cnt))
        return NULL;
    PyObject *res = NULL;
    if (check_bucket_fn(w, shift, mask) < 0)
        goto done;
    size_t n = (size_t)a.len / w, km = (size_t)mv.len / 4;
    if (a.len % w || n >= UINT32_MAX || mv.len % 4 || (size_t)cnt.len < 4 * (4 * (mask + 1) + 1)) {
        PyErr_SetString(PyExc_ValueError, "bucket_counts: bad buffer sizes");
        goto done;
    }
    int err;
    Py_BEGIN_ALLOW_THREADS
    switch (w) {
    case 2: err = counts_2(a.buf, n, shift, mask, mv.buf, km, cnt.buf); break;
    case 4: err = counts_4(a.buf, n, shift, mask, mv.buf, km, cnt.buf); break;
    default: err = counts_8(a.buf, n, shift, mask, mv.buf, km, cnt.buf); break;
    }
    Py_END_ALLOW_THREADS
    res = PyLong_FromLong(err);
done:
    PyBuffer_Release(&a);
    PyBuffer_Release(&mv);
    PyBuffer_Release(&cnt);
    return res;
}

/* bucket_select(ref, word, shift, mask, movers, want, offsets, out) -> error
   want: uint32; offsets: int64, mask + 2 entries, nondecreasing from 0 to
   len(want) (checked); out: uint32, len(want) entries */
static PyObject *bucket_select(PyObject *self, PyObject *args)
{
    Py_buffer a, mv, want, off, out;
    int w, shift;
    unsigned long long mask;
    if (!PyArg_ParseTuple(args, "y*iiKy*y*y*w*", &a, &w, &shift, &mask, &mv, &want, &off, &out))
        return NULL;
    PyObject *res = NULL;
    void *scratch = NULL;
    if (check_bucket_fn(w, shift, mask) < 0)
        goto done;
    size_t n = (size_t)a.len / w, km = (size_t)mv.len / 4, kw = (size_t)want.len / 4, nb = (size_t)mask + 1;
    if (a.len % w || n >= UINT32_MAX || mv.len % 4 || want.len % 4 || (size_t)off.len != 8 * (nb + 1) ||
        (size_t)out.len < 4 * kw) {
        PyErr_SetString(PyExc_ValueError, "bucket_select: bad buffer sizes");
        goto done;
    }
    const int64_t *o = off.buf;
    if (o[0] != 0 || o[nb] != (int64_t)kw) {
        PyErr_SetString(PyExc_ValueError, "bucket_select: bad offsets");
        goto done;
    }
    for (size_t b = 0; b < nb; b++)
        if (o[b + 1] < o[b]) {
            PyErr_SetString(PyExc_ValueError, "bucket_select: bad offsets");
            goto done;
        }
    scratch = PyMem_Calloc(nb, sizeof(uint32_t) * 5 + sizeof(int64_t));
    if (scratch == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int err;
    int64_t *cur = scratch;
    uint32_t *cnt = (uint32_t *)(cur + nb), *next = cnt + 4 * nb;
    Py_BEGIN_ALLOW_THREADS
    switch (w) {
    case 2: err = select_2(a.buf, n, shift, mask, mv.buf, km, want.buf, o, out.buf, cnt, cur, next); break;
    case 4: err = select_4(a.buf, n, shift, mask, mv.buf, km, want.buf, o, out.buf, cnt, cur, next); break;
    default: err = select_8(a.buf, n, shift, mask, mv.buf, km, want.buf, o, out.buf, cnt, cur, next); break;
    }
    Py_END_ALLOW_THREADS
    res = PyLong_FromLong(err);
done:
    PyMem_Free(scratch);
    PyBuffer_Release(&a);
    PyBuffer_Release(&mv);
    PyBuffer_Release(&want);
    PyBuffer_Release(&off);
    PyBuffer_Release(&out);
    return res;
}

/* ---- CSPARSE, fused (codec v2) -------------------------------------------------
   csparse_encode codes the positions of one chunk in one pass over the base
   (the ranks) and one over the changed words; csparse_select lists them
   again in one pass over the reference side. Both give exactly what the numpy
   twins in conditioned.py give (tests/test_codec_v2.py checks it). */

/* what csparse_select reports; conditioned.py holds the messages */
enum { CS_OK = 0, CS_BAD_UNARY = 1, CS_BAD_REMAINDER_LENGTH = 2, CS_BAD_PADDING = 3, CS_OUT_OF_RANGE = 4,
       CS_BAD_MOVERS = 5, CS_NO_MEMORY = 99 };

static void put_varint(uint8_t **p, uint64_t v)
{
    while (v >= 0x80) {
        *(*p)++ = (uint8_t)((v & 0x7F) | 0x80);
        v >>= 7;
    }
    *(*p)++ = (uint8_t)v;
}

/* the Rice code of k increasing indices (gaps from -1) at parameter r,
   appended to the unary and remainder writers */
static void put_rice(bitw_t *u, bitw_t *rb, const uint32_t *p, size_t k, int r)
{
    const uint64_t low = r ? (((uint64_t)1 << r) - 1) : 0;
    uint32_t prev = (uint32_t)-1;
    for (size_t i = 0; i < k; i++) {
        uint64_t gap = (uint32_t)(p[i] - prev - 1), q = gap >> r;
        prev = p[i];
        if (q < 32) {
            put_bits(u, 1, (int)q + 1);
        } else {
            put_zeros(u, q);
            put_bits(u, 1, 1);
        }
        if (r > 32) {
            put_bits(rb, (gap & low) >> 32, r - 32);
            put_bits(rb, gap & 0xffffffffu, 32);
        } else if (r) {
            put_bits(rb, gap & low, r);
        }
    }
}

/* the complement of the kb increasing ranks in [0, n_b): into out */
static size_t complement_of(const uint32_t *ranks, size_t kb, uint32_t n_b, uint32_t *out)
{
    size_t c = 0, j = 0;
    for (uint32_t x = 0; x < n_b; x++) {
        if (j < kb && ranks[j] == x) {
            j++;
            continue;
        }
        out[c++] = x;
    }
    return c;
}

typedef struct {
    uint32_t b, c, mode;
    int r;
    uint64_t ubits;
} centry_t;

static int list_append_size(PyObject *list, size_t v)
{
    PyObject *o = PyLong_FromSize_t(v);
    int r = o ? PyList_Append(list, o) : -1;
    Py_XDECREF(o);
    return r;
}

/* csparse_encode(old, new, word, shift, mask, positions uint32, listed_out uint32,
   signs_out, planes_out) -> (table, bits, runs): the sections 0 and 1 of a
   CSPARSE record for the changed positions (strictly increasing);
   listed_out gets them in the listed order (movers, then bucket by bucket),
   signs_out (ceil(k / 8) bytes) and planes_out (k * word bytes) what
   mod_values gives for them in that order, and runs is the list of the
   value coder's runs (the movers, then each bucket's changed words). The
   values are taken in the pass that finds or ranks the changed words,
   while their cache lines are loaded (a gather in the listed order misses
   the cache: a 4 MiB bf16 chunk at 1%, mod_values 0.2-0.4 ms; a gather in
   position order afterwards still cost a tenth of the kernel's time on
   chunks just read). Raises ValueError on positions that do not
   increase. */
static PyObject *csparse_encode(PyObject *self, PyObject *args)
{
    Py_buffer a, b, pos = {0}, out = {0}, sg = {0}, pl = {0};
    int w, shift;
    unsigned long long mask;
    PyObject *po, *oo, *so, *plo;
    if (!PyArg_ParseTuple(args, "y*y*iiKOOOO", &a, &b, &w, &shift, &mask, &po, &oo, &so, &plo))
        return NULL;
    PyObject *res = NULL, *table = NULL, *bits = NULL, *runs = NULL;
    PyObject *pos_b = NULL, *listed_b = NULL, *sg_b = NULL, *pl_b = NULL;
    uint8_t *mem = NULL;
    uint32_t *coded = NULL, *srank = NULL;
    sgrow_t g = {NULL, NULL, NULL, 0, 0, NULL};
    const int scan = po == Py_None;
    if (!scan && (PyObject_GetBuffer(po, &pos, PyBUF_SIMPLE) < 0 || PyObject_GetBuffer(oo, &out, PyBUF_WRITABLE) < 0 ||
                  PyObject_GetBuffer(so, &sg, PyBUF_WRITABLE) < 0 || PyObject_GetBuffer(plo, &pl, PyBUF_WRITABLE) < 0))
        goto done;
    if (check_bucket_fn(w, shift, mask) < 0)
        goto done;
    size_t n = (size_t)a.len / w, k = scan ? 0 : (size_t)pos.len / 4, nb = (size_t)mask + 1;
    if (a.len != b.len || a.len % w || n >= UINT32_MAX ||
        (!scan && (pos.len % 4 || (size_t)out.len < 4 * k || (size_t)sg.len != (k + 7) / 8 || (size_t)pl.len != k * w))) {
        PyErr_SetString(PyExc_ValueError, "csparse_encode: bad buffer sizes");
        goto done;
    }
    /* scratch: counts (4 nb + 1), bucket starts (nb + 1), entries (nb);
       per changed word: bucket, rank (grown as the scan finds them), sorted
       rank; coded (the largest complement) */
    size_t cnt_n = 4 * nb + 1;
    size_t need = 4 * cnt_n + 8 * (nb + 1) + sizeof(centry_t) * nb + 64;
    mem = PyMem_Calloc(1, need);
    g.cap = scan ? (n >> 6) + 256 : k;
    if (g.cap > n && scan)
        g.cap = n;
    g.pos = scan ? PyMem_RawMalloc(4 * g.cap + 4) : NULL;
    g.orank = PyMem_RawMalloc(4 * g.cap + 4);
    g.ob = PyMem_RawMalloc(2 * g.cap + 2);
    g.dv = PyMem_RawMalloc(8 * g.cap + 8);
    if (!mem || (scan && !g.pos) || !g.orank || !g.ob || !g.dv) {
        PyErr_NoMemory();
        goto done;
    }
    uint32_t *cnt = (uint32_t *)mem;
    uint64_t *start = (uint64_t *)(mem + ((4 * cnt_n + 7) & ~(size_t)7));
    centry_t *ent = (centry_t *)(start + nb + 1);
    int err;
    size_t km = 0, ne = 0;
    uint64_t ubits = 0, rbits = 0, mbits = 0;
    int r_m = 0;
    Py_BEGIN_ALLOW_THREADS
    if (scan) {
        err = 0;
        switch (w) {
        case 2:
#ifdef HAVE_AVX2_SCAN
            if (cpu_avx2 && simd_on) {
                k = sranks_avx2_2(a.buf, b.buf, n, shift, mask, &g, cnt);
                break;
            }
#endif
            k = sranks_2(a.buf, b.buf, n, shift, mask, &g, cnt);
            break;
        case 4: k = sranks_4(a.buf, b.buf, n, shift, mask, &g, cnt); break;
        default: k = sranks_8(a.buf, b.buf, n, shift, mask, &g, cnt); break;
        }
    } else {
        switch (w) {
        case 2: err = ranks_2(a.buf, b.buf, n, shift, mask, pos.buf, k, g.ob, g.orank, cnt, g.dv); break;
        case 4: err = ranks_4(a.buf, b.buf, n, shift, mask, pos.buf, k, g.ob, g.orank, cnt, g.dv); break;
        default: err = ranks_8(a.buf, b.buf, n, shift, mask, pos.buf, k, g.ob, g.orank, cnt, g.dv); break;
        }
    }
    Py_END_ALLOW_THREADS
    if (g.oom) {
        PyErr_NoMemory();
        goto done;
    }
    /* scanning, the outputs are made now that k is known */
    if (scan) {
        pos_b = PyBytes_FromStringAndSize((const char *)g.pos, (Py_ssize_t)(4 * k));
        listed_b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(4 * k));
        sg_b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)((k + 7) / 8));
        pl_b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(k * w));
        if (!pos_b || !listed_b || !sg_b || !pl_b)
            goto done;
    }
    srank = PyMem_RawMalloc(4 * k + 4);
    if (!srank) {
        PyErr_NoMemory();
        goto done;
    }
    const uint32_t *p = scan ? (const uint32_t *)PyBytes_AS_STRING(pos_b) : pos.buf;
    uint32_t *listed = scan ? (uint32_t *)PyBytes_AS_STRING(listed_b) : out.buf;
    const uint16_t *ob = g.ob;
    const uint32_t *orank = g.orank;
    Py_BEGIN_ALLOW_THREADS
    if (!err) {
        /* counting sort of the changed words by bucket (movers first), stable */
        km = cnt[nb];
        for (size_t i = 0; i < k; i++)
            if (ob[i] != nb)
                start[ob[i] + 1]++;
        start[0] = km;
        for (size_t x = 0; x < nb; x++)
            start[x + 1] += start[x];
        size_t mi = 0;
        uint8_t *sgn = scan ? (uint8_t *)PyBytes_AS_STRING(sg_b) : sg.buf;
        uint8_t *mp = scan ? (uint8_t *)PyBytes_AS_STRING(pl_b) : pl.buf;
        const int bits = 8 * w;
        const uint64_t full = w == 8 ? ~(uint64_t)0 : (((uint64_t)1 << bits) - 1);
        memset(sgn, 0, (k + 7) / 8);
        for (size_t i = 0; i < k; i++) {
            uint64_t at;
            if (ob[i] == nb) {
                at = mi++;
            } else {
                at = start[ob[i]]++;
                srank[at] = orank[i];
            }
            listed[at] = p[i];
            /* as mod_values: the sign, and the magnitude less one, as planes */
            uint64_t d = g.dv[i];
            uint64_t neg = d >> (bits - 1), mag = ((neg ? (0 - d) & full : d) - 1) & full;
            sgn[at >> 3] |= (uint8_t)(neg << (7 - (at & 7)));
            for (int j = 0; j < w; j++)
                mp[(size_t)j * k + at] = (uint8_t)(mag >> (8 * (w - 1 - j)));
        }
        if (km) {
            uint64_t bb = 0;
            r_m = rice_param(listed, km, &bb);
            mbits = bb;
        }
        /* start[x] is now the end of bucket x's run; its begin is start[x - 1]
           (km for 0). The complements need at most the largest of them. */
        uint64_t lo = km, most = 0;
        for (size_t x = 0; x < nb; x++) {
            uint64_t kb = start[x] - lo;
            if (kb && 2 * kb > cnt[x] && cnt[x] - kb > most)
                most = cnt[x] - kb;
            lo = start[x];
        }
        coded = PyMem_RawMalloc(4 * (size_t)most + 4);
        if (!coded)
            err = 2;
        lo = km;
        for (size_t x = 0; x < nb && !err; x++) {
            uint64_t hi = start[x];
            size_t kb = (size_t)(hi - lo);
            if (kb) {
                uint32_t n_b = cnt[x];
                int comp = 2 * (uint64_t)kb > n_b;
                const uint32_t *cd = srank + lo;
                size_t c = kb;
                if (comp) {
                    c = complement_of(srank + lo, kb, n_b, coded);
                    cd = coded;
                }
                int r = 0;
                uint64_t bb = 0;
                if (c)
                    r = rice_param(cd, c, &bb);
                ent[ne].b = (uint32_t)x;
                ent[ne].c = (uint32_t)c;
                ent[ne].r = r;
                ent[ne].mode = (uint32_t)(2 * r + comp);
                ent[ne].ubits = c ? bb - (uint64_t)c * r : 0;
                ubits += ent[ne].ubits;
                rbits += (uint64_t)c * r;
                ne++;
            }
            lo = hi;
        }
    }
    Py_END_ALLOW_THREADS
    if (err == 2) {
        PyErr_NoMemory();
        goto done;
    }
    if (err) {
        PyErr_SetString(PyExc_ValueError, "csparse_encode: positions not increasing");
        goto done;
    }
    uint64_t mubits = mbits - (uint64_t)km * r_m, mrbits = (uint64_t)km * r_m;
    size_t ulen_m = (size_t)((mubits + 7) / 8), rlen_m = (size_t)((mrbits + 7) / 8);
    size_t ulen = (size_t)((ubits + 7) / 8), rlen = (size_t)((rbits + 7) / 8);
    table = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(10 * (5 + 3 * ne)));
    bits = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(ulen_m + rlen_m + ulen + rlen));
    if (!table || !bits)
        goto done;
    uint8_t *t0 = (uint8_t *)PyBytes_AS_STRING(table), *t = t0;
    put_varint(&t, km);
    put_varint(&t, (uint64_t)r_m);
    put_varint(&t, ulen_m);
    put_varint(&t, ne);
    uint32_t prevb = (uint32_t)-1;
    for (size_t e = 0; e < ne; e++) {
        put_varint(&t, (uint64_t)(ent[e].b - prevb - 1));
        put_varint(&t, ent[e].c);
        put_varint(&t, ent[e].mode);
        prevb = ent[e].b;
    }
    put_varint(&t, ulen);
    if (_PyBytes_Resize(&table, (Py_ssize_t)(t - t0)) < 0)
        goto done;
    uint8_t *bp = (uint8_t *)PyBytes_AS_STRING(bits);
    Py_BEGIN_ALLOW_THREADS
    bitw_t um = {bp, 0, 0}, rm = {bp + ulen_m, 0, 0};
    if (km) {
        put_rice(&um, &rm, listed, km, r_m);
        flush_bits(&um);
        flush_bits(&rm);
    }
    bitw_t u = {bp + ulen_m + rlen_m, 0, 0}, rb = {bp + ulen_m + rlen_m + ulen, 0, 0};
    uint64_t lo = km;
    size_t e = 0;
    for (size_t x = 0; x < nb && e < ne; x++) {
        uint64_t hi = start[x];
        if (hi > lo) {
            const uint32_t *cd = srank + lo;
            size_t c = ent[e].c;
            if (ent[e].mode & 1) {
                complement_of(srank + lo, (size_t)(hi - lo), cnt[x], coded);
                cd = coded;
            }
            put_rice(&u, &rb, cd, c, ent[e].r);
            e++;
        }
        lo = hi;
    }
    flush_bits(&u);
    flush_bits(&rb);
    Py_END_ALLOW_THREADS
    /* the runs: the movers, then each bucket's changed words (start[x] is
       the end of bucket x's run, km that of the movers) */
    runs = PyList_New(0);
    if (!runs || list_append_size(runs, km) < 0)
        goto done;
    for (size_t x = 0, lo = km; x < nb; lo = start[x], x++)
        if (start[x] > lo && list_append_size(runs, (size_t)(start[x] - lo)) < 0)
            goto done;
    res = scan ? PyTuple_Pack(7, table, bits, runs, pos_b, listed_b, sg_b, pl_b) : PyTuple_Pack(3, table, bits, runs);
done:
    Py_XDECREF(pos_b);
    Py_XDECREF(listed_b);
    Py_XDECREF(sg_b);
    Py_XDECREF(pl_b);
    Py_XDECREF(runs);
    Py_XDECREF(table);
    Py_XDECREF(bits);
    PyMem_RawFree(coded);
    PyMem_RawFree(srank);
    PyMem_RawFree(g.pos);
    PyMem_RawFree(g.orank);
    PyMem_RawFree(g.ob);
    PyMem_RawFree(g.dv);
    PyMem_Free(mem);
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    if (pos.obj)
        PyBuffer_Release(&pos);
    if (out.obj)
        PyBuffer_Release(&out);
    if (sg.obj)
        PyBuffer_Release(&sg);
    if (pl.obj)
        PyBuffer_Release(&pl);
    return res;
}

/* The pass of csparse_select, tile by tile: the words of a tile of ref are
   counted into the buckets' totals (four interleaved tables, as counts_W,
   so that no counter waits on the one before it), and only an entry whose
   next coded index falls inside the tile (its total passed it) looks at
   the tile's words again, sixteen at a time, as a bit mask of the words of
   its bucket (two bits per word, the lower one set: the layout of a byte
   mask of 16-bit lanes) whose set bits are counted off. A countdown per
   word instead waits on the counter of its bucket (a 4 MiB bf16 chunk at
   1%: 2.2-3.2 ms for the pass, 0.9-1.4 ns a word; tiles: see the commit).
   The movers are counted and then taken out again, and masked out of the
   blocks. A tile where more than CS_LIST_MIN entries have work lists its
   words by bucket instead (CS_LIST_TILE), so that no record costs more
   than a few passes over its words. Coded words of complemented entries
   are skipped; their other words are staged with their bucket (in
   position order within each bucket) and put in place after the pass. */
#define CS_TILE 512 /* words; more where there are many entries */
#define CS_MAX_TILE ((size_t)1 << 16)
#define CS_END UINT64_MAX /* an entry with every coded index passed */

#if defined(__GNUC__) || defined(__clang__)
#define CS_POPCOUNT(m) ((uint32_t)__builtin_popcount(m))
#define CS_CTZ(m) ((uint32_t)__builtin_ctz(m))
#else
static uint32_t CS_POPCOUNT(uint32_t m)
{
    uint32_t c = 0;
    for (; m; m &= m - 1)
        c++;
    return c;
}
static uint32_t CS_CTZ(uint32_t m)
{
    uint32_t c = 0;
    for (; !(m & 1); m >>= 1)
        c++;
    return c;
}
#endif

/* the mask of the words [i, i + len) (len <= 16) of ref in bucket b */
#define DEFINE_CS_BLOCK(W)                                                                           \
    static inline uint32_t cs_block_##W(const uint8_t *ref, size_t i, size_t len, int shift, uint64_t mask, \
                                        uint32_t b)                                                  \
    {                                                                                                \
        uint32_t m = 0;                                                                              \
        for (size_t u = 0; u < len; u++)                                                             \
            m |= (uint32_t)(BUCKET_AT(W, ref, i + u, shift, mask) == b) << (2 * u);                 \
        return m;                                                                                    \
    }
DEFINE_CS_BLOCK(2)
DEFINE_CS_BLOCK(4)
DEFINE_CS_BLOCK(8)

/* A tile where many entries have work: each of them would look at the
   tile block by block from its start (a hostile record with a coded word
   at the end of every tile in each of 2,048 f64 buckets cost 0.43 s per
   4 MiB chunk), so the tile's non-mover words of those entries' buckets
   are listed instead, in one pass over the tile (at most the tile's words:
   the buckets are disjoint), and each entry takes its words from its list:
   the same words in the same order as the blocks give. */
#define CS_LIST_MIN 16
/* within the pass: bucket b's non-mover words up to the tile's end, and
   whether entry x has work in the tile (a word of its bucket there and,
   unless complemented, a coded index below tot) */
#define CS_TOT(b) ((uint64_t)(uint32_t)(c0[b] + c1[b] + c2[b] + c3[b]))
#define CS_HAS_WORK(x, tot) ((tot) != seen[x] && (ecomp[x] || nx[x] < (tot)))
typedef struct {
    int32_t *entry; /* per bucket: its entry, or -1 */
    uint64_t *tot, *at, *cur; /* per entry: its count after the tile, its list's start and end */
    uint32_t *words; /* the lists, CS_MAX_TILE words */
} cs_lists_t;
#define CS_LIST_TILE(W)                                                                              \
    do {                                                                                             \
        uint64_t o = 0;                                                                              \
        for (size_t x = 0; x < ne; x++) {                                                            \
            const uint64_t tot = CS_TOT(eb[x]);                                                      \
            ls->tot[x] = tot;                                                                        \
            ls->at[x] = ls->cur[x] = o;                                                              \
            if (CS_HAS_WORK(x, tot))                                                                 \
                o += tot - seen[x];                                                                  \
            else                                                                                     \
                ls->cur[x] = UINT64_MAX; /* nothing to do in this tile */                            \
        }                                                                                            \
        if (o > len) { /* more than the tile's words: counts not of this ref */                      \
            over = 1;                                                                                \
            for (size_t x = 0; x < ne; x++)                                                          \
                seen[x] = ls->tot[x];                                                                \
            break;                                                                                   \
        }                                                                                            \
        size_t q = j0;                                                                               \
        for (size_t i = t0; i < end; i++) {                                                          \
            if (q < j && mv[q] == i) {                                                               \
                q++;                                                                                 \
                continue;                                                                            \
            }                                                                                        \
            const int32_t x = ls->entry[BUCKET_AT(W, ref, i, shift, mask)];                          \
            if (x >= 0 && ls->cur[x] != UINT64_MAX && ls->cur[x] < ls->at[x] + (ls->tot[x] - seen[x])) \
                ls->words[ls->cur[x]++] = (uint32_t)i;                                               \
        }                                                                                            \
        for (size_t x = 0; x < ne; x++) {                                                            \
            const uint64_t tot = ls->tot[x], r0 = seen[x];                                           \
            seen[x] = tot;                                                                           \
            if (ls->cur[x] == UINT64_MAX)                                                            \
                continue;                                                                            \
            if (ls->cur[x] != ls->at[x] + (tot - r0)) { /* not the words counted */                  \
                over = 1;                                                                            \
                continue;                                                                            \
            }                                                                                        \
            const uint32_t *L = ls->words + ls->at[x];                                               \
            if (!ecomp[x]) {                                                                         \
                for (; nx[x] < tot; nx[x] = ip[x] < ie[x] ? *ip[x]++ : CS_END) {                      \
                    if (dst[x] < dend[x])                                                            \
                        *dst[x]++ = L[nx[x] - r0];                                                   \
                    else                                                                             \
                        over = 1;                                                                    \
                }                                                                                    \
            } else {                                                                                 \
                for (uint64_t r = r0; r < tot; r++) {                                                \
                    if (r == nx[x]) {                                                                \
                        nx[x] = ip[x] < ie[x] ? *ip[x]++ : CS_END;                                  \
                    } else if (sp < send) {                                                          \
                        tags[sp - sbase] = (uint16_t)eb[x];                                          \
                        *sp++ = L[r - r0];                                                           \
                    } else {                                                                         \
                        over = 1;                                                                    \
                    }                                                                                \
                }                                                                                    \
            }                                                                                        \
        }                                                                                            \
    } while (0)
/* the pass; BLOCK(i, len, b) gives the mask of a block */
#define DEFINE_CSELECT(NAME, W, ATTR, BLOCK, COUNT)                                                  \
    ATTR static int NAME(const uint8_t *ref, size_t n, int shift, uint64_t mask, const uint32_t *mv,   \
                         size_t km, size_t ne, const uint32_t *eb, const uint8_t *ecomp,              \
                         const uint32_t **ip, const uint32_t **ie, uint32_t **dst, uint32_t **dend,   \
                         uint64_t *seen, uint64_t *nx, uint32_t *cnt, uint32_t *sbase, uint32_t *send, \
                         uint16_t *tags, size_t *staged, uint32_t *mvm, cs_lists_t *ls)               \
    {                                                                                                \
        const uint32_t nb = (uint32_t)mask + 1;                                                      \
        uint32_t *c0 = cnt, *c1 = cnt + nb, *c2 = cnt + 2 * nb, *c3 = cnt + 3 * nb;                   \
        int over = 0;                                                                                \
        uint32_t *sp = sbase;                                                                         \
        const uint32_t lo = COUNT_WINDOW(W, ref, n, shift, mask);                                     \
        (void)lo;                                                                                     \
        size_t j = 0, tile = CS_TILE;                                                                 \
        while (tile < 32 * ne && tile < CS_MAX_TILE) /* many entries: fewer checks */                \
            tile *= 2;                                                                                \
        for (size_t x = 0; x < ne; x++)                                                               \
            nx[x] = ip[x] < ie[x] ? *ip[x]++ : CS_END;                                               \
        for (size_t t0 = 0; t0 < n; t0 += tile) {                                                     \
            const size_t end = n - t0 < tile ? n : t0 + tile, len = end - t0, j0 = j;                 \
            COUNT(t0, end);                                                                           \
            for (; j < km && mv[j] < end; j++) { /* the tile's movers: mv[j0:j] */                   \
                c0[BUCKET_AT(W, ref, mv[j], shift, mask)]--; /* wraps back in the sum */              \
                mvm[(mv[j] - t0) >> 4] |= 1u << (2 * ((mv[j] - t0) & 15));                           \
            }                                                                                         \
            size_t active = 0;                                                                        \
            for (size_t x = 0; x < ne && active <= CS_LIST_MIN; x++) {                                \
                active += CS_HAS_WORK(x, CS_TOT(eb[x]));                                              \
            }                                                                                         \
            if (active > CS_LIST_MIN) {                                                               \
                CS_LIST_TILE(W);                                                                      \
                goto next_tile;                                                                       \
            }                                                                                         \
            for (size_t x = 0; x < ne; x++) {                                                         \
                const uint32_t b = eb[x];                                                             \
                const uint64_t tot = CS_TOT(b);                                                       \
                if (!CS_HAS_WORK(x, tot)) {                                                           \
                    seen[x] = tot;                                                                    \
                    continue;                                                                         \
                }                                                                                     \
                uint64_t r = seen[x]; /* the rank of the lowest word of m */                          \
                size_t v = 0;                                                                         \
                uint32_t m;                                                                           \
                CS_LOAD_BLOCK(BLOCK);                                                                 \
                if (!ecomp[x]) {                                                                      \
                    while (nx[x] < tot) {                                                             \
                        const uint64_t want = nx[x];                                                  \
                        for (;;) {                                                                    \
                            uint32_t s = CS_POPCOUNT(m);                                              \
                            if (r + s > want) {                                                       \
                                for (uint64_t t = want - r; t; t--)                                   \
                                    m &= m - 1;                                                       \
                                break;                                                                \
                            }                                                                         \
                            r += s;                                                                   \
                            v += 16;                                                                  \
                            CS_LOAD_BLOCK(BLOCK);                                                     \
                        }                                                                             \
                        if (dst[x] < dend[x])                                                         \
                            *dst[x]++ = (uint32_t)(t0 + v + (CS_CTZ(m) >> 1));                        \
                        else                                                                          \
                            over = 1;                                                                 \
                        m &= m - 1;                                                                   \
                        r = want + 1;                                                                 \
                        nx[x] = ip[x] < ie[x] ? *ip[x]++ : CS_END;                                   \
                    }                                                                                 \
                } else {                                                                              \
                    for (; r < tot; r++) {                                                            \
                        while (!m) {                                                                  \
                            v += 16;                                                                  \
                            CS_LOAD_BLOCK(BLOCK);                                                     \
                        }                                                                             \
                        const size_t at = t0 + v + (CS_CTZ(m) >> 1);                                  \
                        m &= m - 1;                                                                   \
                        if (r == nx[x]) {                                                             \
                            nx[x] = ip[x] < ie[x] ? *ip[x]++ : CS_END;                               \
                        } else if (sp < send) {                                                       \
                            tags[sp - sbase] = (uint16_t)b;                                           \
                            *sp++ = (uint32_t)at;                                                     \
                        } else {                                                                      \
                            over = 1;                                                                 \
                        }                                                                             \
                    }                                                                                 \
                }                                                                                     \
                seen[x] = tot;                                                                        \
            }                                                                                         \
        next_tile:                                                                                    \
            for (size_t q = j0; q < j; q++) /* the mask clean for the next tile */                    \
                mvm[(mv[q] - t0) >> 4] = 0;                                                           \
        }                                                                                             \
        for (uint32_t b = 0; b < nb; b++)                                                             \
            c0[b] += c1[b] + c2[b] + c3[b];                                                           \
        *staged = (size_t)(sp - sbase);                                                               \
        return over;                                                                                  \
    }
/* the block at v of the tile, its movers taken out: mvm holds them, a
   mask per block of the tile as BLOCK makes them (looking through the
   tile's movers at every block instead made a hostile record of movers
   packed into every tile cost seconds per 256 KiB chunk) */
#define CS_LOAD_BLOCK(BLOCK)                                                                         \
    do {                                                                                             \
        m = BLOCK(t0 + v, len - v < 16 ? len - v : 16, b);                                           \
        if (j > j0)                                                                                  \
            m &= ~mvm[v >> 4];                                                                       \
    } while (0)
#define CS_BLOCK_2(i, len, b) cs_block_2(ref, (i), (len), shift, mask, (b))
#define CS_BLOCK_4(i, len, b) cs_block_4(ref, (i), (len), shift, mask, (b))
#define CS_BLOCK_8(i, len, b) cs_block_8(ref, (i), (len), shift, mask, (b))
/* the tile's words counted into the four tables, one word each in turn */
#define CS_COUNT_SCALAR(W)                                                                           \
    do {                                                                                             \
        size_t i = t0;                                                                               \
        for (; i + 4 <= end; i += 4) {                                                               \
            c0[BUCKET_AT(W, ref, i, shift, mask)]++;                                                 \
            c1[BUCKET_AT(W, ref, i + 1, shift, mask)]++;                                             \
            c2[BUCKET_AT(W, ref, i + 2, shift, mask)]++;                                             \
            c3[BUCKET_AT(W, ref, i + 3, shift, mask)]++;                                             \
        }                                                                                            \
        for (; i < end; i++)                                                                         \
            c0[BUCKET_AT(W, ref, i, shift, mask)]++;                                                 \
    } while (0)
#define CS_COUNT_2(t0, end) CS_COUNT_SCALAR(2)
#define CS_COUNT_4(t0, end) CS_COUNT_SCALAR(4)
#define CS_COUNT_8(t0, end) CS_COUNT_SCALAR(8)
#define NO_WINDOW(W, ref, n, shift, mask) 0
#define COUNT_WINDOW NO_WINDOW
DEFINE_CSELECT(cselect_2, 2, HOT, CS_BLOCK_2, CS_COUNT_2)
DEFINE_CSELECT(cselect_4, 4, HOT, CS_BLOCK_4, CS_COUNT_4)
DEFINE_CSELECT(cselect_8, 8, HOT, CS_BLOCK_8, CS_COUNT_8)
#undef COUNT_WINDOW

#ifdef HAVE_AVX2_SCAN
/* two-byte words: a block is one comparison of sixteen lanes */
__attribute__((target("avx2,bmi,popcnt"))) static inline uint32_t cs_block_avx2(const uint8_t *ref, size_t i,
                                                                                 size_t len, int shift,
                                                                                 uint64_t mask, uint32_t b)
{
    if (len < 16)
        return cs_block_2(ref, i, len, shift, mask, b);
    __m256i x = _mm256_loadu_si256((const __m256i *)(ref + 2 * i));
    __m256i k = _mm256_and_si256(x, _mm256_set1_epi16((short)(mask << shift)));
    __m256i eq = _mm256_cmpeq_epi16(k, _mm256_set1_epi16((short)(b << shift)));
    return (uint32_t)_mm256_movemask_epi8(eq) & 0x55555555u;
}
#define CS_BLOCK_AVX2(i, len, b) cs_block_avx2(ref, (i), (len), shift, mask, (b))
#define CS_COUNT_AVX2(t0, end) count_words_avx2(ref, (t0), (end), shift, mask, lo, c0, NULL)
#define COUNT_WINDOW(W, ref, n, shift, mask) count_window_2(ref, n, shift, mask)
DEFINE_CSELECT(cselect_avx2_2, 2, __attribute__((target("avx2,bmi,popcnt"))), CS_BLOCK_AVX2, CS_COUNT_AVX2)
#undef COUNT_WINDOW
#endif

/* csparse_select(ref, word, shift, mask, movers uint32, entries int64 (E x 3:
   bucket, c, mode), counts uint32/int64 n/a: counts int64 (mask + 1),
   unary, remainder, out uint32) -> error code.
   The entries and counts are checked by the caller (buckets increasing and
   below mask + 1, c <= n_b, c < n_b when complemented, r <= MAX_RICE, the
   listed total = len(out)); here: the unary stream holds exactly sum(c)
   ones and ends with the last, the remainder stream is exactly its length
   with zero padding, every quotient within n_b >> r and every index below
   n_b. Nothing is written to out unless all of that holds. */
static PyObject *csparse_select(PyObject *self, PyObject *args)
{
    Py_buffer a, mv, entb, cntb, un, rem, out, cout;
    int w, shift;
    unsigned long long mask;
    if (!PyArg_ParseTuple(args, "y*iiKy*y*y*y*y*w*w*", &a, &w, &shift, &mask, &mv, &entb, &cntb, &un, &rem, &out,
                          &cout))
        return NULL;
    PyObject *res = NULL;
    uint8_t *mem = NULL;
    if (check_bucket_fn(w, shift, mask) < 0)
        goto done;
    size_t n = (size_t)a.len / w, km = (size_t)mv.len / 4, nb = (size_t)mask + 1, ne = (size_t)entb.len / 24;
    size_t kout = (size_t)out.len / 4;
    /* no counts: they are not known yet (fused: the pass counts them, into
       counts_out, and the bounds that need them are checked after it) */
    int fused = cntb.len == 0;
    if (a.len % w || n >= UINT32_MAX || mv.len % 4 || entb.len % 24 || ne > nb ||
        (!fused && (size_t)cntb.len != 8 * nb) || out.len % 4 || (size_t)cout.len != 8 * (nb + 1)) {
        PyErr_SetString(PyExc_ValueError, "csparse_select: bad buffer sizes");
        goto done;
    }
    const int64_t *e = entb.buf, *cnt = cntb.buf;
    int64_t *counts = cout.buf;
    uint64_t coded = 0, rbits = 0, listed = 0, plain = 0;
    int any_comp = 0;
    for (size_t x = 0; x < ne; x++) {
        int64_t bx = e[3 * x], c = e[3 * x + 1], mode = e[3 * x + 2];
        int64_t cap = fused ? (int64_t)n : (bx >= 0 && (size_t)bx < nb ? cnt[bx] : -1);
        if (bx < 0 || (size_t)bx >= nb || (x && bx <= e[3 * (x - 1)]) || c < 0 || mode < 0 ||
            mode > 2 * MAX_RICE + 1 || cap < 0 || cap >= (int64_t)UINT32_MAX || c > cap ||
            ((mode & 1) && !fused && c == cap) || (c == 0 && mode != 1)) {
            PyErr_SetString(PyExc_ValueError, "csparse_select: bad entries");
            goto done;
        }
        coded += (uint64_t)c;
        rbits += (uint64_t)c * (uint64_t)(mode >> 1);
        listed += (mode & 1) ? (uint64_t)(cap - c) : (uint64_t)c;
        plain += (mode & 1) ? 0 : (uint64_t)c;
        any_comp |= (int)(mode & 1);
    }
    /* the buckets are disjoint: more coded words than the chunk's are not a
       record (and scratch is sized by them) */
    if ((!fused && listed != kout) || plain > kout || coded > n - (km < n ? km : n)) {
        PyErr_SetString(PyExc_ValueError, "csparse_select: out does not hold the listed words");
        goto done;
    }
    /* scratch: per bucket dst, dend and four count tables; per entry its
       bucket, pointers to its coded indices and into out (four), the words
       of its bucket before the tile, its next coded index, its last index
       and largest quotient, whether it is complemented; the coded indices
       (coded), the staged words' buckets (kout - plain), a mover mask per
       16-word block of the largest tile */
    mem = PyMem_Calloc(1, nb * (2 * sizeof(uint32_t *) + 16) + ne * (4 * sizeof(uint32_t *) + 4 * 8 + 4 + 1) +
                              4 * (size_t)coded + 2 * (kout - (size_t)plain) + 4 * (CS_MAX_TILE / 16) +
                              4 * nb + 24 * ne + 4 * CS_MAX_TILE + 64);
    if (!mem) {
        PyErr_NoMemory();
        goto done;
    }
    uint32_t **dst = (uint32_t **)mem, **dend = dst + nb;
    const uint32_t **ip = (const uint32_t **)(dend + nb), **ie = ip + ne;
    uint32_t **edst = (uint32_t **)(ie + ne), **edend = edst + ne;
    uint64_t *seen = (uint64_t *)(edend + ne), *nx = seen + ne, *elast = nx + ne, *eqmax = elast + ne;
    uint32_t *tables = (uint32_t *)(eqmax + ne), *eb = tables + 4 * nb, *steps = eb + ne;
    uint16_t *tags = (uint16_t *)(steps + coded);
    uint64_t *lsp = (uint64_t *)(((uintptr_t)(tags + (kout - (size_t)plain)) + 7) & ~(uintptr_t)7);
    cs_lists_t lists = {NULL, lsp, lsp + ne, lsp + 2 * ne, NULL};
    uint32_t *mvm = (uint32_t *)(lsp + 3 * ne);
    lists.words = mvm + CS_MAX_TILE / 16;
    lists.entry = (int32_t *)(lists.words + CS_MAX_TILE);
    uint8_t *ecomp = (uint8_t *)(lists.entry + nb);
    int err = CS_OK;
    Py_BEGIN_ALLOW_THREADS
    const uint32_t *mp = mv.buf;
    for (size_t j = 0; j < km; j++)
        if (mp[j] >= n || (j && mp[j] <= mp[j - 1]))
            err = CS_BAD_MOVERS;
    /* the quotients, from the unary stream: into steps */
    size_t len = (size_t)un.len, last = 0;
    uint64_t ones = 0, qtop = 0;
    unary_quotients(un.buf, len, steps, coded, &ones, &last, &qtop);
    if (err)
        ;
    else if (ones != coded || (coded && len != last + 1) || (!coded && len))
        err = CS_BAD_UNARY;
    else if ((uint64_t)rem.len != (rbits + 7) / 8)
        err = CS_BAD_REMAINDER_LENGTH;
    else {
        const uint8_t *rp = rem.buf;
        for (uint64_t bt = rbits; bt < (uint64_t)rem.len * 8; bt++)
            if ((rp[bt >> 3] >> (7 - (bt & 7))) & 1)
                err = CS_BAD_PADDING;
    }
    if (!err) {
        /* quotients and remainders into the coded indices, entry by entry,
           each checked below n_b */
        bitr_t br = {rem.buf, 0, 0, 0};
        size_t qi = 0;
        for (size_t x = 0; x < ne && !err; x++) {
            uint64_t c = (uint64_t)e[3 * x + 1], n_b = fused ? (uint64_t)n : (uint64_t)cnt[e[3 * x]];
            int r = (int)(e[3 * x + 2] >> 1);
            uint64_t prev = (uint64_t)-1;
            for (uint64_t y = 0; y < c; y++, qi++) {
                uint64_t q = steps[qi];
                if (q > eqmax[x])
                    eqmax[x] = q;
                if (q > (n_b >> r)) {
                    err = CS_OUT_OF_RANGE;
                    break;
                }
                uint64_t idx = prev + ((q << r) | get_bits(&br, r)) + 1;
                if (idx >= n_b) {
                    err = CS_OUT_OF_RANGE;
                    break;
                }
                steps[qi] = (uint32_t)idx;
                prev = idx;
            }
            elast[x] = prev;
        }
    }
    if (!err) {
        /* out: first the uncomplemented entries' words, each entry's share in
           table order, then the staged words */
        uint32_t *o = out.buf;
        const uint32_t *sx = steps;
        for (size_t x = 0; x < ne; x++) {
            int64_t c = e[3 * x + 1];
            eb[x] = (uint32_t)e[3 * x];
            ecomp[x] = (uint8_t)(e[3 * x + 2] & 1);
            edst[x] = o;
            o += ecomp[x] ? 0 : c;
            edend[x] = o;
            ip[x] = sx;
            sx += c;
            ie[x] = sx;
        }
        for (size_t b = 0; b < nb; b++)
            lists.entry[b] = -1;
        for (size_t x = 0; x < ne; x++)
            lists.entry[eb[x]] = (int32_t)x;
        int over;
        size_t staged = 0;
        uint32_t *sbase = (uint32_t *)out.buf + plain, *send = (uint32_t *)out.buf + kout;
#define CS_ARGS a.buf, n, shift, mask, mv.buf, km, ne, eb, ecomp, ip, ie, edst, edend, seen, nx, tables, sbase, send, tags, &staged, mvm, &lists
        switch (w) {
        case 2:
#ifdef HAVE_AVX2_SCAN
            if (cpu_avx2 && simd_on) {
                over = cselect_avx2_2(CS_ARGS);
                break;
            }
#endif
            over = cselect_2(CS_ARGS);
            break;
        case 4: over = cselect_4(CS_ARGS); break;
        default: over = cselect_8(CS_ARGS); break;
        }
#undef CS_ARGS
        /* every entry lists exactly its words: guaranteed when the counts
           are those of ref with these movers (every write above is bounded
           by its entry's share of out all the same) */
        if (over)
            err = CS_OUT_OF_RANGE;
        for (size_t x = 0; x < nb; x++)
            counts[x] = (int64_t)tables[x];
        counts[nb] = (int64_t)km;
        uint64_t total = 0;
        for (size_t x = 0; x < ne; x++) {
            int64_t bx = e[3 * x];
            uint64_t n_b = (uint64_t)counts[bx], c = (uint64_t)e[3 * x + 1];
            int r = (int)(e[3 * x + 2] >> 1);
            if (edst[x] != edend[x] || nx[x] != CS_END ||
                (c && (eqmax[x] > (n_b >> r) || elast[x] >= n_b)) || ((e[3 * x + 2] & 1) && c >= n_b))
                err = CS_OUT_OF_RANGE;
            total += (e[3 * x + 2] & 1) ? n_b - c : c;
        }
        if (total != kout || staged != kout - plain)
            err = CS_OUT_OF_RANGE;
        if (!err && any_comp) {
            /* the final order: each entry's share in table order, the
               complemented ones from the staged words (stable: by position) */
            uint32_t *fin = PyMem_RawMalloc(4 * kout + 4);
            if (!fin) {
                err = CS_NO_MEMORY;
            } else {
                const uint32_t *src = out.buf;
                uint32_t *f = fin;
                for (size_t x = 0; x < ne; x++) {
                    int64_t bx = e[3 * x], c = e[3 * x + 1];
                    if (e[3 * x + 2] & 1) {
                        dst[bx] = f;
                        f += counts[bx] - c;
                        dend[bx] = f;
                    } else {
                        memcpy(f, src, 4 * (size_t)c);
                        src += c;
                        f += c;
                    }
                }
                for (size_t y = 0; y < staged && !err; y++) {
                    uint16_t bx = tags[y];
                    if (dst[bx] < dend[bx])
                        *dst[bx]++ = sbase[y];
                    else
                        err = CS_OUT_OF_RANGE;
                }
                if (!err)
                    memcpy(out.buf, fin, 4 * kout);
                PyMem_RawFree(fin);
            }
        }
    }
    Py_END_ALLOW_THREADS
    if (err == CS_NO_MEMORY) {
        PyErr_NoMemory();
        goto done;
    }
    res = PyLong_FromLong(err);
done:
    PyMem_Free(mem);
    PyBuffer_Release(&a);
    PyBuffer_Release(&mv);
    PyBuffer_Release(&entb);
    PyBuffer_Release(&cntb);
    PyBuffer_Release(&un);
    PyBuffer_Release(&rem);
    PyBuffer_Release(&out);
    PyBuffer_Release(&cout);
    return res;
}

/* ---- modular value sections (codec v2) ------------------------------------------
   The value section of MSPARSE, MBITMAP and CSPARSE holds, for the listed
   words, D = new - old mod 2^(8w) as sign bits (MSB first) and the byte
   planes of M = |D| - 1; CDENSE's (dense) the same with M = |D|. */

enum { MV_OK = 0, MV_BAD_MAGNITUDE = 1, MV_WRONG_BUCKET = 2, MV_OUT_OF_RANGE = 3 };
/* the listed words lie in one increasing run per bucket, interleaved: a
   gather the hardware prefetchers do not follow. The word MV_AHEAD places
   on is asked for early (a 4 MiB bf16 chunk at 1%: mod_apply 0.30 -> ? ms) */
#define MV_AHEAD 16

/* mod_values(old, new, word, positions uint32, dense, signs_out, planes_out):
   signs_out gets ceil(k / 8) bytes, planes_out k * word bytes */
static PyObject *mod_values(PyObject *self, PyObject *args)
{
    Py_buffer a, b, pos, sg, pl;
    int w, dense;
    if (!PyArg_ParseTuple(args, "y*y*iy*pw*w*", &a, &b, &w, &pos, &dense, &sg, &pl))
        return NULL;
    PyObject *res = NULL;
    if (check_word(w) < 0)
        goto done;
    size_t n = (size_t)a.len / w, k = (size_t)pos.len / 4;
    if (a.len != b.len || a.len % w || pos.len % 4 || (size_t)sg.len != (k + 7) / 8 || (size_t)pl.len != k * w) {
        PyErr_SetString(PyExc_ValueError, "mod_values: bad buffer sizes");
        goto done;
    }
    const uint32_t *p = pos.buf;
    int inside = 1;
    Py_BEGIN_ALLOW_THREADS
    for (size_t i = 0; i < k; i++)
        inside &= p[i] < n;
    if (inside) {
        const uint8_t *o = a.buf, *nw = b.buf;
        uint8_t *s = sg.buf, *m = pl.buf;
        const int bits = 8 * w;
        const uint64_t full = w == 8 ? ~(uint64_t)0 : (((uint64_t)1 << bits) - 1);
        memset(s, 0, (size_t)sg.len);
        for (size_t i = 0; i < k; i++) {
            if (i + MV_AHEAD < k) {
                PREFETCH(nw + (size_t)p[i + MV_AHEAD] * w, 0);
                PREFETCH(o + (size_t)p[i + MV_AHEAD] * w, 0);
            }
            uint64_t d = (load(nw + (size_t)p[i] * w, w) - load(o + (size_t)p[i] * w, w)) & full;
            uint64_t neg = d >> (bits - 1);
            uint64_t mag = (neg ? (0 - d) & full : d) - (dense ? 0 : 1);
            mag &= full;
            s[i >> 3] |= (uint8_t)(neg << (7 - (i & 7)));
            for (int j = 0; j < w; j++)
                m[(size_t)j * k + i] = (uint8_t)(mag >> (8 * (w - 1 - j)));
        }
    }
    Py_END_ALLOW_THREADS
    if (!inside) {
        PyErr_SetString(PyExc_ValueError, "mod_values: position out of range");
        goto done;
    }
    res = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    PyBuffer_Release(&pos);
    PyBuffer_Release(&sg);
    PyBuffer_Release(&pl);
    return res;
}

/* mod_apply(buf, word, positions uint32 (k, distinct), signs (ceil(k / 8)
   bytes, padding checked by the caller), planes (k * word bytes), shift,
   mask, movers) -> error code. Decodes the value section of k listed
   words (M < 2^(8w-1) each, else 1), checks, when mask is nonzero, that
   exactly the first `movers` of them change bucket (b(old + D) against
   b(old), else 2), and only then adds D to buf's words. Positions must be
   below buf's word count (else 3). Nothing is written unless all holds. */
static PyObject *mod_apply(PyObject *self, PyObject *args)
{
    Py_buffer buf, pos, sg, pl;
    int w, shift;
    unsigned long long mask, km;
    if (!PyArg_ParseTuple(args, "w*iy*y*y*iKK", &buf, &w, &pos, &sg, &pl, &shift, &mask, &km))
        return NULL;
    PyObject *res = NULL;
    if (check_word(w) < 0 || (mask && check_bucket_fn(w, shift, mask) < 0))
        goto done;
    size_t n = (size_t)buf.len / w, k = (size_t)pos.len / 4;
    if (buf.len % w || pos.len % 4 || (size_t)sg.len != (k + 7) / 8 || (size_t)pl.len != k * w || km > k) {
        PyErr_SetString(PyExc_ValueError, "mod_apply: bad buffer sizes");
        goto done;
    }
    int err = MV_OK;
    Py_BEGIN_ALLOW_THREADS
    const uint32_t *p = pos.buf;
    const uint8_t *s = sg.buf, *m = pl.buf;
    uint8_t *d8 = buf.buf;
    const int bits = 8 * w;
    const uint64_t full = w == 8 ? ~(uint64_t)0 : (((uint64_t)1 << bits) - 1);
    int bad_mag = 0, bad_bucket = 0, outside = 0;
    for (size_t i = 0; i < k; i++) {
        uint64_t mag = 0;
        for (int j = 0; j < w; j++)
            mag |= (uint64_t)m[(size_t)j * k + i] << (8 * (w - 1 - j));
        bad_mag |= (int)(mag >> (bits - 1));
        if (p[i] >= n) {
            outside = 1;
            continue;
        }
        if (mask) {
            if (i + MV_AHEAD < k && p[i + MV_AHEAD] < n)
                PREFETCH(d8 + (size_t)p[i + MV_AHEAD] * w, 0);
            uint64_t neg = (s[i >> 3] >> (7 - (i & 7))) & 1;
            uint64_t dv = neg ? (0 - (mag + 1)) & full : mag + 1;
            uint64_t r = load(d8 + (size_t)p[i] * w, w);
            uint64_t moved = ((r >> shift) & mask) != ((((r + dv) & full) >> shift) & mask);
            bad_bucket |= (int)(moved != (uint64_t)(i < km));
        }
    }
    if (outside)
        err = MV_OUT_OF_RANGE;
    else if (bad_mag)
        err = MV_BAD_MAGNITUDE;
    else if (bad_bucket)
        err = MV_WRONG_BUCKET;
    else
        for (size_t i = 0; i < k; i++) {
            uint64_t mag = 0;
            for (int j = 0; j < w; j++)
                mag |= (uint64_t)m[(size_t)j * k + i] << (8 * (w - 1 - j));
            uint64_t neg = (s[i >> 3] >> (7 - (i & 7))) & 1;
            uint64_t dv = neg ? (0 - (mag + 1)) & full : mag + 1;
            uint8_t *at = d8 + (size_t)p[i] * w;
            if (!mask && i + MV_AHEAD < k)
                PREFETCH(d8 + (size_t)p[i + MV_AHEAD] * w, 1);
            store(at, w, (load(at, w) + dv) & full);
        }
    Py_END_ALLOW_THREADS
    res = PyLong_FromLong(err);
done:
    PyBuffer_Release(&buf);
    PyBuffer_Release(&pos);
    PyBuffer_Release(&sg);
    PyBuffer_Release(&pl);
    return res;
}

/* ---- the value coder of codec v2 (format version 3) --------------------------------
   An adaptive binary range coder (the carry-less-cache design of LZMA's)
   over a binarization of each listed word's modular difference: its sign
   (one model for the whole section), whether M = |d| - 1 is 0, whether it
   is 1, then for M >= 2 the bit length L of M in unary and the L - 1 bits
   below its leading one, the first of them modelled per L and the rest at
   one half. The words come in runs (CSPARSE: the movers, then one per
   bucket entry; MSPARSE and MBITMAP: one run), and every run but the sign
   starts from fresh models: within a bucket the scale of a step over the
   rounding spacing is one, so the models learn it in a few hundred words.
   Every rule is in man/wdiff-format.5, "Value section". */

enum { RC_OK = 0, RC_BAD_STREAM = 1 };
#define RC_LIMIT 256 /* the slowest adaptation: 1/RC_LIMIT of the way per bit */
#define RC_PMIN 64
#define RC_MAXL 64

typedef struct {
    uint16_t p; /* P(bit = 0) in units of 2^-16 */
    uint16_t n; /* bits coded so far, up to RC_LIMIT - 2 */
} rc_bit_t;

typedef struct {
    rc_bit_t zero, one, len[RC_MAXL], lead[RC_MAXL];
} rc_model_t;

static uint32_t rc_rate[RC_LIMIT];

static void rc_init_tables(void)
{
    for (int i = 0; i < RC_LIMIT; i++)
        rc_rate[i] = 65536u / (uint32_t)(i + 2 < RC_LIMIT ? i + 2 : RC_LIMIT);
}

static inline void rc_adapt(rc_bit_t *m, int bit)
{
    uint32_t p = m->p, r = rc_rate[m->n];
    uint32_t down = p - ((p * r) >> 16), up = p + (((65536u - p) * r) >> 16);
    p = bit ? down : up;
    p = p < RC_PMIN ? RC_PMIN : p;
    p = p > 65536u - RC_PMIN ? 65536u - RC_PMIN : p;
    m->p = (uint16_t)p;
    m->n += m->n < RC_LIMIT - 2;
}

static void rc_reset(rc_bit_t *m, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        m[i].p = 32768;
        m[i].n = 0;
    }
}

typedef struct {
    uint64_t low;
    uint32_t range;
    uint8_t cache;
    uint64_t pending; /* bytes held back for a carry: the cache and 0xff's */
    uint8_t *buf, *out, *end; /* grows (PyMem_RawRealloc: no GIL needed) */
    int overflow;
} rc_enc_t;

static void rc_grow(rc_enc_t *e)
{
    size_t used = (size_t)(e->out - e->buf), cap = (size_t)(e->end - e->buf) * 2;
    uint8_t *b = PyMem_RawRealloc(e->buf, cap);
    if (b == NULL) {
        e->overflow = 1;
        return;
    }
    e->buf = b;
    e->out = b + used;
    e->end = b + cap;
}

static inline void rc_put(rc_enc_t *e, uint8_t v)
{
    if (e->out == e->end)
        rc_grow(e);
    if (e->out < e->end)
        *e->out++ = v;
}

static inline void rc_shift_low(rc_enc_t *e)
{
    if ((uint32_t)e->low < 0xFF000000u || (e->low >> 32) != 0) {
        uint8_t carry = (uint8_t)(e->low >> 32), v = e->cache;
        do {
            rc_put(e, (uint8_t)(v + carry));
            v = 0xFF;
        } while (--e->pending != 0);
        e->cache = (uint8_t)((uint32_t)e->low >> 24);
    }
    e->pending++;
    e->low = (uint64_t)((uint32_t)e->low << 8);
}

static inline void rc_encode(rc_enc_t *e, uint32_t p, int bit)
{
    uint32_t bound = (e->range >> 16) * p, m = 0u - (uint32_t)(bit != 0);
    e->low += bound & m;
    e->range = ((e->range - bound) & m) | (bound & ~m);
    while (e->range < (1u << 24)) {
        e->range <<= 8;
        rc_shift_low(e);
    }
}

static inline void rc_encode_bit(rc_enc_t *e, rc_bit_t *m, int bit)
{
    rc_encode(e, m->p, bit);
    rc_adapt(m, bit);
}

typedef struct {
    uint32_t range, code;
    const uint8_t *in, *end;
    int overrun;
} rc_dec_t;

static inline uint8_t rc_get(rc_dec_t *d)
{
    if (d->in < d->end)
        return *d->in++;
    d->overrun = 1;
    return 0;
}

static inline int rc_decode(rc_dec_t *d, uint32_t p)
{
    /* branch-free: a sign bit is a coin toss, and a mispredicted branch
       costs more than the arithmetic of both ways */
    uint32_t bound = (d->range >> 16) * p;
    uint32_t bit = d->code >= bound, m = 0u - bit;
    d->code -= bound & m;
    d->range = ((d->range - bound) & m) | (bound & ~m);
    if (d->range < (1u << 24)) {
        d->range <<= 8;
        d->code = (d->code << 8) | rc_get(d);
        if (d->range < (1u << 24)) {
            d->range <<= 8;
            d->code = (d->code << 8) | rc_get(d);
        }
    }
    return (int)bit;
}

static inline int rc_decode_bit(rc_dec_t *d, rc_bit_t *m)
{
    int bit = rc_decode(d, m->p);
    rc_adapt(m, bit);
    return bit;
}

/* the magnitude M (< 2^(bits - 1)) of one word, after its sign */
static inline void rc_put_magnitude(rc_enc_t *e, rc_model_t *m, uint64_t mag, int bits)
{
    rc_encode_bit(e, &m->zero, mag != 0);
    if (mag == 0)
        return;
    rc_encode_bit(e, &m->one, mag != 1);
    if (mag == 1)
        return;
    int L = 64 - __builtin_clzll(mag); /* 2 .. bits - 1 */
    for (int i = 2; i < L; i++)
        rc_encode_bit(e, &m->len[i], 1);
    if (L < bits - 1)
        rc_encode_bit(e, &m->len[L], 0);
    rc_encode_bit(e, &m->lead[L], (int)((mag >> (L - 2)) & 1));
    for (int i = L - 3; i >= 0; i--)
        rc_encode(e, 32768, (int)((mag >> i) & 1));
}

static inline uint64_t rc_get_magnitude(rc_dec_t *d, rc_model_t *m, int bits)
{
    if (!rc_decode_bit(d, &m->zero))
        return 0;
    if (!rc_decode_bit(d, &m->one))
        return 1;
    int L = 2;
    while (L < bits - 1 && rc_decode_bit(d, &m->len[L]))
        L++;
    uint64_t mag = 2 | (uint64_t)rc_decode_bit(d, &m->lead[L]);
    for (int i = L - 3; i >= 0; i--)
        mag = (mag << 1) | (uint64_t)rc_decode(d, 32768);
    return mag;
}

static int check_runs(Py_buffer *runs, size_t k)
{
    if (runs->len % 8) {
        PyErr_SetString(PyExc_ValueError, "value coder: runs must be uint64");
        return -1;
    }
    const uint64_t *r = runs->buf;
    uint64_t total = 0;
    for (size_t i = 0; i < (size_t)runs->len / 8; i++) {
        if (r[i] > k - total) {
            PyErr_SetString(PyExc_ValueError, "value coder: runs do not add up to the word count");
            return -1;
        }
        total += r[i];
    }
    if (total != k) {
        PyErr_SetString(PyExc_ValueError, "value coder: runs do not add up to the word count");
        return -1;
    }
    return 0;
}

/* rc_values_encode(signs (ceil(k / 8) bytes, MSB first), planes (k * word
   bytes: the byte planes of M), word, runs uint64) -> bytes */
static PyObject *rc_values_encode(PyObject *self, PyObject *args)
{
    Py_buffer sg, pl, runs;
    int w;
    if (!PyArg_ParseTuple(args, "y*y*iy*", &sg, &pl, &w, &runs))
        return NULL;
    PyObject *res = NULL;
    uint8_t *buf = NULL;
    if (check_word(w) < 0)
        goto done;
    size_t k = (size_t)pl.len / w;
    if (pl.len % w || (size_t)sg.len != (k + 7) / 8 || check_runs(&runs, k) < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "rc_values_encode: bad buffer sizes");
        goto done;
    }
    size_t cap = k * (size_t)w + 64; /* about what a near-random M costs; it grows */
    buf = PyMem_RawMalloc(cap);
    rc_model_t *m = PyMem_RawMalloc(sizeof(rc_model_t));
    if (buf == NULL || m == NULL) {
        PyMem_RawFree(m);
        PyErr_NoMemory();
        goto done;
    }
    rc_enc_t e = {0, 0xFFFFFFFFu, 0, 1, buf, buf, buf + cap, 0};
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    const uint8_t *s = sg.buf, *pp = pl.buf;
    const uint64_t *r = runs.buf;
    const int bits = 8 * w;
    rc_bit_t sign = {32768, 0};
    size_t i = 0;
    for (size_t run = 0; run < (size_t)runs.len / 8; run++) {
        rc_reset((rc_bit_t *)m, sizeof(rc_model_t) / sizeof(rc_bit_t));
        for (size_t end = i + r[run]; i < end; i++) {
            uint64_t mag = 0;
            for (int j = 0; j < w; j++)
                mag |= (uint64_t)pp[(size_t)j * k + i] << (8 * (w - 1 - j));
            bad |= (int)(mag >> (bits - 1));
            rc_encode_bit(&e, &sign, (s[i >> 3] >> (7 - (i & 7))) & 1);
            rc_put_magnitude(&e, m, mag & ((((uint64_t)1) << (bits - 1)) - 1), bits);
        }
    }
    for (int j = 0; j < 5; j++)
        rc_shift_low(&e);
    Py_END_ALLOW_THREADS
    PyMem_RawFree(m);
    buf = e.buf;
    if (e.overflow)
        PyErr_NoMemory();
    else if (bad)
        PyErr_SetString(PyExc_ValueError, "rc_values_encode: a magnitude is not below 2^(8w-1)");
    else
        res = PyBytes_FromStringAndSize((const char *)buf, e.out - buf);
done:
    PyMem_RawFree(buf);
    PyBuffer_Release(&sg);
    PyBuffer_Release(&pl);
    PyBuffer_Release(&runs);
    return res;
}

/* rc_values_decode(data, word, runs uint64, signs_out (ceil(k / 8)),
   planes_out (k * word)) -> error code: RC_BAD_STREAM unless the first
   byte is 0 and decoding reads the stream exactly to its end */
static PyObject *rc_values_decode(PyObject *self, PyObject *args)
{
    Py_buffer data, runs, sg, pl;
    int w;
    if (!PyArg_ParseTuple(args, "y*iy*w*w*", &data, &w, &runs, &sg, &pl))
        return NULL;
    PyObject *res = NULL;
    if (check_word(w) < 0)
        goto done;
    size_t k = (size_t)pl.len / w;
    if (pl.len % w || (size_t)sg.len != (k + 7) / 8 || check_runs(&runs, k) < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "rc_values_decode: bad buffer sizes");
        goto done;
    }
    rc_model_t *m = PyMem_RawMalloc(sizeof(rc_model_t));
    if (m == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int err = RC_OK;
    Py_BEGIN_ALLOW_THREADS
    const uint8_t *in = data.buf;
    rc_dec_t d = {0xFFFFFFFFu, 0, in, in + data.len, 0};
    if (data.len < 5 || in[0] != 0) {
        err = RC_BAD_STREAM;
    } else {
        d.in = in + 1;
        for (int j = 0; j < 4; j++)
            d.code = (d.code << 8) | rc_get(&d);
        uint8_t *s = sg.buf, *pp = pl.buf;
        const uint64_t *r = runs.buf;
        const int bits = 8 * w;
        rc_bit_t sign = {32768, 0};
        memset(s, 0, (size_t)sg.len);
        size_t i = 0;
        for (size_t run = 0; run < (size_t)runs.len / 8 && !d.overrun; run++) {
            rc_reset((rc_bit_t *)m, sizeof(rc_model_t) / sizeof(rc_bit_t));
            for (size_t end = i + r[run]; i < end; i++) {
                s[i >> 3] |= (uint8_t)(rc_decode_bit(&d, &sign) << (7 - (i & 7)));
                uint64_t mag = rc_get_magnitude(&d, m, bits);
                for (int j = 0; j < w; j++)
                    pp[(size_t)j * k + i] = (uint8_t)(mag >> (8 * (w - 1 - j)));
            }
        }
        if (d.overrun || d.in != d.end || d.code >= d.range)
            err = RC_BAD_STREAM;
    }
    Py_END_ALLOW_THREADS
    PyMem_RawFree(m);
    res = PyLong_FromLong(err);
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&runs);
    PyBuffer_Release(&sg);
    PyBuffer_Release(&pl);
    return res;
}

/* use_simd(on) -> previous: whether the scan may use the AVX2 kernels
   where the CPU has them (for tests of the portable ones) */
static PyObject *use_simd(PyObject *self, PyObject *args)
{
    int on;
    if (!PyArg_ParseTuple(args, "p", &on))
        return NULL;
#ifdef HAVE_AVX2_SCAN
    int was = simd_on;
    simd_on = on;
    return PyBool_FromLong(was && cpu_avx2);
#else
    return Py_NewRef(Py_False);
#endif
}

static PyMethodDef methods[] = {
    {"use_simd", use_simd, METH_VARARGS, "(on) -> whether it was on"},
    {"diff_stats", diff_stats, METH_VARARGS, "(a, b, word, kind, lut, spans) -> [(changed, max_abs, sum_d2, sum_a2)]"},
    {"delta_scan", delta_scan, METH_VARARGS, "(old, new, word, positions_out, values_out) -> k"},
    {"planes", planes, METH_VARARGS, "(src, word, dst) -> None"},
    {"xor_planes", xor_planes, METH_VARARGS, "(old, new, word, dst) -> changed words"},
    {"unplanes", unplanes, METH_VARARGS, "(src, word, dst, xor) -> nonzero words"},
    {"scatter_xor", scatter_xor, METH_VARARGS, "(buf, word, positions, values) -> all values nonzero"},
    {"change_bitmap", change_bitmap, METH_VARARGS, "(old, new, word) -> bytes"},
    {"rice_size", rice_size, METH_VARARGS, "(positions) -> (r, unary bytes, remainder bytes)"},
    {"rice_encode", rice_encode, METH_VARARGS, "(positions) -> (r, unary, remainder)"},
    {"rice_decode", rice_decode, METH_VARARGS, "(r, unary, remainder, k, n, out) -> error code"},
    {"bucket_ranks", bucket_ranks, METH_VARARGS, "(old, new, word, shift, mask, positions, buckets, ranks, counts) -> error"},
    {"bucket_counts", bucket_counts, METH_VARARGS, "(ref, word, shift, mask, movers, counts) -> error"},
    {"bucket_select", bucket_select, METH_VARARGS, "(ref, word, shift, mask, movers, want, offsets, out) -> error"},
    {"mod_values", mod_values, METH_VARARGS, "(old, new, word, positions, dense, signs_out, planes_out) -> None"},
    {"mod_apply", mod_apply, METH_VARARGS, "(buf, word, positions, signs, planes, shift, mask, movers) -> error"},
    {"csparse_encode", csparse_encode, METH_VARARGS, "(old, new, word, shift, mask, positions, listed_out) -> (table, bits)"},
    {"csparse_select", csparse_select, METH_VARARGS,
     "(ref, word, shift, mask, movers, entries, counts, unary, remainder, out, counts_out) -> error"},
    {"rc_values_encode", rc_values_encode, METH_VARARGS, "(signs, planes, word, runs) -> bytes"},
    {"rc_values_decode", rc_values_decode, METH_VARARGS, "(data, word, runs, signs_out, planes_out) -> error"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "wdiff.codec._native", "Single-pass kernels for wdiff (optional).", -1, methods, NULL, NULL, NULL, NULL,
};

/* which of the vector kernels this CPU runs (set at import): "avx512bw",
   "avx2", or "" for the portable loops alone */
static const char *cpu_tier(void)
{
#ifdef HAVE_AVX2_SCAN
    return cpu_avx512bw ? "avx512bw" : cpu_avx2 ? "avx2" : "";
#else
    return "";
#endif
}

PyMODINIT_FUNC PyInit__native(void)
{
#ifdef HAVE_AVX2_SCAN
    __builtin_cpu_init();
    cpu_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi") && __builtin_cpu_supports("popcnt");
    cpu_avx512bw = cpu_avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
    init_pack_tables();
    for (int v = 0; v < 256; v++) {
        unsigned r = 0;
        for (int j = 0; j < 8; j++)
            r |= ((unsigned)v >> j & 1u) << (7 - j);
        reversed[v] = (uint8_t)r;
    }
#endif
    rc_init_tables();
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    const char *features = ""
#ifdef WDIFF_VECTORS
                           "vectors "
#endif
#ifdef HAVE_AVX2_SCAN
                           "avx2-dispatch "
#endif
        ;
    /* the contract with kernels.py, which checks every value at import */
    if (PyModule_AddIntConstant(m, "MAX_RICE", MAX_RICE) < 0 ||
        PyModule_AddIntConstant(m, "MAX_WORDS", (long)UINT32_MAX) < 0 ||
        PyModule_AddIntConstant(m, "F_NONE", F_NONE) < 0 || PyModule_AddIntConstant(m, "F_BF16", F_BF16) < 0 ||
        PyModule_AddIntConstant(m, "F_F32", F_F32) < 0 || PyModule_AddIntConstant(m, "F_F64", F_F64) < 0 ||
        PyModule_AddIntConstant(m, "F_LUT", F_LUT) < 0 ||
        PyModule_AddIntConstant(m, "RICE_BAD_COUNT", RICE_BAD_COUNT) < 0 ||
        PyModule_AddIntConstant(m, "RICE_BAD_REMAINDER_LENGTH", RICE_BAD_REMAINDER_LENGTH) < 0 ||
        PyModule_AddIntConstant(m, "RICE_OUT_OF_RANGE", RICE_OUT_OF_RANGE) < 0 ||
        PyModule_AddIntConstant(m, "RICE_BAD_PADDING", RICE_BAD_PADDING) < 0 ||
        PyModule_AddIntConstant(m, "MAX_BUCKETS", MAX_BUCKETS) < 0 ||
        PyModule_AddIntConstant(m, "CS_BAD_UNARY", CS_BAD_UNARY) < 0 ||
        PyModule_AddIntConstant(m, "CS_BAD_REMAINDER_LENGTH", CS_BAD_REMAINDER_LENGTH) < 0 ||
        PyModule_AddIntConstant(m, "CS_BAD_PADDING", CS_BAD_PADDING) < 0 ||
        PyModule_AddIntConstant(m, "CS_OUT_OF_RANGE", CS_OUT_OF_RANGE) < 0 ||
        PyModule_AddIntConstant(m, "CS_BAD_MOVERS", CS_BAD_MOVERS) < 0 ||
        PyModule_AddIntConstant(m, "MV_BAD_MAGNITUDE", MV_BAD_MAGNITUDE) < 0 ||
        PyModule_AddIntConstant(m, "MV_WRONG_BUCKET", MV_WRONG_BUCKET) < 0 ||
        PyModule_AddIntConstant(m, "MV_OUT_OF_RANGE", MV_OUT_OF_RANGE) < 0 ||
        PyModule_AddIntConstant(m, "RC_BAD_STREAM", RC_BAD_STREAM) < 0 || PyModule_AddIntConstant(m, "RC_LIMIT", RC_LIMIT) < 0 ||
        PyModule_AddStringConstant(m, "FEATURES", features) < 0 ||
        PyModule_AddStringConstant(m, "CPU", cpu_tier()) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
