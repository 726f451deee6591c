wdiff info nosuch.wdb
