# remote/ holds step-0 (anchor of base) and step-1 (sparse.wdb)
wdiff log remote
wdiff log --json remote
