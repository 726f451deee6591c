import os
import sys

# the tests import their helpers (factory.py) by name
sys.path.insert(0, os.path.dirname(__file__))

import tempfile

# the manifest cache of the tests lives in a private temporary directory
os.environ.setdefault("WDIFF_CACHE_DIR", tempfile.mkdtemp(prefix="wdiff-test-cache-"))
# so does the record of the signed remotes each test's pulls and pushes
# accepted (never the real ~/.local/state/wdiff)
os.environ["WDIFF_STATE_DIR"] = tempfile.mkdtemp(prefix="wdiff-test-state-")


import pytest


@pytest.fixture(scope="session")
def moto_s3():
    """moto's S3 server on 127.0.0.1 (a free port), one per session; tests
    take a fresh bucket each (``new_bucket``). Never skipped under CI=true."""
    if os.environ.get("CI") != "true":
        pytest.importorskip("moto.server")
        pytest.importorskip("s3fs")
    from s3fake import MotoS3

    with MotoS3() as m:
        yield m
