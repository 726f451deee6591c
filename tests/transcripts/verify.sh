wdiff verify sparse --bundle sparse.wdb
wdiff verify --json struct --bundle struct.wdb
