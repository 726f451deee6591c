"""The test suite imports the source tree, so the C kernels are tested only
when the extension was built in place (pip install -e, as .ci/run does).
In CI (CI=true) a missing extension fails here instead of passing quietly
on the numpy twins alone."""

import os

import pytest

from wdiff import kernels


def test_ci_builds_the_extension():
    if os.environ.get("CI") and not kernels.available():
        pytest.fail("the C extension was not built: install with pip install -e '.[test]'")
    if kernels.available():
        assert kernels.native() == (os.environ.get("WDIFF_NATIVE", "1") != "0")
