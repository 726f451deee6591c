wdiff log nosuch-remote
