wdiff info corrupt/sparse-truncated.wdb
