"""``pull``: bring a directory to a version of a remote, in place
(inplace.py) or as a new directory a symbolic link switches to (atomic.py,
whose old versions keep.py retires). Both plan from what the directory
holds (..tracked), fetch and verify through work.py and check the disk the
plan needs first (space.py)."""

from .inplace import pull
from .work import PullResult

__all__ = ["PullResult", "pull"]
