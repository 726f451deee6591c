/*
 * Which of the vector kernels this CPU runs: found at import (cpu_detect,
 * from module.c), read by the kernels that choose between their AVX2 and
 * portable loops, and switched off by use_simd for the tests of the
 * portable ones. See native.h.
 */
#include "native.h"

#ifdef HAVE_AVX2_SCAN
int cpu_avx2, cpu_avx512bw, simd_on = 1;

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

/* use_simd(on) -> previous: whether the scan may use the AVX2 kernels
   where the CPU has them (for tests of the portable ones) */
PyObject *use_simd(PyObject *self, PyObject *args)
{
    int on;
    if (!PyArg_ParseTuple(args, "p", &on))
        return NULL;
#ifdef HAVE_AVX2_SCAN
    int was = simd_on;
    simd_on = on;
    return PyBool_FromLong(was && cpu_avx2);
#else
    return Py_NewRef(Py_False);
#endif
}
