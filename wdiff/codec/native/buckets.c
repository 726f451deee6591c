/*
 * Buckets of base words (codec v2: CSPARSE): bucket(word) = (word >> shift)
 * & mask, at most MAX_BUCKETS buckets; the movers (changed words whose
 * bucket differs between old and new) belong to no bucket and are counted
 * apart. Four interleaved count tables, so that a run of words of one
 * bucket does not wait on one counter. The ranks of changed words within
 * their buckets (bucket_ranks, and the encoder's pass: ranks_words,
 * sranks_words), the counts (bucket_counts, and the decoder's pass:
 * count_words_avx2), and the words of given ranks (bucket_select).
 * See native.h.
 */
#include "native.h"

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

/* g's arrays, twice as long (at most n entries); 0, and g->oom, without the memory */
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

/* ranks_W without a position list: the changed words are found in the same
   pass, sixteen at a time (a block where old and new agree is counted
   straight into the tables), and their positions, buckets and ranks
   written to g's arrays, which grow as needed (to at most n entries: a
   buffer for every word is cleared or faulted in for nothing). Returns k,
   or sets g->oom. One pass over old and new instead of delta_scan's and
   then this one. */
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

uint32_t count_window_2(const uint8_t *ref, size_t n, int shift, uint64_t mask)
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
__attribute__((target("avx2"))) void count_words_avx2(const uint8_t *ref, size_t i, size_t end, int shift,
                                                      uint64_t mask, uint32_t lo, uint32_t *c, uint8_t *tb)
{
    const size_t i0 = i;
    const uint32_t nb = (uint32_t)mask + 1;
    if (mask <= 0xFF && cpu_avx512bw && simd_on >= 2)
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

/* ranks_W, for words of w bytes */
int ranks_words(int w, const uint8_t *old, const uint8_t *new_, size_t n, int shift, uint64_t mask,
                const uint32_t *pos, size_t k, uint16_t *ob, uint32_t *orank, uint32_t *t, uint64_t *dv)
{
    switch (w) {
    case 2: return ranks_2(old, new_, n, shift, mask, pos, k, ob, orank, t, dv);
    case 4: return ranks_4(old, new_, n, shift, mask, pos, k, ob, orank, t, dv);
    default: return ranks_8(old, new_, n, shift, mask, pos, k, ob, orank, t, dv);
    }
}

/* sranks_W, for words of w bytes: two-byte words with AVX2 where the CPU
   has it */
size_t sranks_words(int w, const uint8_t *old, const uint8_t *new_, size_t n, int shift, uint64_t mask, sgrow_t *g,
                    uint32_t *t)
{
    switch (w) {
    case 2:
#ifdef HAVE_AVX2_SCAN
        if (cpu_avx2 && simd_on)
            return sranks_avx2_2(old, new_, n, shift, mask, g, t);
#endif
        return sranks_2(old, new_, n, shift, mask, g, t);
    case 4: return sranks_4(old, new_, n, shift, mask, g, t);
    default: return sranks_8(old, new_, n, shift, mask, g, t);
    }
}

int check_bucket_fn(int w, int shift, unsigned long long mask)
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
PyObject *bucket_ranks(PyObject *self, PyObject *args)
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
    err = ranks_words(w, a.buf, b.buf, n, shift, mask, pos.buf, k, ob.buf, orank.buf, cnt.buf, NULL);
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
PyObject *bucket_counts(PyObject *self, PyObject *args)
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
PyObject *bucket_select(PyObject *self, PyObject *args)
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
