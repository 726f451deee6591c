/*
 * Byte planes: plane j of n words holds byte (w - 1 - j) of every word,
 * most significant first (planes, xor_planes), and words are rebuilt from
 * them (unplanes). See native.h.
 */
#include "native.h"

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
PyObject *planes(PyObject *self, PyObject *args)
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
PyObject *xor_planes(PyObject *self, PyObject *args)
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

PyObject *unplanes(PyObject *self, PyObject *args)
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
