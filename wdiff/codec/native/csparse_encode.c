/*
 * CSPARSE (codec v2), encoded: csparse_encode codes the changed positions
 * of one chunk, in one pass over the base (the ranks: buckets.c) and one
 * over the changed words, and gives exactly what the numpy twin in
 * conditioned.py gives (tests/test_codec_v2.py checks it). See native.h.
 */
#include "native.h"

static void put_varint(uint8_t **p, uint64_t v)
{
    while (v >= 0x80) {
        *(*p)++ = (uint8_t)((v & 0x7F) | 0x80);
        v >>= 7;
    }
    *(*p)++ = (uint8_t)v;
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
PyObject *csparse_encode(PyObject *self, PyObject *args)
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
        k = sranks_words(w, a.buf, b.buf, n, shift, mask, &g, cnt);
    } else {
        err = ranks_words(w, a.buf, b.buf, n, shift, mask, pos.buf, k, g.ob, g.orank, cnt, g.dv);
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
