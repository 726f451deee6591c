"""wdiff as a vLLM weight-transfer backend (``pip install 'wdiff[vllm]'``).

vLLM's plug-in loader calls :func:`register` in every process it starts
(the ``vllm.general_plugins`` entry point): the backend ``wdiff`` is then
known to ``weight_transfer_config={"backend": "wdiff"}``, and the trainer
side to ``WeightTransferTrainerFactory``. Nothing is imported here until
then: vLLM imports the engine module itself when an engine names it.
See docs/guides/vllm.md.
"""

from __future__ import annotations

NAME = "wdiff"


def register() -> None:
    """Register the ``wdiff`` backend with vLLM (idempotent: vLLM loads its
    plug-ins once per process, some processes more than once)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory, WeightTransferTrainerFactory

    if NAME not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(NAME, "wdiff.integrations.vllm.engine",
                                                    "WdiffWeightTransferEngine")
    if NAME not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(NAME, "wdiff.integrations.vllm.trainer",
                                                     "WdiffTrainerWeightTransferEngine")
