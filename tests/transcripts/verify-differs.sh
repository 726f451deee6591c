# each difference is named on stderr; exit 4
wdiff verify base --bundle struct.wdb
