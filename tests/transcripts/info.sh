wdiff info anchor.wdb
wdiff info dense.wdb
