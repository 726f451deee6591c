wdiff info --json struct.wdb
