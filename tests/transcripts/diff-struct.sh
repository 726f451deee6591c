# every kind of structural change: added, removed, retyped, reshaped,
# companion files changed and added, shards re-split
wdiff diff base struct
