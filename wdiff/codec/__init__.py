"""Element-level encodings of a chunk: the codec numbers and the primitives
they stand on (codecs.py), the encoder that picks the smallest (chunk.py,
which also re-exports the rest: import codecs from there), the checked
decoder (decode.py), codec v2's base-conditioned positions (conditioned.py)
and value coder (rangecoder.py, the twin of the C one), the kernels behind
them (kernels.py, C in native/ with numpy twins), and dtypes. Pure
functions on arrays: no I/O."""
