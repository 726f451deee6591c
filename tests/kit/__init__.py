"""What the tests share: the one way to run the command line
(:mod:`kit.cli`), tree reading and snapshots (:mod:`kit.trees`), digests
(:mod:`kit.digests`).

The tests import it as ``kit`` (tests/conftest.py puts tests/ on sys.path,
as for factory.py), plainly and under xdist alike. Threat-specific helpers
(per-user environments, measured runs under resource limits, hostile
formats) stay in tests/threat/threatlib.py, and the user-experience ones
(pseudo-terminals, promises) in tests/ux/uxkit.py; both build on this.
"""
