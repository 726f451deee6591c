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
