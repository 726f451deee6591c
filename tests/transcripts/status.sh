# remote/ holds step-0 (anchor of base) and step-1 (sparse.wdb)
wdiff status sparse remote
wdiff status dense remote
wdiff status --json base remote
wdiff status --exit-code base remote
