"""The field's delta layout (``weight_vNNNNNN/`` directories of zstd XOR or
overwrite frames; see layout.py): ``export`` writes a wdiff chain in it,
``pull_hfdelta`` brings a directory to a version of a source in it."""
