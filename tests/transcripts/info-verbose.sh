wdiff info -v struct.wdb
