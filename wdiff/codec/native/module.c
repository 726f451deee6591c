/*
 * The module wdiff.codec._native: its method table, and at import the
 * CPU's features, the kernels' tables and the constants of the contract
 * with kernels.py (native.h). Every function is in the file of its
 * concern; see native.h for the map.
 */
#include "native.h"

static PyMethodDef methods[] = {
    {"use_simd", use_simd, METH_VARARGS, "(level: 0 portable, 1 AVX2, 2 all; True 2) -> the previous level"},
    {"diff_stats", diff_stats, METH_VARARGS, "(a, b, word, kind, lut, spans) -> [(changed, max_abs, sum_d2, sum_a2)]"},
    {"delta_scan", delta_scan, METH_VARARGS, "(old, new, word, positions_out, values_out) -> k"},
    {"planes", planes, METH_VARARGS, "(src, word, dst) -> None"},
    {"xor_planes", xor_planes, METH_VARARGS, "(old, new, word, dst) -> changed words"},
    {"unplanes", unplanes, METH_VARARGS, "(src, word, dst, xor) -> nonzero words"},
    {"scatter_xor", scatter_xor, METH_VARARGS, "(buf, word, positions, values) -> all values nonzero"},
    {"change_bitmap", change_bitmap, METH_VARARGS, "(old, new, word) -> bytes"},
    {"rice_size", rice_size, METH_VARARGS, "(positions) -> (r, unary bytes, remainder bytes)"},
    {"rice_encode", rice_encode, METH_VARARGS, "(positions) -> (r, unary, remainder)"},
    {"rice_decode", rice_decode, METH_VARARGS, "(r, unary, remainder, k, n, out) -> error code"},
    {"bucket_ranks", bucket_ranks, METH_VARARGS, "(old, new, word, shift, mask, positions, buckets, ranks, counts) -> error"},
    {"bucket_counts", bucket_counts, METH_VARARGS, "(ref, word, shift, mask, movers, counts) -> error"},
    {"bucket_select", bucket_select, METH_VARARGS, "(ref, word, shift, mask, movers, want, offsets, out) -> error"},
    {"mod_values", mod_values, METH_VARARGS, "(old, new, word, positions, dense, signs_out, planes_out) -> None"},
    {"mod_apply", mod_apply, METH_VARARGS, "(buf, word, positions, signs, planes, shift, mask, movers) -> error"},
    {"csparse_encode", csparse_encode, METH_VARARGS, "(old, new, word, shift, mask, positions, listed_out) -> (table, bits)"},
    {"csparse_select", csparse_select, METH_VARARGS,
     "(ref, word, shift, mask, movers, entries, counts, unary, remainder, out, counts_out) -> error"},
    {"rc_values_encode", rc_values_encode, METH_VARARGS, "(signs, planes, word, runs) -> bytes"},
    {"rc_values_decode", rc_values_decode, METH_VARARGS, "(data, word, runs, signs_out, planes_out) -> error"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "wdiff.codec._native", "Single-pass kernels for wdiff (optional).", -1, methods, NULL, NULL, NULL, NULL,
};

/* an unsigned constant, whole where a C long is 32 bits (Windows) */
static int add_unsigned(PyObject *m, const char *name, unsigned long v)
{
    PyObject *o = PyLong_FromUnsignedLong(v);
    int r = o ? PyModule_AddObjectRef(m, name, o) : -1;
    Py_XDECREF(o);
    return r;
}

PyMODINIT_FUNC PyInit__native(void)
{
#ifdef HAVE_AVX2_SCAN
    cpu_detect();
    scan_init_tables();
#endif
    rc_init_tables();
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    const char *features = ""
#ifdef WDIFF_VECTORS
                           "vectors "
#endif
#ifdef HAVE_AVX2_SCAN
                           "avx2-dispatch "
#endif
        ;
    /* the contract with kernels.py, which checks every value at import */
    if (PyModule_AddIntConstant(m, "MAX_RICE", MAX_RICE) < 0 ||
        add_unsigned(m, "MAX_WORDS", MAX_WORDS) < 0 ||
        PyModule_AddIntConstant(m, "F_NONE", F_NONE) < 0 || PyModule_AddIntConstant(m, "F_BF16", F_BF16) < 0 ||
        PyModule_AddIntConstant(m, "F_F32", F_F32) < 0 || PyModule_AddIntConstant(m, "F_F64", F_F64) < 0 ||
        PyModule_AddIntConstant(m, "F_LUT", F_LUT) < 0 ||
        PyModule_AddIntConstant(m, "RICE_BAD_COUNT", RICE_BAD_COUNT) < 0 ||
        PyModule_AddIntConstant(m, "RICE_BAD_REMAINDER_LENGTH", RICE_BAD_REMAINDER_LENGTH) < 0 ||
        PyModule_AddIntConstant(m, "RICE_OUT_OF_RANGE", RICE_OUT_OF_RANGE) < 0 ||
        PyModule_AddIntConstant(m, "RICE_BAD_PADDING", RICE_BAD_PADDING) < 0 ||
        PyModule_AddIntConstant(m, "MAX_BUCKETS", MAX_BUCKETS) < 0 ||
        PyModule_AddIntConstant(m, "CS_BAD_UNARY", CS_BAD_UNARY) < 0 ||
        PyModule_AddIntConstant(m, "CS_BAD_REMAINDER_LENGTH", CS_BAD_REMAINDER_LENGTH) < 0 ||
        PyModule_AddIntConstant(m, "CS_BAD_PADDING", CS_BAD_PADDING) < 0 ||
        PyModule_AddIntConstant(m, "CS_OUT_OF_RANGE", CS_OUT_OF_RANGE) < 0 ||
        PyModule_AddIntConstant(m, "CS_BAD_MOVERS", CS_BAD_MOVERS) < 0 ||
        PyModule_AddIntConstant(m, "MV_BAD_MAGNITUDE", MV_BAD_MAGNITUDE) < 0 ||
        PyModule_AddIntConstant(m, "MV_WRONG_BUCKET", MV_WRONG_BUCKET) < 0 ||
        PyModule_AddIntConstant(m, "MV_OUT_OF_RANGE", MV_OUT_OF_RANGE) < 0 ||
        PyModule_AddIntConstant(m, "RC_BAD_STREAM", RC_BAD_STREAM) < 0 || PyModule_AddIntConstant(m, "RC_LIMIT", RC_LIMIT) < 0 ||
        PyModule_AddStringConstant(m, "FEATURES", features) < 0 ||
        PyModule_AddStringConstant(m, "CPU", cpu_tier()) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
