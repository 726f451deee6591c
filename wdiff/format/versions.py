"""The bundle format's version numbers, and the version from which each
rule applies (man/wdiff-format.5). Apart from records.py, which re-exports
them, so that a command that only names a version (diff's pass, which
shares its skeleton with pack) does not import the record format."""

VERSION = 1
#: the newest version this wdiff reads and writes; it writes the lowest one
#: whose rules give the bundle it means (see man/wdiff-format.5, CHANGES)
MAX_VERSION = 3
#: from this version on, tensor names are scoped by their file's directory
SCOPED_NAMES = 2
#: from this version on, a companion file may be rebuilt from the base's file
#: at the same path by DELTA records (target source "delta")
FILE_DELTAS = 3
#: from this version on, CHUNK records may use the codecs of codec v2
#: (modular differences, base-conditioned positions: codecs 5 to 10)
CODEC_V2 = 3
