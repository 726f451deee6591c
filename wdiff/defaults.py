"""Defaults that the library and the command line share, defined once here.

This module imports nothing, so that ``import wdiff`` and ``wdiff --help``
stay light while the public signatures still show every default.
"""

__version__ = "0.1.0"

#: zstd's level 1 is, on byte planes of weights, both the fastest and the
#: smallest: higher levels find short matches in near-random mantissa bytes
#: that cost more than the literals they replace (bench: 10.9 vs 11.4 bits per
#: bf16 element of new weights, 3.8 vs 4.2 bits per changed element of a
#: dense step, at a fifth of the time)
DEFAULT_LEVEL = 1

#: bytes of a unit of work: one record of a bundle covers at most this much
#: of a tensor file, and a worker thread holds a few of them at a time
DEFAULT_CHUNK = 4 << 20

#: the largest part of a bundle stored on a remote: the Hub recommends files
#: of at most 20 GB
DEFAULT_PART_SIZE = 20 * 1000**3
