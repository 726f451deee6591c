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
 */
#include "native.h"

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
static inline uint32_t rc_adapt_slowest(uint32_t p, int bit)
{
    uint32_t mk = 0u - (uint32_t)(bit != 0);
    return ((p - (p >> 8)) & mk) | ((p + ((65536u - p) >> 8)) & ~mk);
}

/* after bit: p moves 1/(n + 2) of the way to it, 1/RC_LIMIT at the
   slowest; both ways kept by a mask, as above */
static inline void rc_adapt(rc_bit_t *m, int bit)
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
    int L = BIT_LENGTH64(mag); /* 2 .. bits - 1 */
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
PyObject *rc_values_encode(PyObject *self, PyObject *args)
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
