"""The trainer's side of the ``wdiff`` backend: a trainer that uses vLLM's
trainer API publishes each round through wdiff, and its engines take it.

    engine = WeightTransferTrainerFactory.trainer_init(
        WdiffTrainerInitInfo(rank=rank, remote=URL, mirror_dir=MIRROR,
                             files={"config.json": ...}),
        client=client, source=ModuleSource(model))
    engine.send_weights()          # every round, on every rank

Each round, every rank iterates the source (materializing a sharded
tensor is a collective); rank 0 publishes the tensors as the remote's new
version (:class:`wdiff.live.Publisher`: a delta against the last one, an
anchor the first time), then drives the engines through the client:
``start_weight_update``, ``update_weights({"version": V})``,
``finish_weight_update(V)``. Any other machine that follows the remote
(``wdiff pull``, another engine) takes the same version.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from vllm.distributed.weight_transfer.base import TrainerInitInfo, TrainerWeightTransferEngine

from ...errors import UsageError
from ...live import Publisher, PublishResult


@dataclass
class WdiffTrainerInitInfo(TrainerInitInfo):
    backend: ClassVar[str] = "wdiff"

    #: the remote every version is pushed to, and the engines follow
    remote: str = ""
    #: the publisher's own copy of the last version published (a directory)
    mirror_dir: str = ""
    #: companion files written into every version ({"config.json": bytes or str, or a path})
    files: dict | None = None
    #: a minisign secret key: every version is signed with it
    sign_key: str | None = None
    #: more init_info for the engines (trusted_keys, cache_dir, model_dir...)
    engine_init: dict[str, Any] = field(default_factory=dict)


class WdiffTrainerWeightTransferEngine(TrainerWeightTransferEngine[WdiffTrainerInitInfo]):
    init_info_cls = WdiffTrainerInitInfo

    def __init__(self, *, client, source=None, is_sender: bool = True, publisher: Publisher | None = None) -> None:
        super().__init__(client=client, source=source, is_sender=is_sender)
        self.publisher = publisher
        self.rounds = 0
        self.last: PublishResult | None = None

    @classmethod
    def trainer_init(cls, init_info: WdiffTrainerInitInfo, *, client, source=None):
        if source is None:
            raise UsageError("the wdiff trainer backend publishes a WeightSource: give source=")
        if not init_info.remote or not init_info.mirror_dir:
            raise UsageError("WdiffTrainerInitInfo needs remote= and mirror_dir=")
        publisher = None
        if init_info.is_sender:
            publisher = Publisher(init_info.remote, init_info.mirror_dir, files=init_info.files,
                                  sign_key=init_info.sign_key)
            client.init_weight_transfer_engine({"remote": init_info.remote, **init_info.engine_init})
        return cls(client=client, source=source, is_sender=init_info.is_sender, publisher=publisher)

    def send_weights(self, *, label: str | None = None) -> PublishResult | None:
        """Publish the source's tensors as a new version and bring the
        engines to it. Returns the publish on the sender, None elsewhere."""
        assert self.source is not None
        # every rank iterates: materializing a sharded tensor is a collective
        tensors = [(name, t.detach()) for name, t in self.source]
        self.rounds += 1
        if not self.is_sender:
            return None
        assert self.publisher is not None
        res = self.publisher.publish(tensors, label=label)
        self.last = res
        version = res.label or res.version
        self.client.start_weight_update()
        self.client.update_weights({"version": res.version})
        self.client.finish_weight_update(version)
        return res

    def shutdown(self) -> None:
        if self.publisher is not None:
            self.publisher.close()


class LLMClient:
    """vLLM's weight-sync client protocol over an offline ``LLM`` in this
    process (``HTTPVLLMWeightSyncClient`` is the served one)."""

    def __init__(self, llm) -> None:
        self.llm = llm

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self.llm.init_weight_transfer_engine({"init_info": init_info})

    def start_weight_update(self) -> None:
        self.llm.start_weight_update()

    def update_weights(self, update_info) -> None:
        self.llm.update_weights({"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.llm.finish_weight_update(weight_version)
