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
                            uint32_t s = POPCOUNT32(m);                                               \
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
                            *dst[x]++ = (uint32_t)(t0 + v + (CTZ32(m) >> 1));                         \
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
                        const size_t at = t0 + v + (CTZ32(m) >> 1);                                   \
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
PyObject *csparse_select(PyObject *self, PyObject *args)
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
