"""Other systems' formats, read and written with wdiff's guarantees.

A layer of its own, above the use cases (wdiff.ops) and below the command
line: each module here turns a wdiff chain into another system's layout
(``wdiff export``) or brings a directory to a version of one (``wdiff pull
--layout ...``), through the same verified fetch, pack and in-place apply
as wdiff's own commands. What another system writes is input from outside:
every name, size, count and position in it is checked before it is used.

``hfdelta``: the field's delta layout (slime and miles write it; SGLang's
``/pull_weights`` and NVIDIA ModelExpress read it).
"""
