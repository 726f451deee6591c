"""vLLM's weight-transfer backend ``wdiff``: an engine takes new weights
from a wdiff remote through vLLM's own RL API.

    llm = LLM(model=DIR, weight_transfer_config={"backend": "wdiff"})
    llm.init_weight_transfer_engine({"init_info": {"remote": URL}})
    llm.start_weight_update()
    llm.update_weights({"update_info": {"version": "step-7"}})
    llm.finish_weight_update("step-7")

Each worker (every tensor-parallel rank) runs :meth:`receive_weights`: the
host's copy of the remote is brought to the version and the tensors its
model needs are read from it and verified (wdiff.integrations.vllm.mirror);
only then are they handed to the model's own ``load_weights``, all in one
call (vLLM shards and fuses them, per its layout), inside vLLM's layerwise
reload. Anything refused before that (a corrupt part, a signature that
fails, a version of another model, a copy changed on disk) raises with the
model's parameters untouched: the layerwise reload, which parks layers on
the meta device, starts only once every byte handed on is checked.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import (WeightTransferEngine, WeightTransferInitInfo,
                                                   WeightTransferUpdateInfo)

from ...errors import UsageError
from ...parallel import default_threads
from ...store.hashing import hexd, short
from .mirror import Mirror
from .staged import Staged
from .tables import Table, hash_table

log = logging.getLogger("wdiff.vllm")

_DTYPES = {
    "BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
    "I8": torch.int8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}
for _name, _attr in (("U16", "uint16"), ("U32", "uint32"), ("U64", "uint64")):
    if hasattr(torch, _attr):
        _DTYPES[_name] = getattr(torch, _attr)


@dataclass
class WdiffInitInfo(WeightTransferInitInfo):
    """``init_info`` of the ``wdiff`` backend."""

    remote: str
    #: public keys (minisign .pub files) whose signature the chain must carry
    trusted_keys: list[str] | None = None
    require_signature: bool = False
    #: a Hub token (default: huggingface_hub's own)
    token: str | None = None
    #: the host's cache (default WDIFF_VLLM_CACHE, else ~/.cache/wdiff/vllm)
    cache_dir: str | None = None
    #: the checkpoint the engine was started from (default: its model, when a directory)
    model_dir: str | None = None
    threads: int | None = None


@dataclass
class WdiffUpdateInfo(WeightTransferUpdateInfo):
    """``update_info``: the version to take (a label, a fingerprint or a
    prefix of one, ``HEAD``)."""

    version: str = "HEAD"


@dataclass
class UpdateReport:
    """What the last update did, on this worker."""

    version: str
    previous: str
    tensors: int = 0  # tensors handed to the model
    bytes: int = 0
    seconds: dict[str, float] = field(default_factory=dict)


class WdiffWeightTransferEngine(WeightTransferEngine[WdiffInitInfo, WdiffUpdateInfo]):
    init_info_cls = WdiffInitInfo
    update_info_cls = WdiffUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config, vllm_config, device, model) -> None:
        super().__init__(config, vllm_config, device, model)
        self.mirror: Mirror | None = None
        self.held: Table | None = None
        self.model_dir: str | None = None
        self.model_version: bytes | None = None
        self.last: UpdateReport | None = None

    def init_transfer_engine(self, init_info: WdiffInitInfo) -> None:
        if not isinstance(init_info.remote, str) or not init_info.remote:
            raise UsageError("init_info needs \"remote\": the wdiff remote to follow")
        model_dir = init_info.model_dir or getattr(self.model_config, "model", None)
        if not isinstance(model_dir, str) or not os.path.isdir(model_dir):
            raise UsageError(f"the engine's model {model_dir!r} is not a checkpoint directory",
                             hint="give init_info \"model_dir\": the directory the engine loaded")
        threads = init_info.threads or default_threads()
        self.mirror = Mirror(init_info.remote, cache_dir=init_info.cache_dir, trusted_keys=init_info.trusted_keys,
                             require_signature=init_info.require_signature, token=init_info.token, threads=threads)
        self.model_dir = os.path.abspath(model_dir)
        if self.held is None:
            # what the model holds: the checkpoint it was started from, every byte hashed (an
            # engine initialised again, to follow another remote, holds what its updates left)
            self.held = hash_table(self.model_dir, threads=threads)
            self.model_version = self.held.version
        log.info("wdiff: following %s from version %s", self.mirror.store.url, short(self.held.version))

    def start_weight_update(self) -> None:
        self._ready()  # nothing to prepare: each update checks everything before it starts the reload

    def finish_weight_update(self) -> None:
        self._ready()  # update_weights finished its reload itself, once every byte was checked

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self.receive_weights(self.parse_update_info(update_info))
        if self.device.type != "cpu" and torch.accelerator.is_available():
            torch.accelerator.synchronize()

    def receive_weights(self, update_info: WdiffUpdateInfo) -> None:
        mirror, held = self._ready()
        t0 = time.perf_counter()
        goal = mirror.resolve(update_info.version)
        report = UpdateReport(version=hexd(goal), previous=hexd(held.version))
        if goal == held.version:
            self.last = report
            return
        t1 = time.perf_counter()
        target, staged = mirror.update(goal, held, seed=(self.model_dir, self.model_version))
        t2 = time.perf_counter()
        try:
            self._load(staged, staged.names)
        finally:
            staged.close()
        t3 = time.perf_counter()
        self.held = target
        report.tensors, report.bytes = len(staged.names), staged.nbytes
        report.seconds = {"resolve": t1 - t0, "pull+verify": t2 - t1, "load": t3 - t2, "total": t3 - t0}
        self.last = report
        log.info("wdiff: version %s: %d tensors (%.1f MB) in %.2f s", short(goal), report.tensors,
                 report.bytes / 1e6, t3 - t0)

    def _load(self, staged: Staged, names: list[str]) -> None:
        """Every tensor, verified, into the model in one ``load_weights``
        call, inside vLLM's layerwise reload."""
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

        weights = [(n, _tensor(staged, n)) for n in names]
        if not weights:
            return
        initialize_layerwise_reload(self.model)
        try:
            with _no_mtp_check():
                self.model.load_weights(iter(weights))
        finally:
            finalize_layerwise_reload(self.model, self.model_config)
            del weights

    def _ready(self) -> tuple[Mirror, Table]:
        if self.mirror is None or self.held is None:
            raise UsageError("the wdiff weight transfer is not initialised",
                             hint="call init_weight_transfer_engine({\"init_info\": {\"remote\": URL}}) first")
        return self.mirror, self.held

    def shutdown(self) -> None:
        pass


def _tensor(staged: Staged, name: str) -> torch.Tensor:
    r = staged.row(name)
    dtype = _DTYPES.get(r.dtype)
    if dtype is None:
        raise UsageError(f"tensor {name!r}: dtype {r.dtype} has no torch equivalent")
    if r.nbytes == 0:
        return torch.empty(r.shape, dtype=dtype)
    return torch.frombuffer(staged.view(name), dtype=torch.uint8).view(dtype).reshape(r.shape)


def _no_mtp_check():
    try:
        from vllm.model_executor.model_loader.mtp_validation import disable_mtp_completeness_check
    except ImportError:  # an older vLLM: no such check
        import contextlib

        return contextlib.nullcontext()
    return disable_mtp_completeness_check()
