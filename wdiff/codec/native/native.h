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
 * which are built. The constants the Python side relies on (the contract
 * below) are exported by module.c and checked by kernels.py at import.
 *
 * One extension, built from every .c file of this folder (setup.py), each
 * file one concern; this header is the only one, and holds what they share:
 *
 *   module.c          the method table, the module and its constants
 *   cpu.c             which vector kernels this CPU runs (found at import)
 *   stats.c           diff statistics (diff_stats)
 *   scan.c            changed words: delta_scan, scatter_xor, change_bitmap
 *   planes.c          byte planes: planes, xor_planes, unplanes
 *   rice.c            Rice-coded gaps: rice_encode, rice_size, rice_decode
 *   buckets.c         codec v2's buckets of base words: bucket_ranks, ...
 *   csparse_encode.c  CSPARSE positions, coded in one pass (codec v2)
 *   csparse_select.c  CSPARSE positions, listed again in one pass
 *   mod_values.c      the modular value sections: mod_values, mod_apply
 *   rangecoder.c      the value coder of codec v2: rc_values_encode, ...
 *
 * Calls between the files run one way (module.c above everything, cpu.c
 * below it): no file calls into one that calls it back.
 */
#ifndef WDIFF_NATIVE_H
#define WDIFF_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

/* ---- the contract with kernels.py --------------------------------------
   module.c exports each of these by name, and kernels.py (CONTRACT) refuses
   an extension whose values differ from its own at import. */

#define MAX_RICE 40 /* the largest Rice parameter either side writes or accepts */
#define MAX_BUCKETS 2048 /* the most buckets of a bucket function (f64: 11 exponent bits) */
#define MAX_WORDS UINT32_MAX /* word counts and positions are below it (uint32 positions) */

/* the float kinds of diff_stats */
enum { F_NONE = 0, F_BF16 = 1, F_F32 = 2, F_F64 = 3, F_LUT = 4 };

/* what rice_decode reports; kernels.RICE_ERRORS holds the messages */
enum { RICE_OK = 0, RICE_BAD_COUNT = 1, RICE_BAD_REMAINDER_LENGTH = 2, RICE_OUT_OF_RANGE = 3, RICE_BAD_PADDING = 4 };

/* what csparse_select reports; conditioned.py holds the messages
   (CS_NO_MEMORY is raised as MemoryError, never returned) */
enum { CS_OK = 0, CS_BAD_UNARY = 1, CS_BAD_REMAINDER_LENGTH = 2, CS_BAD_PADDING = 3, CS_OUT_OF_RANGE = 4,
       CS_BAD_MOVERS = 5, CS_NO_MEMORY = 99 };

/* what mod_apply reports */
enum { MV_OK = 0, MV_BAD_MAGNITUDE = 1, MV_WRONG_BUCKET = 2, MV_OUT_OF_RANGE = 3 };

/* what rc_values_decode reports; the value coder's slowest adaptation */
enum { RC_OK = 0, RC_BAD_STREAM = 1 };
#define RC_LIMIT 256 /* 1/RC_LIMIT of the way per bit */

/* ---- what the compiler offers ------------------------------------------ */

/* WDIFF_PORTABLE=1 builds the portable subset alone, as a compiler without
   GNU C would (tests/test_build.py checks that it compiles and agrees) */
#if (defined(__GNUC__) || defined(__clang__)) && !defined(WDIFF_PORTABLE)
#define WDIFF_VECTORS 1 /* GNU C vector extensions: __attribute__((vector_size)), __builtin_convertvector */
#define WDIFF_BUILTINS 1 /* GNU C bit builtins: __builtin_popcount, __builtin_ctz, __builtin_clzll, ... */
#endif

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && !defined(WDIFF_PORTABLE)
/* one build runs everywhere; AVX2 where the CPU has it */
#define HOT __attribute__((target_clones("avx2", "default")))
#else
#define HOT
#endif

/* AVX2 kernels, chosen at import where the CPU has them (cpu.c) */
#if defined(__GNUC__) && defined(__x86_64__) && !defined(WDIFF_PORTABLE)
#include <immintrin.h>
#define HAVE_AVX2_SCAN 1
#endif

/* a hint that the line holding p is read (rw 0) or written (1) soon; nothing without GNU C */
#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p, rw) __builtin_prefetch((p), (rw))
#else
#define PREFETCH(p, rw) ((void)0)
#endif

/* bit counts, with a loop of their own where the builtins are missing
   (the portable build runs the loops, so the tests hold them to numpy) */
#ifdef WDIFF_BUILTINS
#define POPCOUNT32(m) ((uint32_t)__builtin_popcount(m))
#define CTZ32(m) ((uint32_t)__builtin_ctz(m))
#define BSWAP32(x) __builtin_bswap32(x)
#define BIT_LENGTH64(v) (64 - __builtin_clzll(v))
#else
static inline uint32_t POPCOUNT32(uint32_t m)
{
    uint32_t c = 0;
    for (; m; m &= m - 1)
        c++;
    return c;
}
static inline uint32_t CTZ32(uint32_t m) /* m != 0 */
{
    uint32_t c = 0;
    for (; !(m & 1); m >>= 1)
        c++;
    return c;
}
static inline uint32_t BSWAP32(uint32_t x)
{
    return (x >> 24) | ((x >> 8) & 0xff00u) | ((x << 8) & 0xff0000u) | (x << 24);
}
static inline int BIT_LENGTH64(uint64_t v) /* v != 0 */
{
    int n = 0;
    for (; v; v >>= 1)
        n++;
    return n;
}
#endif

/* the names below are shared by the files of this folder, not exported by
   the module: PyInit__native is its one public symbol */
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC visibility push(hidden)
#endif

/* ---- words ---------------------------------------------------------------- */

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

static inline int check_word(int w)
{
    if (w != 1 && w != 2 && w != 4 && w != 8) {
        PyErr_SetString(PyExc_ValueError, "word must be 1, 2, 4 or 8");
        return -1;
    }
    return 0;
}

/* Visit the words of a and b (n words of W bytes) that may differ: 64
   bytes are compared at once, then each 8-byte piece of a 64-byte run that
   differs; BODY runs for every word of a piece that differs, and for every
   word of the tail, with j (the word's index), x and y (its old and new
   values) in scope. BODY itself tests x != y, with a branch or without.
   (stats.c's compare and scan.c's scan) */
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

#ifdef HAVE_AVX2_SCAN
/* a bit per two-byte word of x and y (16 of them) that differs, word 0
   lowest: the compare's 0xffff per equal word, packed to a byte each
   (scan.c's scan and bitmap, buckets.c's ranks) */
__attribute__((target("avx2"))) static inline unsigned changed_16(__m256i x, __m256i y)
{
    __m256i eq = _mm256_cmpeq_epi16(x, y);
    return ~(unsigned)_mm_movemask_epi8(_mm_packs_epi16(_mm256_castsi256_si128(eq), _mm256_extracti128_si256(eq, 1))) &
           0xffffu;
}
#endif

/* ---- cpu.c: which vector kernels run ------------------------------------ */

#ifdef HAVE_AVX2_SCAN
extern int cpu_avx2, cpu_avx512bw; /* what the CPU has (AVX2 with BMI and POPCNT; AVX-512BW) */
extern int simd_on;                /* which vector kernels may run (use_simd): 0 none, 1 AVX2, 2 all */
void cpu_detect(void);
#endif
const char *cpu_tier(void);

/* ---- rice.c: Rice-coded gaps --------------------------------------------- */

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
        uint32_t x = BSWAP32((uint32_t)(w->acc >> w->n));
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

/* the Rice code of k increasing indices (gaps from -1) at parameter r,
   appended to the unary and remainder writers (inline: out of line, the
   writers' state goes through memory at every put, and rice_encode took a
   fifth longer) */
static inline void put_rice(bitw_t *u, bitw_t *rb, const uint32_t *p, size_t k, int r)
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

int rice_param(const uint32_t *pos, size_t k, uint64_t *bits);
void unary_quotients(const uint8_t *u, size_t len, uint32_t *q, uint64_t room, uint64_t *ones, size_t *last,
                     uint64_t *qmax);

/* ---- buckets.c: buckets of base words (codec v2) ------------------------- */

#define BUCKET_AT(W, p, i, shift, mask) ((uint32_t)((load_##W((p) + (size_t)(i) * (W)) >> (shift)) & (mask)))

static inline uint64_t load_2(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint64_t load_4(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t load_8(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

/* the arrays of the changed words that the scan of sranks_words finds,
   grown as it finds them */
typedef struct {
    uint32_t *pos, *orank;
    uint16_t *ob;
    size_t cap;
    int oom;
    uint64_t *dv; /* new - old of each changed word, as ranks_words's dv */
} sgrow_t;

int check_bucket_fn(int w, int shift, unsigned long long mask);
int ranks_words(int w, const uint8_t *old, const uint8_t *new_, size_t n, int shift, uint64_t mask,
                const uint32_t *pos, size_t k, uint16_t *ob, uint32_t *orank, uint32_t *t, uint64_t *dv);
size_t sranks_words(int w, const uint8_t *old, const uint8_t *new_, size_t n, int shift, uint64_t mask, sgrow_t *g,
                    uint32_t *t);
#ifdef HAVE_AVX2_SCAN
uint32_t count_window_2(const uint8_t *ref, size_t n, int shift, uint64_t mask);
__attribute__((target("avx2"))) void count_words_avx2(const uint8_t *ref, size_t i, size_t end, int shift,
                                                      uint64_t mask, uint32_t lo, uint32_t *c, uint8_t *tb);
#endif

/* ---- the tables made at import ------------------------------------------- */

#ifdef HAVE_AVX2_SCAN
void scan_init_tables(void);
#endif
void rc_init_tables(void);

/* ---- the module's functions (module.c's method table) -------------------- */

PyObject *use_simd(PyObject *self, PyObject *args);
PyObject *diff_stats(PyObject *self, PyObject *args);
PyObject *delta_scan(PyObject *self, PyObject *args);
PyObject *scatter_xor(PyObject *self, PyObject *args);
PyObject *change_bitmap(PyObject *self, PyObject *args);
PyObject *planes(PyObject *self, PyObject *args);
PyObject *xor_planes(PyObject *self, PyObject *args);
PyObject *unplanes(PyObject *self, PyObject *args);
PyObject *rice_encode(PyObject *self, PyObject *args);
PyObject *rice_size(PyObject *self, PyObject *args);
PyObject *rice_decode(PyObject *self, PyObject *args);
PyObject *bucket_ranks(PyObject *self, PyObject *args);
PyObject *bucket_counts(PyObject *self, PyObject *args);
PyObject *bucket_select(PyObject *self, PyObject *args);
PyObject *csparse_encode(PyObject *self, PyObject *args);
PyObject *csparse_select(PyObject *self, PyObject *args);
PyObject *mod_values(PyObject *self, PyObject *args);
PyObject *mod_apply(PyObject *self, PyObject *args);
PyObject *rc_values_encode(PyObject *self, PyObject *args);
PyObject *rc_values_decode(PyObject *self, PyObject *args);

#if defined(__GNUC__) || defined(__clang__)
#pragma GCC visibility pop
#endif

#endif /* WDIFF_NATIVE_H */
