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
import tempfile

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

SPEC = os.path.join("man", "wdiff-format.5")
NATIVE = os.path.join("wdiff", "codec", "native")
# sorted: the same link order, so the same extension, wherever it is built
SOURCES = sorted(glob.glob(os.path.join(NATIVE, "*.c")))
HEADERS = sorted(glob.glob(os.path.join(NATIVE, "*.h")))
# the flags of GCC and clang (and of compilers that take their spelling);
# each one is tried first, and one that the compiler refuses is left out
UNIX_FLAGS = ["-O3", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"]
MSVC_FLAGS = ["/O2", "/std:c11"]


class build_py_with_spec(build_py):
    """Copy the one hand-written page into wdiff/cli/ of the build: the
    generated pages are rendered at run time, but this one is the spec."""

    def run(self):
        super().run()
        if os.path.exists(SPEC) and not self.editable_mode:
            self.copy_file(SPEC, os.path.join(self.build_lib, "wdiff", "cli", "wdiff-format.5"))


class build_ext_flags(build_ext):
    """Compile with the flags of the compiler at hand: MSVC's own spelling,
    or each of the GNU-style flags that this compiler takes (a compiler of
    another family is not handed a flag it refuses)."""

    def build_extensions(self):
        if self.compiler.compiler_type == "msvc":
            flags = MSVC_FLAGS
        else:
            flags = [f for f in UNIX_FLAGS if self._takes(f)]
        for ext in self.extensions:
            ext.extra_compile_args = flags + list(ext.extra_compile_args or [])
        super().build_extensions()

    def _takes(self, flag: str) -> bool:
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "flag.c")
            with open(src, "w") as f:
                f.write("int main(void) { return 0; }\n")
            try:
                self.compiler.compile([src], output_dir=tmp, extra_postargs=[flag])
            except Exception:  # CompileError, or no compiler at all: the build proper says so
                return False
        return True


portable = os.environ.get("WDIFF_PORTABLE", "") not in ("", "0")

setup(
    cmdclass={"build_py": build_py_with_spec, "build_ext": build_ext_flags},
    ext_modules=[
        Extension(
            "wdiff.codec._native",
            SOURCES,
            depends=HEADERS,  # rebuilt when the header changes, and shipped in the sdist
            include_dirs=[NATIVE],
            define_macros=[("WDIFF_PORTABLE", "1")] if portable else [],
            optional=True,
        )
    ]
)
