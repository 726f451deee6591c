# remote/ holds step-0 (anchor of base) and step-1 (sparse.wdb).
# a bundle whose base is not the head is refused: exit 5
wdiff push dense.wdb remote
