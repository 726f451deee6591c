/*
 * Rice-coded gaps (wdiff-format(5)): the positions of changed words as
 * gaps, each split into a quotient in unary and an r-bit remainder
 * (rice_encode, rice_size, rice_decode), and the pieces codec v2's CSPARSE
 * shares (rice_param, unary_quotients). The bit writer and reader, and
 * put_rice, are in native.h (inline: they are the loops).
 */
#include "native.h"

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
int rice_param(const uint32_t *pos, size_t k, uint64_t *bits)
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
PyObject *rice_encode(PyObject *self, PyObject *args)
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
    put_rice(&u, &rb, p, k, r);
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
PyObject *rice_size(PyObject *self, PyObject *args)
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

/* the quotients of a unary stream (a run of zeros closed by a one, MSB
   first): the first `room` into q (a run beyond 2^32 - 1 is stored as that);
   *ones: how many there are, *last: the byte of the last one, *qmax: the
   largest of the first `room` */
void unary_quotients(const uint8_t *u, size_t len, uint32_t *q, uint64_t room, uint64_t *ones, size_t *last,
                     uint64_t *qmax)
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
PyObject *rice_decode(PyObject *self, PyObject *args)
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

