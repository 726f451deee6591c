/*
 * The modular value sections of codec v2: the value section of MSPARSE,
 * MBITMAP and CSPARSE holds, for the listed words, D = new - old mod
 * 2^(8w) as sign bits (MSB first) and the byte planes of M = |D| - 1;
 * CDENSE's (dense) the same with M = |D|. mod_values writes them,
 * mod_apply checks and adds them. See native.h.
 */
#include "native.h"

/* the listed words lie in one increasing run per bucket, interleaved: a
   gather the hardware prefetchers do not follow. The word MV_AHEAD places
   on is asked for early (a 4 MiB bf16 chunk at 1%: mod_apply 0.30 -> ? ms) */
#define MV_AHEAD 16

/* mod_values(old, new, word, positions uint32, dense, signs_out, planes_out):
   signs_out gets ceil(k / 8) bytes, planes_out k * word bytes */
PyObject *mod_values(PyObject *self, PyObject *args)
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
PyObject *mod_apply(PyObject *self, PyObject *args)
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
