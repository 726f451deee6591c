wdiff apply sparse.wdb base -o dense
