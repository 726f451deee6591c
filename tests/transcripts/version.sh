wdiff --version
