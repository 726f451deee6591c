"""Build the optional C kernels (wdiff/codec/native/: one extension module,
wdiff.codec._native, from every .c file there and the one header), and put
the bundle format's specification (man/wdiff-format.5, written by hand and
kept there) into the package, where `wdiff man format` finds it once installed.
Everything else about the package is in pyproject.toml. Without a C compiler the build of the
extension fails softly and wdiff runs on its numpy twins
(wdiff/codec/kernels.py); ``wdiff --version`` says which kernels run.
WDIFF_PORTABLE=1 at install time builds the portable C subset alone (no GNU C
vector lanes, no AVX2), as a compiler without those extensions would."""

import glob
import os

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

SPEC = os.path.join("man", "wdiff-format.5")
NATIVE = os.path.join("wdiff", "codec", "native")
# sorted: the same link order, so the same extension, wherever it is built
SOURCES = sorted(glob.glob(os.path.join(NATIVE, "*.c")))
HEADERS = sorted(glob.glob(os.path.join(NATIVE, "*.h")))


class build_py_with_spec(build_py):
    """Copy the one hand-written page into wdiff/cli/ of the build: the
    generated pages are rendered at run time, but this one is the spec."""

    def run(self):
        super().run()
        if os.path.exists(SPEC) and not self.editable_mode:
            self.copy_file(SPEC, os.path.join(self.build_lib, "wdiff", "cli", "wdiff-format.5"))


portable = os.environ.get("WDIFF_PORTABLE", "") not in ("", "0")

setup(
    cmdclass={"build_py": build_py_with_spec},
    ext_modules=[
        Extension(
            "wdiff.codec._native",
            SOURCES,
            depends=HEADERS,  # rebuilt when the header changes, and shipped in the sdist
            include_dirs=[NATIVE],
            extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            define_macros=[("WDIFF_PORTABLE", "1")] if portable else [],
            optional=True,
        )
    ]
)
