/*
 * The value coder of codec v2 (format version 3): an adaptive binary range
 * coder (the carry-less-cache design of LZMA's) over a binarization of
 * each listed word's modular difference: its sign (one model for the whole
 * section), whether M = |d| - 1 is 0, whether it is 1, then for M >= 2 the
 * bit length L of M in unary and the L - 1 bits below its leading one, the
 * first of them modelled per L and the rest at one half. The words come in
 * runs (CSPARSE: the movers, then one per bucket entry; MSPARSE and
 * MBITMAP: one run), and every run but the sign starts from fresh models:
 * within a bucket the scale of a step over the rounding spacing is one, so
 * the models learn it in a few hundred words. Every rule is in
 * man/wdiff-format.5, "Value section"; wdiff/codec/rangecoder.py is the
 * twin in Python. See native.h.
 *
 * Speed: each bit's range waits on the bit before (a shift, a multiply
 * and a select, 6 or 7 cycles), so the loops keep the coder's state and
 * the sign, zero and one models in registers (locals that no call takes
 * the address of: a byte stored through a pointer may alias anything in
 * memory, and state there is stored and reloaded around every bit), choose
 * by mask or cmov wherever a bit is a coin toss, and are compiled once per
 * word size. A run's words are coded by a second loop once the sign and
 * zero models have reached their slowest rate (their 255th bit), where
 * adapting is a shift and no count is kept. What is left is the branch on
 * each word's magnitude, mispredicted as often as M is not 0.
 */
#include "native.h"

#define RC_PMIN 64
#define RC_MAXL 64

/* the loops are written as functions of the word size, inlined into one
   copy per size; the portable build leaves it to the compiler */
#if (defined(__GNUC__) || defined(__clang__)) && !defined(WDIFF_PORTABLE)
#define RC_INLINE static inline __attribute__((always_inline))
#else
#define RC_INLINE static inline
#endif

/* x86-64 with GNU C asm flag outputs: the range update by cmov (below) */
#if defined(__GNUC__) && defined(__x86_64__) && defined(__GCC_ASM_FLAG_OUTPUTS__) && !defined(WDIFF_PORTABLE)
#define RC_CMOV 1
#endif

typedef struct {
    uint16_t p; /* P(bit = 0) in units of 2^-16 */
    uint16_t n; /* bits coded so far, up to RC_LIMIT - 2 */
} rc_bit_t;

/* a run's models but the zero and one models, which the loops hold in
   locals, as they do the sign's */
typedef struct {
    rc_bit_t len[RC_MAXL], lead[RC_MAXL];
} rc_model_t;

static uint32_t rc_rate[RC_LIMIT];

void rc_init_tables(void)
{
    for (int i = 0; i < RC_LIMIT; i++)
        rc_rate[i] = 65536u / (uint32_t)(i + 2 < RC_LIMIT ? i + 2 : RC_LIMIT);
}

/* p after a model's bit at its slowest rate, n = RC_LIMIT - 2: the rate is
   65536 / RC_LIMIT = 256, so (p * r) >> 16 is p >> 8, and no clamp can
   bite (p - floor(p / 256) >= 64 for p >= 64, and the same holds for
   65536 - p on the way up). Both ways are computed and one kept by a
   mask: a branch on a sign bit is a coin toss. */
RC_INLINE uint32_t rc_adapt_slowest(uint32_t p, int bit)
{
    uint32_t mk = 0u - (uint32_t)(bit != 0);
    return ((p - (p >> 8)) & mk) | ((p + ((65536u - p) >> 8)) & ~mk);
}

/* the same p for the encoder, whose bit is known well before p is: fewer
   operations after p (p + floor((65536 - p) / 256) = p + 256 - ceil(p / 256)) */
RC_INLINE uint32_t rc_adapt_slowest_known(uint32_t p, int bit)
{
    uint32_t m0 = (uint32_t)(bit != 0) - 1u; /* all ones for a 0 */
    return p - ((p + (255u & m0)) >> 8) + (256u & m0);
}

/* after bit: p moves 1/(n + 2) of the way to it, 1/RC_LIMIT at the
   slowest; both ways kept by a mask, as above */
RC_INLINE void rc_adapt(rc_bit_t *m, int bit)
{
    if (m->n == RC_LIMIT - 2) {
        m->p = (uint16_t)rc_adapt_slowest(m->p, bit);
        return;
    }
    uint32_t p = m->p, r = rc_rate[m->n], mk = 0u - (uint32_t)(bit != 0);
    uint32_t down = p - ((p * r) >> 16), up = p + (((65536u - p) * r) >> 16);
    p = (down & mk) | (up & ~mk);
    p = p < RC_PMIN ? RC_PMIN : p;
    p = p > 65536u - RC_PMIN ? 65536u - RC_PMIN : p;
    m->p = (uint16_t)p;
    m->n++;
}

static void rc_reset(rc_bit_t *m, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        m[i].p = 32768;
        m[i].n = 0;
    }
}

/* the encoder's state; the loop makes room before each word for all it
   can write, so that writing a byte needs no check and no call */
typedef struct {
    uint64_t low;
    uint32_t range;
    uint8_t cache;
    uint64_t pending; /* bytes held back for a carry: the cache and 0xff's */
    uint8_t *out;
} rc_enc_t;

/* what a word can write besides the bytes held back: a byte per shift, two
   shifts a bit at most (a bit leaves range >= 2^14: p >= RC_PMIN), and
   2 * (8w - 1) bits a word */
#define RC_ROOM 256

RC_INLINE void rc_shift_low(rc_enc_t *e)
{
    if ((uint32_t)e->low < 0xFF000000u || (e->low >> 32) != 0) {
        uint8_t carry = (uint8_t)(e->low >> 32), v = e->cache;
        do {
            *e->out++ = (uint8_t)(v + carry);
            v = 0xFF;
        } while (--e->pending != 0);
        e->cache = (uint8_t)((uint32_t)e->low >> 24);
    }
    e->pending++;
    e->low = (uint64_t)((uint32_t)e->low << 8);
}

RC_INLINE void rc_encode(rc_enc_t *e, uint32_t p, int bit)
{
    uint32_t bound = (e->range >> 16) * p, m = 0u - (uint32_t)(bit != 0);
    e->low += bound & m;
#ifdef RC_CMOV
    /* range - bound, or bound for a 0: one cmov after the subtraction,
       where the masks take two steps (a ternary in C is no faster) */
    uint32_t range = e->range - bound;
    __asm__("testl %[m], %[m]\n\t"
            "cmovzl %[b], %[r]"
            : [r] "+&r"(range)
            : [b] "r"(bound), [m] "r"(m)
            : "cc");
    e->range = range;
#else
    e->range = ((e->range - bound) & m) | (bound & ~m);
#endif
    while (e->range < (1u << 24)) {
        e->range <<= 8;
        rc_shift_low(e);
    }
}

RC_INLINE void rc_encode_bit(rc_enc_t *e, rc_bit_t *m, int bit)
{
    rc_encode(e, m->p, bit);
    if (m->n == RC_LIMIT - 2)
        m->p = (uint16_t)rc_adapt_slowest_known(m->p, bit);
    else
        rc_adapt(m, bit);
}

typedef struct {
    uint32_t range, code;
    const uint8_t *in, *end;
    int overrun;
} rc_dec_t;

RC_INLINE uint8_t rc_get(rc_dec_t *d)
{
    if (d->in < d->end)
        return *d->in++;
    d->overrun = 1;
    return 0;
}

RC_INLINE int rc_decode(rc_dec_t *d, uint32_t p)
{
    /* branch-free: a sign bit is a coin toss, and a mispredicted branch
       costs more than the arithmetic of both ways */
    uint32_t bound = (d->range >> 16) * p;
#ifdef RC_CMOV
    /* two cmovs on the compare's flags, where the masks take three more
       operations after it (and GCC, left to itself, makes a select on a
       bit that is branched on after a branch) */
    uint32_t range = d->range - bound, code = d->code - bound, bit;
    __asm__("cmpl %[b], %[c0]\n\t"
            "cmovbl %[b], %[r]\n\t"
            "cmovbl %[c0], %[c]"
            : [r] "+&r"(range), [c] "+&r"(code), "=@ccae"(bit)
            : [b] "r"(bound), [c0] "r"(d->code));
    d->range = range;
    d->code = code;
#else
    uint32_t bit = d->code >= bound, m = 0u - bit;
    d->code -= bound & m;
    d->range = ((d->range - bound) & m) | (bound & ~m);
#endif
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

RC_INLINE int rc_decode_bit(rc_dec_t *d, rc_bit_t *m)
{
    int bit = rc_decode(d, m->p);
    rc_adapt(m, bit);
    return bit;
}

/* a magnitude M >= 1 (< 2^(bits - 1)) after its zero bit */
RC_INLINE void rc_put_nonzero(rc_enc_t *e, rc_bit_t *one, rc_model_t *m, uint64_t mag, int bits)
{
    rc_encode_bit(e, one, mag != 1);
    if (mag == 1)
        return;
    int L = BIT_LENGTH64(mag); /* 2 .. bits - 1 */
    for (int i = 2; i < L; i++)
        rc_encode_bit(e, &m->len[i], 1);
    if (L < bits - 1)
        rc_encode_bit(e, &m->len[L], 0);
    rc_encode_bit(e, &m->lead[L], (int)((mag >> (L - 2)) & 1));
    for (int i = L - 3; i >= 0; i--)
        rc_encode(e, 32768, (int)((mag >> i) & 1));
}

/* M >= 2 after its one bit: its bit length and bits */
RC_INLINE uint64_t rc_get_long(rc_dec_t *d, rc_model_t *m, int bits)
{
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

/* the encoder's buffer (PyMem_RawRealloc: no GIL needed) and, at the
   end, the stream's length */
typedef struct {
    uint8_t *buf, *end;
    size_t len;
} rc_buf_t;

/* room in b for need more bytes after its first used; -1 when it cannot
   grow (b is then as it was) */
static int rc_grow(rc_buf_t *b, size_t used, size_t need)
{
    size_t cap = (size_t)(b->end - b->buf);
    while (cap - used < need)
        cap *= 2;
    uint8_t *nb = PyMem_RawRealloc(b->buf, cap);
    if (nb == NULL)
        return -1;
    b->buf = nb;
    b->end = nb + cap;
    return 0;
}

/* room for need bytes after e->out (end: b->end, in a local); the call
   out of the loop only where the buffer must grow */
RC_INLINE int rc_room(rc_buf_t *b, rc_enc_t *e, uint8_t **end, size_t need)
{
    if ((size_t)(*end - e->out) >= need)
        return 0;
    size_t used = (size_t)(e->out - b->buf);
    if (rc_grow(b, used, need) < 0)
        return -1;
    e->out = b->buf + used;
    *end = b->end;
    return 0;
}

/* word i of the k in byte planes pp (most significant plane first) */
RC_INLINE uint64_t rc_word(const uint8_t *pp, size_t k, size_t i, const int w)
{
    uint64_t v = 0;
    for (int j = 0; j < w; j++)
        v |= (uint64_t)pp[(size_t)j * k + i] << (8 * (w - 1 - j));
    return v;
}

/* The stream of the k words of w bytes (w a constant where it is called)
   in b->buf, its length in b->len; -1 when the buffer could not grow, else
   whether a magnitude was 2^(8w - 1) or more. */
RC_INLINE int rc_encode_words(rc_buf_t *b, const uint8_t *s, const uint8_t *pp, size_t k, const uint64_t *r,
                              size_t nruns, const int w)
{
    const int bits = 8 * w;
    const uint64_t below = ((uint64_t)1 << (bits - 1)) - 1;
    rc_enc_t e = {0, 0xFFFFFFFFu, 0, 1, b->buf};
    uint8_t *end = b->end;
    rc_model_t m;
    rc_bit_t sign = {32768, 0}, zero, one;
    uint64_t all = 0;
    unsigned sb = 0; /* the signs, MSB first, a byte at a time */
    size_t i = 0;
    for (size_t run = 0; run < nruns; run++) {
        rc_reset((rc_bit_t *)&m, sizeof(rc_model_t) / sizeof(rc_bit_t));
        rc_reset(&zero, 1);
        rc_reset(&one, 1);
        size_t stop = i + r[run];
        for (; i < stop && (sign.n < RC_LIMIT - 2 || zero.n < RC_LIMIT - 2); i++) {
            if (rc_room(b, &e, &end, e.pending + RC_ROOM) < 0)
                return -1;
            uint64_t mag = rc_word(pp, k, i, w);
            all |= mag;
            mag &= below;
            if ((i & 7) == 0)
                sb = s[i >> 3];
            rc_encode_bit(&e, &sign, (sb >> 7) & 1);
            sb <<= 1;
            rc_encode_bit(&e, &zero, mag != 0);
            if (mag != 0)
                rc_put_nonzero(&e, &one, &m, mag, bits);
        }
        /* the sign and zero models at their slowest rate: p alone */
        uint32_t sp = sign.p, zp = zero.p;
        for (; i < stop; i++) {
            if (rc_room(b, &e, &end, e.pending + RC_ROOM) < 0)
                return -1;
            uint64_t mag = rc_word(pp, k, i, w);
            all |= mag;
            mag &= below;
            if ((i & 7) == 0)
                sb = s[i >> 3];
            int bit = (sb >> 7) & 1;
            sb <<= 1;
            rc_encode(&e, sp, bit);
            sp = rc_adapt_slowest_known(sp, bit);
            rc_encode(&e, zp, mag != 0);
            zp = rc_adapt_slowest_known(zp, mag != 0);
            if (mag != 0)
                rc_put_nonzero(&e, &one, &m, mag, bits);
        }
        sign.p = (uint16_t)sp;
        zero.p = (uint16_t)zp;
    }
    if (rc_room(b, &e, &end, e.pending + 5) < 0)
        return -1;
    for (int j = 0; j < 5; j++)
        rc_shift_low(&e);
    b->len = (size_t)(e.out - b->buf);
    return (int)(all >> (bits - 1));
}

#define DEFINE_RC_ENCODE(W)                                                                                  \
    static int rc_encode_##W(rc_buf_t *b, const uint8_t *s, const uint8_t *pp, size_t k, const uint64_t *r, \
                             size_t nruns)                                                                   \
    {                                                                                                        \
        return rc_encode_words(b, s, pp, k, r, nruns, W);                                                    \
    }
DEFINE_RC_ENCODE(1)
DEFINE_RC_ENCODE(2)
DEFINE_RC_ENCODE(4)
DEFINE_RC_ENCODE(8)

/* rc_values_encode(signs (ceil(k / 8) bytes, MSB first), planes (k * word
   bytes: the byte planes of M), word, runs uint64) -> bytes */
PyObject *rc_values_encode(PyObject *self, PyObject *args)
{
    Py_buffer sg, pl, runs;
    int w;
    if (!PyArg_ParseTuple(args, "y*y*iy*", &sg, &pl, &w, &runs))
        return NULL;
    PyObject *res = NULL;
    rc_buf_t b = {NULL, NULL, 0};
    if (check_word(w) < 0)
        goto done;
    size_t k = (size_t)pl.len / w;
    if (pl.len % w || (size_t)sg.len != (k + 7) / 8 || check_runs(&runs, k) < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "rc_values_encode: bad buffer sizes");
        goto done;
    }
    size_t cap = k * (size_t)w + 64; /* about what a near-random M costs; it grows */
    b.buf = PyMem_RawMalloc(cap);
    if (b.buf == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    b.end = b.buf + cap;
    int got;
    Py_BEGIN_ALLOW_THREADS
    const uint8_t *s = sg.buf, *pp = pl.buf;
    const uint64_t *r = runs.buf;
    size_t nr = (size_t)runs.len / 8;
    switch (w) {
    case 1: got = rc_encode_1(&b, s, pp, k, r, nr); break;
    case 2: got = rc_encode_2(&b, s, pp, k, r, nr); break;
    case 4: got = rc_encode_4(&b, s, pp, k, r, nr); break;
    default: got = rc_encode_8(&b, s, pp, k, r, nr); break;
    }
    Py_END_ALLOW_THREADS
    if (got < 0)
        PyErr_NoMemory();
    else if (got)
        PyErr_SetString(PyExc_ValueError, "rc_values_encode: a magnitude is not below 2^(8w-1)");
    else
        res = PyBytes_FromStringAndSize((const char *)b.buf, (Py_ssize_t)b.len);
done:
    PyMem_RawFree(b.buf);
    PyBuffer_Release(&sg);
    PyBuffer_Release(&pl);
    PyBuffer_Release(&runs);
    return res;
}

/* The k words of w bytes (a constant where it is called) into the signs
   (zeroed) and the planes; the state is copied into a local, which stays
   in registers where *dp would not (the planes are written through byte
   pointers). */
RC_INLINE void rc_decode_words(rc_dec_t *dp, uint8_t *s, uint8_t *pp, size_t k, const uint64_t *r, size_t nruns,
                               const int w)
{
    const int bits = 8 * w;
    rc_dec_t dl = *dp, *d = &dl;
    rc_model_t m;
    rc_bit_t sign = {32768, 0}, zero, one;
    size_t i = 0;
    for (size_t run = 0; run < nruns && !d->overrun; run++) {
        rc_reset((rc_bit_t *)&m, sizeof(rc_model_t) / sizeof(rc_bit_t));
        rc_reset(&zero, 1);
        rc_reset(&one, 1);
        size_t stop = i + r[run];
        for (; i < stop && (sign.n < RC_LIMIT - 2 || zero.n < RC_LIMIT - 2); i++) {
            s[i >> 3] |= (uint8_t)(rc_decode_bit(d, &sign) << (7 - (i & 7)));
            uint64_t mag = 0;
            if (rc_decode_bit(d, &zero))
                mag = rc_decode_bit(d, &one) ? rc_get_long(d, &m, bits) : 1;
            for (int j = 0; j < w; j++)
                pp[(size_t)j * k + i] = (uint8_t)(mag >> (8 * (w - 1 - j)));
        }
        /* the sign and zero models at their slowest rate: p alone */
        uint32_t sp = sign.p, zp = zero.p;
        for (; i < stop; i++) {
            int bit = rc_decode(d, sp);
            sp = rc_adapt_slowest(sp, bit);
            s[i >> 3] |= (uint8_t)(bit << (7 - (i & 7)));
            uint64_t mag = 0;
            bit = rc_decode(d, zp);
            zp = rc_adapt_slowest(zp, bit);
            if (bit)
                mag = rc_decode_bit(d, &one) ? rc_get_long(d, &m, bits) : 1;
            for (int j = 0; j < w; j++)
                pp[(size_t)j * k + i] = (uint8_t)(mag >> (8 * (w - 1 - j)));
        }
        sign.p = (uint16_t)sp;
        zero.p = (uint16_t)zp;
    }
    *dp = dl;
}

#define DEFINE_RC_DECODE(W)                                                                                    \
    static void rc_decode_##W(rc_dec_t *d, uint8_t *s, uint8_t *pp, size_t k, const uint64_t *r, size_t nruns) \
    {                                                                                                          \
        rc_decode_words(d, s, pp, k, r, nruns, W);                                                             \
    }
DEFINE_RC_DECODE(1)
DEFINE_RC_DECODE(2)
DEFINE_RC_DECODE(4)
DEFINE_RC_DECODE(8)

/* rc_values_decode(data, word, runs uint64, signs_out (ceil(k / 8)),
   planes_out (k * word)) -> error code: RC_BAD_STREAM unless the first
   byte is 0 and decoding reads the stream exactly to its end */
PyObject *rc_values_decode(PyObject *self, PyObject *args)
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
        size_t nr = (size_t)runs.len / 8;
        memset(s, 0, (size_t)sg.len);
        switch (w) {
        case 1: rc_decode_1(&d, s, pp, k, r, nr); break;
        case 2: rc_decode_2(&d, s, pp, k, r, nr); break;
        case 4: rc_decode_4(&d, s, pp, k, r, nr); break;
        default: rc_decode_8(&d, s, pp, k, r, nr); break;
        }
        if (d.overrun || d.in != d.end || d.code >= d.range)
            err = RC_BAD_STREAM;
    }
    Py_END_ALLOW_THREADS
    res = PyLong_FromLong(err);
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&runs);
    PyBuffer_Release(&sg);
    PyBuffer_Release(&pl);
    return res;
}
