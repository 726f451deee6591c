"""Element-level encodings of a chunk (chunk.py), the kernels behind them
(kernels.py, C in _native.c with numpy twins), and dtypes. Pure functions on
arrays: no I/O."""
