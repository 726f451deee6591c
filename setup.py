"""Build the optional C kernels (wdiff/codec/_native.c). Everything else about
the package is in pyproject.toml. Without a C compiler the build of the
extension fails softly and wdiff runs on its numpy twins
(wdiff/codec/kernels.py); ``wdiff --version`` says which kernels run.
WDIFF_PORTABLE=1 at install time builds the portable C subset alone (no GNU C
vector lanes, no AVX2), as a compiler without those extensions would."""

import os

from setuptools import Extension, setup

portable = os.environ.get("WDIFF_PORTABLE", "") not in ("", "0")

setup(
    ext_modules=[
        Extension(
            "wdiff.codec._native",
            ["wdiff/codec/_native.c"],
            extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            define_macros=[("WDIFF_PORTABLE", "1")] if portable else [],
            optional=True,
        )
    ]
)
