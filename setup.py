"""Build the optional C kernels (wdiff/_native.c). Everything else about the
package is in pyproject.toml. Without a C compiler the build of the extension
fails softly and wdiff runs on its numpy twins (wdiff/kernels.py)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "wdiff._native",
            ["wdiff/_native.c"],
            extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        )
    ]
)
