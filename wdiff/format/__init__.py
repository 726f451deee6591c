"""The file formats wdiff writes and reads: bundle records, reader and writer
(records.py, bundle.py; the version numbers alone in versions.py), the chain
index of a remote, signature files, and the journal and undo log of an
in-place apply. Specified in man/wdiff-format.5."""
