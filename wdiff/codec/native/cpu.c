/*
 * Which of the vector kernels this CPU runs: found at import (cpu_detect,
 * from module.c), read by the kernels that choose between their AVX2 and
 * portable loops, and switched off by use_simd for the tests of the
 * portable ones. See native.h.
 */
#include "native.h"

#ifdef HAVE_AVX2_SCAN
int cpu_avx2, cpu_avx512bw, simd_on = 2;

void cpu_detect(void)
{
    __builtin_cpu_init();
    cpu_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi") && __builtin_cpu_supports("popcnt");
    cpu_avx512bw = cpu_avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
}
#endif

/* which of the vector kernels this CPU runs (set at import): "avx512bw",
   "avx2", or "" for the portable loops alone */
const char *cpu_tier(void)
{
#ifdef HAVE_AVX2_SCAN
    return cpu_avx512bw ? "avx512bw" : cpu_avx2 ? "avx2" : "";
#else
    return "";
#endif
}

/* use_simd(level) -> the previous level: which vector kernels may run where
   the CPU has them, for the tests of each path: 0 the portable loops, 1 up
   to AVX2, 2 (or True) every one (AVX-512BW too); False is 0 */
PyObject *use_simd(PyObject *self, PyObject *args)
{
    PyObject *on;
    if (!PyArg_ParseTuple(args, "O", &on))
        return NULL;
    long level = PyBool_Check(on) ? (on == Py_True ? 2 : 0) : PyLong_AsLong(on);
    if (level == -1 && PyErr_Occurred())
        return NULL;
    if (level < 0 || level > 2) {
        PyErr_SetString(PyExc_ValueError, "use_simd: level 0, 1 or 2");
        return NULL;
    }
#ifdef HAVE_AVX2_SCAN
    int was = cpu_avx2 ? simd_on : 0;
    simd_on = (int)level;
    return PyLong_FromLong(was);
#else
    return PyLong_FromLong(0);
#endif
}
