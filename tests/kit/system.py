"""What this machine allows a test."""

from __future__ import annotations

import shutil
import subprocess


def namespaces_work(mount_point="/mnt") -> bool:
    """Whether a user and mount namespace (``unshare -Urm``) can be made here
    and a tmpfs mounted at ``mount_point`` inside it: the small-disk tests
    need one; many containers allow none."""
    if shutil.which("unshare") is None:
        return False
    r = subprocess.run(["unshare", "-Urm", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {mount_point}"],
                       capture_output=True)
    return r.returncode == 0
