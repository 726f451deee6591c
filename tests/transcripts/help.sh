wdiff --help
