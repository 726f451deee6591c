# one flipped bit in a record: exit 4, nothing written
wdiff apply corrupt/sparse-flipped.wdb base -o out
