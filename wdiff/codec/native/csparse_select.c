/*
 * CSPARSE (codec v2), decoded: csparse_select lists the changed positions
 * of one chunk again from a record's entries and Rice streams, in one pass
 * over the reference side, and gives exactly what the numpy twin in
 * conditioned.py gives (tests/test_codec_v2.py checks it). See native.h.
 */
#include "native.h"

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
#define DEFINE_CSELECT(NAME, W, ATTR, BLOCK, COUNT, MT, BL, PB, POPC, CTZ, TILE0, LISTMIN)                                                \
    ATTR static int NAME(const uint8_t *ref, size_t n, int shift, uint64_t mask, const uint32_t *mv,   \
                         size_t km, size_t ne, const uint32_t *eb, const uint8_t *ecomp,              \
                         const uint32_t **ip, const uint32_t **ie, uint32_t **dst, uint32_t **dend,   \
                         uint64_t *seen, uint64_t *nx, uint32_t *cnt, uint32_t *sbase, uint32_t *send, \
                         uint16_t *tags, size_t *staged, void *mvmv, cs_lists_t *ls,               \
                         uint8_t *tbuf)                                                         \
    {                                                                                                \
        const uint32_t nb = (uint32_t)mask + 1;                                                      \
        MT *mvm = mvmv; /* a mover mask per block of 1 << BL words, 1 << PB bits a word */            \
        (void)tbuf;                                                                                   \
        uint32_t *c0 = cnt, *c1 = cnt + nb, *c2 = cnt + 2 * nb, *c3 = cnt + 3 * nb;                   \
        int over = 0;                                                                                \
        uint32_t *sp = sbase;                                                                         \
        const uint32_t lo = COUNT_WINDOW(W, ref, n, shift, mask);                                     \
        (void)lo;                                                                                     \
        size_t j = 0, tile = TILE0;                                                                   \
        while (tile < 32 * ne && tile < CS_MAX_TILE) /* many entries: fewer checks */                \
            tile *= 2;                                                                                \
        for (size_t x = 0; x < ne; x++)                                                               \
            nx[x] = ip[x] < ie[x] ? *ip[x]++ : CS_END;                                               \
        for (size_t t0 = 0; t0 < n; t0 += tile) {                                                     \
            const size_t end = n - t0 < tile ? n : t0 + tile, len = end - t0, j0 = j;                 \
            COUNT(t0, end);                                                                           \
            for (; j < km && mv[j] < end; j++) { /* the tile's movers: mv[j0:j] */                   \
                c0[BUCKET_AT(W, ref, mv[j], shift, mask)]--; /* wraps back in the sum */              \
                mvm[(mv[j] - t0) >> BL] |= (MT)1 << (((mv[j] - t0) & ((1u << BL) - 1)) << PB);                         \
            }                                                                                         \
            size_t active = 0;                                                                        \
            for (size_t x = 0; x < ne && active <= LISTMIN; x++) {                                    \
                active += CS_HAS_WORK(x, CS_TOT(eb[x]));                                              \
            }                                                                                         \
            if (active > LISTMIN) {                                                                   \
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
                MT m;                                                                                 \
                CS_LOAD_BLOCK(BLOCK, BL);                                                                 \
                if (!ecomp[x]) {                                                                      \
                    while (nx[x] < tot) {                                                             \
                        const uint64_t want = nx[x];                                                  \
                        for (;;) {                                                                    \
                            uint32_t s = POPC(m);                                                     \
                            if (r + s > want) {                                                       \
                                for (uint64_t t = want - r; t; t--)                                   \
                                    m &= m - 1;                                                       \
                                break;                                                                \
                            }                                                                         \
                            r += s;                                                                   \
                            v += 1u << BL;                                                              \
                            CS_LOAD_BLOCK(BLOCK, BL);                                                     \
                        }                                                                             \
                        if (dst[x] < dend[x])                                                         \
                            *dst[x]++ = (uint32_t)(t0 + v + (CTZ(m) >> PB));                         \
                        else                                                                          \
                            over = 1;                                                                 \
                        m &= m - 1;                                                                   \
                        r = want + 1;                                                                 \
                        nx[x] = ip[x] < ie[x] ? *ip[x]++ : CS_END;                                   \
                    }                                                                                 \
                } else {                                                                              \
                    for (; r < tot; r++) {                                                            \
                        while (!m) {                                                                  \
                            v += 1u << BL;                                                              \
                            CS_LOAD_BLOCK(BLOCK, BL);                                                     \
                        }                                                                             \
                        const size_t at = t0 + v + (CTZ(m) >> PB);                                   \
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
                mvm[(mv[q] - t0) >> BL] = 0;                                                           \
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
#define CS_LOAD_BLOCK(BLOCK, BL)                                                                        \
    do {                                                                                             \
        m = BLOCK(t0 + v, len - v < (1u << BL) ? len - v : (1u << BL), b);                                        \
        if (j > j0)                                                                                  \
            m &= ~mvm[v >> BL];                                                                      \
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
DEFINE_CSELECT(cselect_2, 2, HOT, CS_BLOCK_2, CS_COUNT_2, uint32_t, 4, 1, POPCOUNT32, CTZ32, CS_TILE, CS_LIST_MIN)
DEFINE_CSELECT(cselect_4, 4, HOT, CS_BLOCK_4, CS_COUNT_4, uint32_t, 4, 1, POPCOUNT32, CTZ32, CS_TILE, CS_LIST_MIN)
DEFINE_CSELECT(cselect_8, 8, HOT, CS_BLOCK_8, CS_COUNT_8, uint32_t, 4, 1, POPCOUNT32, CTZ32, CS_TILE, CS_LIST_MIN)
#undef COUNT_WINDOW

#ifdef HAVE_AVX2_SCAN
/* Two-byte words, from the tile's bucket bytes: the pass counts each tile
   with count_words_avx2, which writes every word's bucket less lo to tbuf
   (exact for the window's sixteen buckets, sixteen or more for any other),
   so that a block is one comparison of 32 bytes (AVX2) or 64 (AVX-512BW)
   instead of one of sixteen words, one bit a word; a bucket outside the
   window (a few words of a chunk) is looked up in the words. A 4 MiB bf16
   chunk of the benchmark's 1% step: see the commit. */
#define CS_SPAN 16 /* count_words_avx2's window */
__attribute__((target("avx2,bmi,popcnt"))) static inline uint32_t cs_block_tb32(const uint8_t *ref, const uint8_t *tb,
                                                                                 size_t t0, size_t i, size_t len,
                                                                                 int shift, uint64_t mask,
                                                                                 uint32_t lo, uint32_t b)
{
    uint32_t m = 0;
    if (b - lo < CS_SPAN) {
        const __m256i x = _mm256_loadu_si256((const __m256i *)(tb + (i - t0)));
        m = (uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(x, _mm256_set1_epi8((char)(b - lo))));
        return len < 32 ? m & ((1u << len) - 1) : m;
    }
    if (len == 32) { /* from the words: sixteen lanes twice */
        const __m256i k = _mm256_set1_epi16((short)(mask << shift)), want = _mm256_set1_epi16((short)(b << shift));
        const __m256i e0 = _mm256_cmpeq_epi16(_mm256_and_si256(_mm256_loadu_si256((const __m256i *)(ref + 2 * i)), k), want);
        const __m256i e1 =
            _mm256_cmpeq_epi16(_mm256_and_si256(_mm256_loadu_si256((const __m256i *)(ref + 2 * i + 32)), k), want);
        return (uint32_t)_mm256_movemask_epi8(_mm256_permute4x64_epi64(_mm256_packs_epi16(e0, e1), 0xD8));
    }
    for (size_t u = 0; u < len; u++)
        m |= (uint32_t)(BUCKET_AT(2, ref, i + u, shift, mask) == b) << u;
    return m;
}
__attribute__((target("avx512f,avx512bw,avx2,bmi,popcnt"))) static inline uint64_t cs_block_tb64(
    const uint8_t *ref, const uint8_t *tb, size_t t0, size_t i, size_t len, int shift, uint64_t mask, uint32_t lo,
    uint32_t b)
{
    if (b - lo < CS_SPAN) {
        const __mmask64 keep = len < 64 ? ((uint64_t)1 << len) - 1 : ~(uint64_t)0;
        return _mm512_mask_cmpeq_epi8_mask(keep, _mm512_loadu_si512((const void *)(tb + (i - t0))),
                                           _mm512_set1_epi8((char)(b - lo)));
    }
    /* from the words, 32 lanes twice, loading none past len */
    const __mmask32 k0 = len < 32 ? ((uint32_t)1 << len) - 1 : ~(uint32_t)0;
    const __mmask32 k1 = len <= 32 ? 0 : len < 64 ? ((uint32_t)1 << (len - 32)) - 1 : ~(uint32_t)0;
    const __m512i k = _mm512_set1_epi16((short)(mask << shift)), want = _mm512_set1_epi16((short)(b << shift));
    const uint64_t m0 = _mm512_mask_cmpeq_epi16_mask(k0, _mm512_and_si512(_mm512_maskz_loadu_epi16(k0, ref + 2 * i), k), want);
    const uint64_t m1 =
        _mm512_mask_cmpeq_epi16_mask(k1, _mm512_and_si512(_mm512_maskz_loadu_epi16(k1, ref + 2 * i + 64), k), want);
    return m0 | m1 << 32;
}
#ifndef CS_TILE_TB32
#define CS_TILE_TB32 2048
#define CS_TILE_TB64 4096
#endif
#define CS_LIST_MIN_TB32 (2 * CS_LIST_MIN) /* a block covers twice the words, four times: the same bound */
#define CS_LIST_MIN_TB64 (4 * CS_LIST_MIN)
#define POPCOUNT64(m) ((uint32_t)__builtin_popcountll(m))
#define CTZ64(m) ((uint32_t)__builtin_ctzll(m))
#define CS_BLOCK_TB32(i, len, b) cs_block_tb32(ref, tbuf, t0, (i), (len), shift, mask, lo, (b))
#define CS_BLOCK_TB64(i, len, b) cs_block_tb64(ref, tbuf, t0, (i), (len), shift, mask, lo, (b))
#define CS_COUNT_TB(t0, end) count_words_avx2(ref, (t0), (end), shift, mask, lo, c0, tbuf)
#define COUNT_WINDOW(W, ref, n, shift, mask) count_window_2(ref, n, shift, mask)
DEFINE_CSELECT(cselect_avx2_2, 2, __attribute__((target("avx2,bmi,popcnt"))), CS_BLOCK_TB32, CS_COUNT_TB, uint32_t, 5,
               0, POPCOUNT32, CTZ32, CS_TILE_TB32, CS_LIST_MIN_TB32)
DEFINE_CSELECT(cselect_avx512_2, 2, __attribute__((target("avx512f,avx512bw,avx2,bmi,popcnt"))), CS_BLOCK_TB64,
               CS_COUNT_TB, uint64_t, 6, 0, POPCOUNT64, CTZ64, CS_TILE_TB64, CS_LIST_MIN_TB64)
#undef COUNT_WINDOW
#endif

/* One call's work: the record's entries and what their check summed, the
   scratch (one block, carved), and what each step hands the next. */
typedef struct {
    size_t n, km, nb, ne, kout;    /* words, movers, buckets, entries, listed words (out's length) */
    int fused;                     /* no counts given: the pass counts them */
    const int64_t *e, *cnt;        /* the entries (bucket, c, mode), the counts given */
    uint64_t coded, rbits, plain;  /* coded indices, remainder bits, words of uncomplemented entries */
    int any_comp;                  /* some entry is complemented */
    uint8_t *mem;                  /* the scratch below: */
    uint32_t **dst, **dend;        /*   per bucket: where its staged words go in the final order */
    const uint32_t **ip, **ie;     /*   per entry: its coded indices */
    uint32_t **edst, **edend;      /*   per entry: its share of out */
    uint64_t *seen, *nx;           /*   per entry: its words before the tile, its next coded index */
    uint64_t *elast, *eqmax;       /*   per entry: its last index, its largest quotient */
    uint32_t *tables, *eb, *steps; /*   four count tables, each entry's bucket, the coded indices */
    uint16_t *tags;                /*   the staged words' buckets */
    uint32_t *mvm;                 /*   a mover mask per 16-word block of the largest tile (or 32, 64) */
    uint8_t *tb;                   /*   the bucket bytes of a tile, and 64 more */
    uint8_t *ecomp;                /*   per entry: whether it is complemented */
    cs_lists_t lists;
} selector_t;

/* the entries against the counts (or, fused, the chunk) and out; with
   their totals. -1 with ValueError */
static int check_entries(selector_t *s)
{
    const int64_t *e = s->e, *cnt = s->cnt;
    const size_t n = s->n, km = s->km;
    uint64_t listed = 0;
    for (size_t x = 0; x < s->ne; x++) {
        int64_t bx = e[3 * x], c = e[3 * x + 1], mode = e[3 * x + 2];
        int64_t cap = s->fused ? (int64_t)n : (bx >= 0 && (size_t)bx < s->nb ? cnt[bx] : -1);
        if (bx < 0 || (size_t)bx >= s->nb || (x && bx <= e[3 * (x - 1)]) || c < 0 || mode < 0 ||
            mode > 2 * MAX_RICE + 1 || cap < 0 || cap >= (int64_t)UINT32_MAX || c > cap ||
            ((mode & 1) && !s->fused && c == cap) || (c == 0 && mode != 1)) {
            PyErr_SetString(PyExc_ValueError, "csparse_select: bad entries");
            return -1;
        }
        s->coded += (uint64_t)c;
        s->rbits += (uint64_t)c * (uint64_t)(mode >> 1);
        listed += (mode & 1) ? (uint64_t)(cap - c) : (uint64_t)c;
        s->plain += (mode & 1) ? 0 : (uint64_t)c;
        s->any_comp |= (int)(mode & 1);
    }
    /* the buckets are disjoint: more coded words than the chunk's are not a
       record (and scratch is sized by them) */
    if ((!s->fused && listed != s->kout) || s->plain > s->kout || s->coded > n - (km < n ? km : n)) {
        PyErr_SetString(PyExc_ValueError, "csparse_select: out does not hold the listed words");
        return -1;
    }
    return 0;
}

/* scratch: per bucket dst, dend and four count tables; per entry its
   bucket, pointers to its coded indices and into out (four), the words
   of its bucket before the tile, its next coded index, its last index
   and largest quotient, whether it is complemented; the coded indices
   (coded), the staged words' buckets (kout - plain), a mover mask per
   16-word block of the largest tile. -1 with MemoryError */
static int carve_scratch(selector_t *s)
{
    const size_t nb = s->nb, ne = s->ne;
    s->mem = PyMem_Calloc(1, nb * (2 * sizeof(uint32_t *) + 16) + ne * (4 * sizeof(uint32_t *) + 4 * 8 + 4 + 1) +
                                 4 * (size_t)s->coded + 2 * (s->kout - (size_t)s->plain) + 4 * (CS_MAX_TILE / 16) +
                                 4 * nb + 24 * ne + 4 * CS_MAX_TILE + 64 + CS_MAX_TILE + 64);
    if (!s->mem) {
        PyErr_NoMemory();
        return -1;
    }
    s->dst = (uint32_t **)s->mem, s->dend = s->dst + nb;
    s->ip = (const uint32_t **)(s->dend + nb), s->ie = s->ip + ne;
    s->edst = (uint32_t **)(s->ie + ne), s->edend = s->edst + ne;
    s->seen = (uint64_t *)(s->edend + ne), s->nx = s->seen + ne, s->elast = s->nx + ne, s->eqmax = s->elast + ne;
    s->tables = (uint32_t *)(s->eqmax + ne), s->eb = s->tables + 4 * nb, s->steps = s->eb + ne;
    s->tags = (uint16_t *)(s->steps + s->coded);
    uint64_t *lsp = (uint64_t *)(((uintptr_t)(s->tags + (s->kout - (size_t)s->plain)) + 7) & ~(uintptr_t)7);
    s->lists = (cs_lists_t){NULL, lsp, lsp + ne, lsp + 2 * ne, NULL};
    s->mvm = (uint32_t *)(lsp + 3 * ne);
    s->lists.words = s->mvm + CS_MAX_TILE / 16;
    s->lists.entry = (int32_t *)(s->lists.words + CS_MAX_TILE);
    s->ecomp = (uint8_t *)(s->lists.entry + nb);
    s->tb = s->ecomp + ne;
    return 0;
}

/* the movers increasing below n, and the streams as long as the entries
   say, with zero padding; the quotients, from the unary stream, into steps */
static int check_streams(selector_t *s, const uint32_t *mv, const uint8_t *un, size_t len, const uint8_t *rp,
                         size_t rlen)
{
    int err = CS_OK;
    for (size_t j = 0; j < s->km; j++)
        if (mv[j] >= s->n || (j && mv[j] <= mv[j - 1]))
            err = CS_BAD_MOVERS;
    size_t last = 0;
    uint64_t ones = 0, qtop = 0;
    unary_quotients(un, len, s->steps, s->coded, &ones, &last, &qtop);
    if (err)
        ;
    else if (ones != s->coded || (s->coded && len != last + 1) || (!s->coded && len))
        err = CS_BAD_UNARY;
    else if ((uint64_t)rlen != (s->rbits + 7) / 8)
        err = CS_BAD_REMAINDER_LENGTH;
    else {
        for (uint64_t bt = s->rbits; bt < (uint64_t)rlen * 8; bt++)
            if ((rp[bt >> 3] >> (7 - (bt & 7))) & 1)
                err = CS_BAD_PADDING;
    }
    return err;
}

/* quotients and remainders into the coded indices, entry by entry,
   each checked below n_b */
static int decode_indices(selector_t *s, const uint8_t *rp)
{
    const int64_t *e = s->e;
    bitr_t br = {rp, 0, 0, 0};
    size_t qi = 0;
    for (size_t x = 0; x < s->ne; x++) {
        uint64_t c = (uint64_t)e[3 * x + 1], n_b = s->fused ? (uint64_t)s->n : (uint64_t)s->cnt[e[3 * x]];
        int r = (int)(e[3 * x + 2] >> 1);
        uint64_t prev = (uint64_t)-1;
        for (uint64_t y = 0; y < c; y++, qi++) {
            uint64_t q = s->steps[qi];
            if (q > s->eqmax[x])
                s->eqmax[x] = q;
            if (q > (n_b >> r))
                return CS_OUT_OF_RANGE;
            uint64_t idx = prev + ((q << r) | get_bits(&br, r)) + 1;
            if (idx >= n_b)
                return CS_OUT_OF_RANGE;
            s->steps[qi] = (uint32_t)idx;
            prev = idx;
        }
        s->elast[x] = prev;
    }
    return CS_OK;
}

/* out: first the uncomplemented entries' words, each entry's share in
   table order, then the staged words */
static void lay_out(selector_t *s, uint32_t *out)
{
    const int64_t *e = s->e;
    uint32_t *o = out;
    const uint32_t *sx = s->steps;
    for (size_t x = 0; x < s->ne; x++) {
        int64_t c = e[3 * x + 1];
        s->eb[x] = (uint32_t)e[3 * x];
        s->ecomp[x] = (uint8_t)(e[3 * x + 2] & 1);
        s->edst[x] = o;
        o += s->ecomp[x] ? 0 : c;
        s->edend[x] = o;
        s->ip[x] = sx;
        sx += c;
        s->ie[x] = sx;
    }
    for (size_t b = 0; b < s->nb; b++)
        s->lists.entry[b] = -1;
    for (size_t x = 0; x < s->ne; x++)
        s->lists.entry[s->eb[x]] = (int32_t)x;
}

/* the pass over ref for words of w bytes; nonzero when a write would
   leave an entry's share */
static int run_pass(selector_t *s, const uint8_t *ref, int w, int shift, uint64_t mask, const uint32_t *mv,
                    uint32_t *sbase, uint32_t *send, size_t *staged)
{
#define CS_ARGS ref, s->n, shift, mask, mv, s->km, s->ne, s->eb, s->ecomp, s->ip, s->ie, s->edst, s->edend, s->seen, \
                s->nx, s->tables, sbase, send, s->tags, staged, s->mvm, &s->lists, s->tb
    switch (w) {
    case 2:
#ifdef HAVE_AVX2_SCAN
        if (cpu_avx512bw && simd_on >= 2)
            return cselect_avx512_2(CS_ARGS);
        if (cpu_avx2 && simd_on)
            return cselect_avx2_2(CS_ARGS);
#endif
        return cselect_2(CS_ARGS);
    case 4: return cselect_4(CS_ARGS);
    default: return cselect_8(CS_ARGS);
    }
#undef CS_ARGS
}

/* counts_out from the pass; -1 unless every entry listed exactly its
   words: guaranteed when the counts are those of ref with these movers
   (every write of the pass is bounded by its entry's share of out all the
   same) */
static int check_lists(const selector_t *s, int64_t *counts, size_t staged)
{
    const int64_t *e = s->e;
    int bad = 0;
    for (size_t x = 0; x < s->nb; x++)
        counts[x] = (int64_t)s->tables[x];
    counts[s->nb] = (int64_t)s->km;
    uint64_t total = 0;
    for (size_t x = 0; x < s->ne; x++) {
        int64_t bx = e[3 * x];
        uint64_t n_b = (uint64_t)counts[bx], c = (uint64_t)e[3 * x + 1];
        int r = (int)(e[3 * x + 2] >> 1);
        if (s->edst[x] != s->edend[x] || s->nx[x] != CS_END ||
            (c && (s->eqmax[x] > (n_b >> r) || s->elast[x] >= n_b)) || ((e[3 * x + 2] & 1) && c >= n_b))
            bad = 1;
        total += (e[3 * x + 2] & 1) ? n_b - c : c;
    }
    if (total != s->kout || staged != s->kout - s->plain)
        bad = 1;
    return bad ? -1 : 0;
}

/* the final order: each entry's share in table order, the complemented
   ones from the staged words (stable: by position) */
static int final_order(selector_t *s, uint32_t *out, const uint32_t *sbase, size_t staged, const int64_t *counts)
{
    const int64_t *e = s->e;
    int err = CS_OK;
    uint32_t *fin = PyMem_RawMalloc(4 * s->kout + 4);
    if (!fin)
        return CS_NO_MEMORY;
    const uint32_t *src = out;
    uint32_t *f = fin;
    for (size_t x = 0; x < s->ne; x++) {
        int64_t bx = e[3 * x], c = e[3 * x + 1];
        if (e[3 * x + 2] & 1) {
            s->dst[bx] = f;
            f += counts[bx] - c;
            s->dend[bx] = f;
        } else {
            memcpy(f, src, 4 * (size_t)c);
            src += c;
            f += c;
        }
    }
    for (size_t y = 0; y < staged && !err; y++) {
        uint16_t bx = s->tags[y];
        if (s->dst[bx] < s->dend[bx])
            *s->dst[bx]++ = sbase[y];
        else
            err = CS_OUT_OF_RANGE;
    }
    if (!err)
        memcpy(out, fin, 4 * s->kout);
    PyMem_RawFree(fin);
    return err;
}

/* csparse_select(ref, word, shift, mask, movers uint32, entries int64 (E x 3:
   bucket, c, mode), counts int64 (mask + 1, or empty: fused), unary,
   remainder, out uint32, counts_out int64 (mask + 2)) -> error code.
   The entries and counts are checked by the caller (buckets increasing and
   below mask + 1, c <= n_b, c < n_b when complemented, r <= MAX_RICE, the
   listed total = len(out)); here: the unary stream holds exactly sum(c)
   ones and ends with the last, the remainder stream is exactly its length
   with zero padding, every quotient within n_b >> r and every index below
   n_b. Nothing is written to out unless all of that holds. */
PyObject *csparse_select(PyObject *self, PyObject *args)
{
    Py_buffer a, mv, entb, cntb, un, rem, out, cout;
    int w, shift;
    unsigned long long mask;
    if (!PyArg_ParseTuple(args, "y*iiKy*y*y*y*y*w*w*", &a, &w, &shift, &mask, &mv, &entb, &cntb, &un, &rem, &out,
                          &cout))
        return NULL;
    PyObject *res = NULL;
    selector_t s = {0};
    if (check_bucket_fn(w, shift, mask) < 0)
        goto done;
    s.n = (size_t)a.len / w, s.km = (size_t)mv.len / 4, s.nb = (size_t)mask + 1, s.ne = (size_t)entb.len / 24;
    s.kout = (size_t)out.len / 4;
    /* no counts: they are not known yet (fused: the pass counts them, into
       counts_out, and the bounds that need them are checked after it) */
    s.fused = cntb.len == 0;
    if (a.len % w || s.n >= UINT32_MAX || mv.len % 4 || entb.len % 24 || s.ne > s.nb ||
        (!s.fused && (size_t)cntb.len != 8 * s.nb) || out.len % 4 || (size_t)cout.len != 8 * (s.nb + 1)) {
        PyErr_SetString(PyExc_ValueError, "csparse_select: bad buffer sizes");
        goto done;
    }
    s.e = entb.buf, s.cnt = cntb.buf;
    if (check_entries(&s) < 0 || carve_scratch(&s) < 0)
        goto done;
    int64_t *counts = cout.buf;
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = check_streams(&s, mv.buf, un.buf, (size_t)un.len, rem.buf, (size_t)rem.len);
    if (!err)
        err = decode_indices(&s, rem.buf);
    if (!err) {
        size_t staged = 0;
        uint32_t *sbase = (uint32_t *)out.buf + s.plain, *send = (uint32_t *)out.buf + s.kout;
        lay_out(&s, out.buf);
        if (run_pass(&s, a.buf, w, shift, mask, mv.buf, sbase, send, &staged))
            err = CS_OUT_OF_RANGE;
        if (check_lists(&s, counts, staged) < 0)
            err = CS_OUT_OF_RANGE;
        if (!err && s.any_comp)
            err = final_order(&s, out.buf, sbase, staged, counts);
    }
    Py_END_ALLOW_THREADS
    if (err == CS_NO_MEMORY) {
        PyErr_NoMemory();
        goto done;
    }
    res = PyLong_FromLong(err);
done:
    PyMem_Free(s.mem);
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
