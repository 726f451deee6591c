"""Live sync: publish from a running trainer, apply into a running model.

    from wdiff.live import Publisher, Follower, apply_into, iter_patches

:class:`Publisher` packs live tensors against a mirror checkpoint and pushes
one bundle per step (:class:`RankPublisher`: each rank of a torch.distributed
group publishes its part of one version); :func:`apply_into` patches live tensors in place, all
or nothing; :func:`iter_patches` yields a bundle's patches for engines that
apply them themselves; :class:`Follower` keeps a worker's tensors at a
remote's head. torch is imported only when torch tensors are given.
"""

from ._tensors import Prepared
from ._tensors import Prepared as prepare
from .apply import ApplyIntoResult, apply_into, iter_patches
from .follower import Follower, FollowResult
from .publisher import Publisher, PublishResult
from .ranks import RankPublisher, Slice

__all__ = [
    "ApplyIntoResult", "FollowResult", "Follower", "Prepared", "PublishResult", "Publisher", "RankPublisher", "Slice",
    "apply_into", "iter_patches", "prepare",
]
