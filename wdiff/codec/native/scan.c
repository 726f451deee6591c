/*
 * Changed words: delta_scan finds them (their positions and old ^ new),
 * scatter_xor puts such values back, change_bitmap marks them a bit per
 * word. Portable loops, and AVX2 kernels where the CPU has them (cpu.c).
 * See native.h.
 */
#include "native.h"

/* Every candidate word is stored without a branch (the store is
   overwritten when the word did not change): at a few percent of changed
   words, a branch per word is mispredicted often enough to double the time. */
#define DEFINE_SCAN(W)                                                                           \
    HOT static size_t scan_##W(const uint8_t *a, const uint8_t *b, size_t n, uint32_t *pos,       \
                               uint8_t *val)                                                     \
    {                                                                                            \
        size_t k = 0;                                                                            \
        FOR_EACH_CANDIDATE(W, a, b, n, {                                                         \
            pos[k] = (uint32_t)j;                                                                \
            store(val + k * (W), (W), x ^ y);                                                    \
            k += x != y;                                                                         \
        });                                                                                      \
        return k;                                                                                \
    }
DEFINE_SCAN(1)
DEFINE_SCAN(2)
DEFINE_SCAN(4)
DEFINE_SCAN(8)

#ifdef HAVE_AVX2_SCAN
/* AVX2: 32 bytes at a time, one bit per changed word from a comparison of
   whole words, then a visit of the set bits only */
#define DEFINE_SCAN_AVX2(W, CMP, MASK, SHIFT)                                                    \
    __attribute__((target("avx2,bmi"))) static size_t scan_avx2_##W(                            \
        const uint8_t *a, const uint8_t *b, size_t n, uint32_t *pos, uint8_t *val)               \
    {                                                                                            \
        size_t k = 0, i = 0;                                                                     \
        for (; i + 32 / (W) <= n; i += 32 / (W)) {                                               \
            __m256i x = _mm256_loadu_si256((const __m256i *)(a + i * (W)));                      \
            __m256i y = _mm256_loadu_si256((const __m256i *)(b + i * (W)));                      \
            uint32_t m = ~(uint32_t)MASK(CMP(x, y));                                             \
            m &= (W) == 2 ? 0x55555555u : (W) == 1 ? 0xffffffffu : (1u << (32 / (W))) - 1;       \
            if (!m)                                                                              \
                continue;                                                                        \
            uint8_t xs[32];                                                                      \
            _mm256_storeu_si256((__m256i *)xs, _mm256_xor_si256(x, y));                          \
            do {                                                                                 \
                unsigned t = (unsigned)__builtin_ctz(m) >> (SHIFT);                              \
                pos[k] = (uint32_t)(i + t);                                                      \
                memcpy(val + k * (W), xs + t * (W), (W));                                        \
                k++;                                                                             \
                m &= m - 1;                                                                      \
            } while (m);                                                                         \
        }                                                                                        \
        for (; i < n; i++) {                                                                     \
            uint64_t x = load(a + i * (W), (W)), y = load(b + i * (W), (W));                     \
            pos[k] = (uint32_t)i;                                                                \
            store(val + k * (W), (W), x ^ y);                                                    \
            k += x != y;                                                                         \
        }                                                                                        \
        return k;                                                                                \
    }
#define MASK_EPI8(v) _mm256_movemask_epi8(v)
#define MASK_PS(v) _mm256_movemask_ps(_mm256_castsi256_ps(v))
#define MASK_PD(v) _mm256_movemask_pd(_mm256_castsi256_pd(v))
DEFINE_SCAN_AVX2(1, _mm256_cmpeq_epi8, MASK_EPI8, 0)
DEFINE_SCAN_AVX2(4, _mm256_cmpeq_epi32, MASK_PS, 0)
DEFINE_SCAN_AVX2(8, _mm256_cmpeq_epi64, MASK_PD, 0)

/* Two-byte words (bf16, f16), the common case, without a loop over the
   changed words: for each 8 words, a table indexed by the 8-bit mask of
   those that changed packs their XOR values (one byte shuffle) and their
   positions (one lane permutation) to the front, both are stored whole,
   and k advances by the mask's population count. The stores run past k
   but never past word i + 8 <= n, so they stay inside the buffers. */
static uint8_t pack_bytes[256][16]; /* byte shuffle: the set words' two bytes, in order */
static uint32_t pack_lanes[256][8]; /* lane permutation: the set words' indices, in order */

static void init_pack_tables(void)
{
    for (int m = 0; m < 256; m++) {
        int c = 0;
        for (int j = 0; j < 8; j++) {
            if (m >> j & 1) {
                pack_bytes[m][2 * c] = (uint8_t)(2 * j);
                pack_bytes[m][2 * c + 1] = (uint8_t)(2 * j + 1);
                pack_lanes[m][c] = (uint32_t)j;
                c++;
            }
        }
        for (int j = c; j < 8; j++) {
            pack_bytes[m][2 * j] = pack_bytes[m][2 * j + 1] = 0x80; /* zero */
            pack_lanes[m][j] = 0;
        }
    }
}

__attribute__((target("avx2,popcnt"))) static size_t scan_avx2_2(const uint8_t *a, const uint8_t *b,
                                                               size_t n, uint32_t *pos, uint8_t *val)
{
    size_t k = 0, i = 0;
    const __m256i steps = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (; i + 256 <= n; i += 256) {
        /* a block of 256 words that did not change costs one look */
        __m256i any = _mm256_setzero_si256();
        for (size_t j = 0; j < 256; j += 16)
            any = _mm256_or_si256(any, _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(a + 2 * (i + j))),
                                                        _mm256_loadu_si256((const __m256i *)(b + 2 * (i + j)))));
        if (_mm256_testz_si256(any, any))
            continue;
        for (size_t j = i; j < i + 256; j += 16) {
            __m256i x = _mm256_loadu_si256((const __m256i *)(a + 2 * j));
            __m256i y = _mm256_loadu_si256((const __m256i *)(b + 2 * j));
            unsigned bits = changed_16(x, y);
            __m256i d = _mm256_xor_si256(x, y);
            for (int h = 0; h < 2; h++) {
                unsigned m = (bits >> (8 * h)) & 0xffu;
                __m128i v = h ? _mm256_extracti128_si256(d, 1) : _mm256_castsi256_si128(d);
                __m128i packed = _mm_shuffle_epi8(v, _mm_loadu_si128((const __m128i *)pack_bytes[m]));
                __m256i idx = _mm256_add_epi32(_mm256_set1_epi32((int)(j + 8 * h)), steps);
                __m256i where =
                    _mm256_permutevar8x32_epi32(idx, _mm256_loadu_si256((const __m256i *)pack_lanes[m]));
                _mm_storeu_si128((__m128i *)(val + 2 * k), packed);
                _mm256_storeu_si256((__m256i *)(pos + k), where);
                k += (size_t)__builtin_popcount(m);
            }
        }
    }
    for (; i < n; i++) {
        uint16_t x = (uint16_t)load(a + 2 * i, 2), y = (uint16_t)load(b + 2 * i, 2);
        pos[k] = (uint32_t)i;
        store(val + 2 * k, 2, x ^ y);
        k += x != y;
    }
    return k;
}
#endif

static size_t scan_words(const uint8_t *a, const uint8_t *b, size_t n, int w, uint32_t *pos, uint8_t *val)
{
#ifdef HAVE_AVX2_SCAN
    if (cpu_avx2 && simd_on) {
        switch (w) {
        case 1: return scan_avx2_1(a, b, n, pos, val);
        case 2: return scan_avx2_2(a, b, n, pos, val);
        case 4: return scan_avx2_4(a, b, n, pos, val);
        default: return scan_avx2_8(a, b, n, pos, val);
        }
    }
#endif
    switch (w) {
    case 1: return scan_1(a, b, n, pos, val);
    case 2: return scan_2(a, b, n, pos, val);
    case 4: return scan_4(a, b, n, pos, val);
    default: return scan_8(a, b, n, pos, val);
    }
}

/* delta_scan(old, new, word, positions_out, values_out) -> k
   positions_out: uint32 buffer of at least n entries; values_out: at least
   n * word bytes. Writes the positions of the k changed words and their
   XOR (old ^ new). */
PyObject *delta_scan(PyObject *self, PyObject *args)
{
    Py_buffer a, b, pos, val;
    int w;
    if (!PyArg_ParseTuple(args, "y*y*iw*w*", &a, &b, &w, &pos, &val))
        return NULL;
    PyObject *res = NULL;
    if (check_word(w) < 0)
        goto done;
    size_t n = (size_t)a.len / w;
    if (a.len != b.len || a.len % w || n >= UINT32_MAX || (size_t)pos.len < 4 * n ||
        (size_t)val.len < w * n) {
        PyErr_SetString(PyExc_ValueError, "delta_scan: bad buffer sizes");
        goto done;
    }
    size_t k;
    Py_BEGIN_ALLOW_THREADS
    k = scan_words(a.buf, b.buf, n, w, pos.buf, val.buf);
    Py_END_ALLOW_THREADS
    res = PyLong_FromSize_t(k);
done:
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    PyBuffer_Release(&pos);
    PyBuffer_Release(&val);
    return res;
}

/* scatter_xor(buf, word, positions, values) -> True when every value is
   nonzero. XORs value i into word positions[i] of buf; positions must be
   < the number of words in buf (checked). */
PyObject *scatter_xor(PyObject *self, PyObject *args)
{
    Py_buffer buf, pos, val;
    int w;
    if (!PyArg_ParseTuple(args, "w*iy*y*", &buf, &w, &pos, &val))
        return NULL;
    PyObject *res = NULL;
    if (check_word(w) < 0)
        goto done;
    size_t k = (size_t)pos.len / 4, n = (size_t)buf.len / w;
    if (pos.len % 4 || (size_t)val.len != k * w) {
        PyErr_SetString(PyExc_ValueError, "scatter_xor: bad buffer sizes");
        goto done;
    }
    int ok = 1, inside = 1;
    Py_BEGIN_ALLOW_THREADS
    const uint32_t *p = pos.buf;
    const uint8_t *v = val.buf;
    uint8_t *d = buf.buf;
    for (size_t i = 0; i < k; i++) {
        if (p[i] >= n) {
            inside = 0;
            break;
        }
        uint64_t x = load(v + i * w, w);
        ok &= x != 0;
        store(d + (size_t)p[i] * w, w, load(d + (size_t)p[i] * w, w) ^ x);
    }
    Py_END_ALLOW_THREADS
    if (!inside) {
        PyErr_SetString(PyExc_ValueError, "scatter_xor: position out of range");
        goto done;
    }
    res = PyBool_FromLong(ok);
done:
    PyBuffer_Release(&buf);
    PyBuffer_Release(&pos);
    PyBuffer_Release(&val);
    return res;
}


/* The bitmap of the words of a and b (n words of W bytes) that differ, a
   bit per word, MSB first, from the words themselves: no positions
   needed, and no store per changed word. */
HOT static void change_bits(const uint8_t *a, const uint8_t *b, size_t n, int w, uint8_t *out)
{
    size_t i = 0, o = 0;
    for (; i + 8 <= n; i += 8, o++) {
        unsigned byte = 0;
        for (int j = 0; j < 8; j++)
            byte |= (unsigned)(load(a + (i + j) * w, w) != load(b + (i + j) * w, w)) << (7 - j);
        out[o] = (uint8_t)byte;
    }
    if (i < n) {
        unsigned byte = 0;
        for (int j = 0; i + j < n; j++)
            byte |= (unsigned)(load(a + (i + j) * w, w) != load(b + (i + j) * w, w)) << (7 - j);
        out[o] = (uint8_t)byte;
    }
}

#ifdef HAVE_AVX2_SCAN
static uint8_t reversed[256]; /* each byte with its bits in the other order */

__attribute__((target("avx2"))) static void change_bits_avx2_2(const uint8_t *a, const uint8_t *b, size_t n,
                                                              uint8_t *out)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        unsigned m = changed_16(_mm256_loadu_si256((const __m256i *)(a + 2 * i)),
                                _mm256_loadu_si256((const __m256i *)(b + 2 * i)));
        /* the bitmap wants word 0 highest */
        out[i / 8] = reversed[m & 0xff];
        out[i / 8 + 1] = reversed[(m >> 8) & 0xff];
    }
    change_bits(a + 2 * i, b + 2 * i, n - i, 2, out + i / 8);
}

/* the tables of the AVX2 kernels, made at import */
void scan_init_tables(void)
{
    init_pack_tables();
    for (int v = 0; v < 256; v++) {
        unsigned r = 0;
        for (int j = 0; j < 8; j++)
            r |= ((unsigned)v >> j & 1u) << (7 - j);
        reversed[v] = (uint8_t)r;
    }
}
#endif

/* change_bitmap(old, new, word) -> bytes: a bit per word, MSB first, set
   where old and new differ */
PyObject *change_bitmap(PyObject *self, PyObject *args)
{
    Py_buffer a, b;
    int w;
    if (!PyArg_ParseTuple(args, "y*y*i", &a, &b, &w))
        return NULL;
    PyObject *res = NULL;
    if (check_word(w) < 0)
        goto done;
    if (a.len != b.len || a.len % w) {
        PyErr_SetString(PyExc_ValueError, "change_bitmap: inputs must be equal and hold whole words");
        goto done;
    }
    size_t n = (size_t)a.len / w;
    res = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)((n + 7) / 8));
    if (!res)
        goto done;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(res);
    Py_BEGIN_ALLOW_THREADS
#ifdef HAVE_AVX2_SCAN
    if (w == 2 && cpu_avx2 && simd_on)
        change_bits_avx2_2(a.buf, b.buf, n, out);
    else
#endif
        change_bits(a.buf, b.buf, n, w, out);
    Py_END_ALLOW_THREADS
done:
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    return res;
}
