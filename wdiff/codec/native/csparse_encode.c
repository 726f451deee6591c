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

/* One call's work: the chunk, the scratch, and what each step hands the
   next (ranks, then the listed order, then the entries, then the bytes). */
typedef struct {
    int w, shift;
    uint64_t mask;
    size_t n, k, nb;          /* words, changed words, buckets */
    uint8_t *mem;             /* the scratch below, in one block: */
    uint32_t *cnt;            /*   counts (4 nb + 1): each bucket's non-mover words, then the movers */
    uint64_t *start;          /*   nb + 1: where each bucket's run of listed words ends */
    centry_t *ent;            /*   an entry per bucket with changed words */
    sgrow_t g;                /* per changed word: bucket, rank, new - old (scanning: position) */
    const uint32_t *pos;      /* the changed positions, increasing */
    uint32_t *listed;         /* out: the positions in the listed order */
    uint8_t *signs, *planes;  /* out: what mod_values gives for them, in that order */
    uint32_t *srank;          /* the ranks in the listed order */
    uint32_t *coded;          /* room for the largest complement */
    size_t km, ne;            /* movers, entries */
    int r_m;                  /* the movers' Rice parameter */
    uint64_t mbits;           /* the movers' bits, unary and remainder */
    uint64_t ubits, rbits;    /* the entries' unary bits and remainder bits */
} encoder_t;

/* scratch: counts (4 nb + 1), bucket starts (nb + 1), entries (nb); per
   changed word: bucket, rank (grown as the scan finds them) and new - old.
   -1 with MemoryError. */
static int scratch(encoder_t *e, int scan)
{
    size_t cnt_n = 4 * e->nb + 1;
    size_t need = 4 * cnt_n + 8 * (e->nb + 1) + sizeof(centry_t) * e->nb + 64;
    e->mem = PyMem_Calloc(1, need);
    e->g.cap = scan ? (e->n >> 6) + 256 : e->k;
    if (e->g.cap > e->n && scan)
        e->g.cap = e->n;
    e->g.pos = scan ? PyMem_RawMalloc(4 * e->g.cap + 4) : NULL;
    e->g.orank = PyMem_RawMalloc(4 * e->g.cap + 4);
    e->g.ob = PyMem_RawMalloc(2 * e->g.cap + 2);
    e->g.dv = PyMem_RawMalloc(8 * e->g.cap + 8);
    if (!e->mem || (scan && !e->g.pos) || !e->g.orank || !e->g.ob || !e->g.dv) {
        PyErr_NoMemory();
        return -1;
    }
    e->cnt = (uint32_t *)e->mem;
    e->start = (uint64_t *)(e->mem + ((4 * cnt_n + 7) & ~(size_t)7));
    e->ent = (centry_t *)(e->start + e->nb + 1);
    return 0;
}

/* the changed words in the listed order (movers, then bucket by bucket,
   each in position order: a stable counting sort), with their ranks, and
   as mod_values writes them: the sign, and the magnitude less one, as
   planes */
static void list_by_bucket(encoder_t *e)
{
    const size_t k = e->k, nb = e->nb;
    const int w = e->w;
    const uint16_t *ob = e->g.ob;
    const uint32_t *orank = e->g.orank;
    uint64_t *start = e->start;
    e->km = e->cnt[nb];
    for (size_t i = 0; i < k; i++)
        if (ob[i] != nb)
            start[ob[i] + 1]++;
    start[0] = e->km;
    for (size_t x = 0; x < nb; x++)
        start[x + 1] += start[x];
    size_t mi = 0;
    uint8_t *sgn = e->signs, *mp = e->planes;
    const int bits = 8 * w;
    const uint64_t full = w == 8 ? ~(uint64_t)0 : (((uint64_t)1 << bits) - 1);
    memset(sgn, 0, (k + 7) / 8);
    for (size_t i = 0; i < k; i++) {
        uint64_t at;
        if (ob[i] == nb) {
            at = mi++;
        } else {
            at = start[ob[i]]++;
            e->srank[at] = orank[i];
        }
        e->listed[at] = e->pos[i];
        uint64_t d = e->g.dv[i];
        uint64_t neg = d >> (bits - 1), mag = ((neg ? (0 - d) & full : d) - 1) & full;
        sgn[at >> 3] |= (uint8_t)(neg << (7 - (at & 7)));
        for (int j = 0; j < w; j++)
            mp[(size_t)j * k + at] = (uint8_t)(mag >> (8 * (w - 1 - j)));
    }
}

/* the Rice parameters: the movers', and an entry per bucket with changed
   words (its ranks, or their complement where that is shorter); -1 when
   the room for the complements cannot be had */
static int plan_entries(encoder_t *e)
{
    const size_t nb = e->nb, km = e->km;
    const uint32_t *cnt = e->cnt;
    const uint64_t *start = e->start;
    if (km) {
        uint64_t bb = 0;
        e->r_m = rice_param(e->listed, km, &bb);
        e->mbits = bb;
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
    e->coded = PyMem_RawMalloc(4 * (size_t)most + 4);
    if (!e->coded)
        return -1;
    lo = km;
    for (size_t x = 0; x < nb; x++) {
        uint64_t hi = start[x];
        size_t kb = (size_t)(hi - lo);
        if (kb) {
            uint32_t n_b = cnt[x];
            int comp = 2 * (uint64_t)kb > n_b;
            const uint32_t *cd = e->srank + lo;
            size_t c = kb;
            if (comp) {
                c = complement_of(e->srank + lo, kb, n_b, e->coded);
                cd = e->coded;
            }
            int r = 0;
            uint64_t bb = 0;
            if (c)
                r = rice_param(cd, c, &bb);
            centry_t *en = &e->ent[e->ne++];
            en->b = (uint32_t)x;
            en->c = (uint32_t)c;
            en->r = r;
            en->mode = (uint32_t)(2 * r + comp);
            en->ubits = c ? bb - (uint64_t)c * r : 0;
            e->ubits += en->ubits;
            e->rbits += (uint64_t)c * r;
        }
        lo = hi;
    }
    return 0;
}

/* section 0: the movers' count, Rice parameter and unary length, then the
   entries (bucket gap, coded count, mode), then the entries' unary length */
static PyObject *table_bytes(const encoder_t *e, size_t ulen_m, size_t ulen)
{
    PyObject *table = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(10 * (5 + 3 * e->ne)));
    if (!table)
        return NULL;
    uint8_t *t0 = (uint8_t *)PyBytes_AS_STRING(table), *t = t0;
    put_varint(&t, e->km);
    put_varint(&t, (uint64_t)e->r_m);
    put_varint(&t, ulen_m);
    put_varint(&t, e->ne);
    uint32_t prevb = (uint32_t)-1;
    for (size_t x = 0; x < e->ne; x++) {
        put_varint(&t, (uint64_t)(e->ent[x].b - prevb - 1));
        put_varint(&t, e->ent[x].c);
        put_varint(&t, e->ent[x].mode);
        prevb = e->ent[x].b;
    }
    put_varint(&t, ulen);
    if (_PyBytes_Resize(&table, (Py_ssize_t)(t - t0)) < 0)
        return NULL;
    return table;
}

/* section 1 into bp: the movers' unary and remainder streams, then the
   entries', each entry's indices after the one before */
static void write_bits(const encoder_t *e, uint8_t *bp, size_t ulen_m, size_t rlen_m, size_t ulen)
{
    bitw_t um = {bp, 0, 0}, rm = {bp + ulen_m, 0, 0};
    if (e->km) {
        put_rice(&um, &rm, e->listed, e->km, e->r_m);
        flush_bits(&um);
        flush_bits(&rm);
    }
    bitw_t u = {bp + ulen_m + rlen_m, 0, 0}, rb = {bp + ulen_m + rlen_m + ulen, 0, 0};
    uint64_t lo = e->km;
    size_t x_e = 0;
    for (size_t x = 0; x < e->nb && x_e < e->ne; x++) {
        uint64_t hi = e->start[x];
        if (hi > lo) {
            const centry_t *en = &e->ent[x_e++];
            const uint32_t *cd = e->srank + lo;
            if (en->mode & 1) {
                complement_of(e->srank + lo, (size_t)(hi - lo), e->cnt[x], e->coded);
                cd = e->coded;
            }
            put_rice(&u, &rb, cd, en->c, en->r);
        }
        lo = hi;
    }
    flush_bits(&u);
    flush_bits(&rb);
}

/* the runs of the value coder: the movers, then each bucket's changed
   words (start[x] is the end of bucket x's run, km that of the movers) */
static PyObject *runs_list(const encoder_t *e)
{
    PyObject *runs = PyList_New(0);
    if (!runs || list_append_size(runs, e->km) < 0)
        goto fail;
    for (size_t x = 0, lo = e->km; x < e->nb; lo = e->start[x], x++)
        if (e->start[x] > lo && list_append_size(runs, (size_t)(e->start[x] - lo)) < 0)
            goto fail;
    return runs;
fail:
    Py_XDECREF(runs);
    return NULL;
}

static void release(encoder_t *e)
{
    PyMem_RawFree(e->coded);
    PyMem_RawFree(e->srank);
    PyMem_RawFree(e->g.pos);
    PyMem_RawFree(e->g.orank);
    PyMem_RawFree(e->g.ob);
    PyMem_RawFree(e->g.dv);
    PyMem_Free(e->mem);
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
   increase. With positions None, the changed words are found in the same
   pass (sranks_words), and the outputs are made here: (table, bits, runs,
   positions, listed, signs, planes). */
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
    encoder_t e = {0};
    const int scan = po == Py_None;
    if (!scan && (PyObject_GetBuffer(po, &pos, PyBUF_SIMPLE) < 0 || PyObject_GetBuffer(oo, &out, PyBUF_WRITABLE) < 0 ||
                  PyObject_GetBuffer(so, &sg, PyBUF_WRITABLE) < 0 || PyObject_GetBuffer(plo, &pl, PyBUF_WRITABLE) < 0))
        goto done;
    if (check_bucket_fn(w, shift, mask) < 0)
        goto done;
    e.w = w, e.shift = shift, e.mask = mask;
    size_t n = e.n = (size_t)a.len / w, k = e.k = scan ? 0 : (size_t)pos.len / 4;
    e.nb = (size_t)mask + 1;
    if (a.len != b.len || a.len % w || n >= UINT32_MAX ||
        (!scan && (pos.len % 4 || (size_t)out.len < 4 * k || (size_t)sg.len != (k + 7) / 8 || (size_t)pl.len != k * w))) {
        PyErr_SetString(PyExc_ValueError, "csparse_encode: bad buffer sizes");
        goto done;
    }
    if (scratch(&e, scan) < 0)
        goto done;
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    if (scan)
        e.k = sranks_words(w, a.buf, b.buf, n, shift, mask, &e.g, e.cnt);
    else
        err = ranks_words(w, a.buf, b.buf, n, shift, mask, pos.buf, k, e.g.ob, e.g.orank, e.cnt, e.g.dv);
    Py_END_ALLOW_THREADS
    if (e.g.oom) {
        PyErr_NoMemory();
        goto done;
    }
    k = e.k;
    /* scanning, the outputs are made now that k is known */
    if (scan) {
        pos_b = PyBytes_FromStringAndSize((const char *)e.g.pos, (Py_ssize_t)(4 * k));
        listed_b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(4 * k));
        sg_b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)((k + 7) / 8));
        pl_b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(k * w));
        if (!pos_b || !listed_b || !sg_b || !pl_b)
            goto done;
    }
    e.srank = PyMem_RawMalloc(4 * k + 4);
    if (!e.srank) {
        PyErr_NoMemory();
        goto done;
    }
    e.pos = scan ? (const uint32_t *)PyBytes_AS_STRING(pos_b) : pos.buf;
    e.listed = scan ? (uint32_t *)PyBytes_AS_STRING(listed_b) : out.buf;
    e.signs = scan ? (uint8_t *)PyBytes_AS_STRING(sg_b) : sg.buf;
    e.planes = scan ? (uint8_t *)PyBytes_AS_STRING(pl_b) : pl.buf;
    Py_BEGIN_ALLOW_THREADS
    if (!err) {
        list_by_bucket(&e);
        if (plan_entries(&e) < 0)
            err = 2;
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
    uint64_t mubits = e.mbits - (uint64_t)e.km * e.r_m, mrbits = (uint64_t)e.km * e.r_m;
    size_t ulen_m = (size_t)((mubits + 7) / 8), rlen_m = (size_t)((mrbits + 7) / 8);
    size_t ulen = (size_t)((e.ubits + 7) / 8), rlen = (size_t)((e.rbits + 7) / 8);
    table = table_bytes(&e, ulen_m, ulen);
    bits = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(ulen_m + rlen_m + ulen + rlen));
    if (!table || !bits)
        goto done;
    uint8_t *bp = (uint8_t *)PyBytes_AS_STRING(bits);
    Py_BEGIN_ALLOW_THREADS
    write_bits(&e, bp, ulen_m, rlen_m, ulen);
    Py_END_ALLOW_THREADS
    runs = runs_list(&e);
    if (!runs)
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
    release(&e);
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
