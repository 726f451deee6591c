wdiff pack --json base struct -o s.wdb
