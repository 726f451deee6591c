"""A ``transformers.TrainerCallback`` that publishes the model every N
optimizer steps with :class:`wdiff.live.Publisher` (TRL's trainers are
Trainers, so it works there too)::

    from wdiff.integrations.transformers import WdiffCallback
    trainer = Trainer(model=model, args=args, train_dataset=ds,
                      callbacks=[WdiffCallback("hf://me/policy-live", "mirror", every=1)])

Only the main process publishes (``state.is_world_process_zero``). Every
version carries the files ``Trainer.save_model()`` writes beside the
weights (:func:`checkpoint_files`): the config as ``save_pretrained``
writes it, the generation config, and the processing class's files (the
tokenizer), so that the mirror and every pull load with the Auto classes
on any machine, as the Trainer's own checkpoint does.
"""

from __future__ import annotations

import os
import tempfile

from transformers import TrainerCallback

from ..live import Publisher

#: what save_pretrained may write that is the weights, not beside them:
#: the publisher writes those itself (model.safetensors and its index)
_WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".msgpack", ".h5", ".safetensors.index.json",
            ".bin.index.json")


def _unwrap(model):
    while hasattr(model, "module"):  # DDP, DeepSpeed engines
        model = model.module
    return model


def checkpoint_files(model, processing_class=None) -> dict[str, bytes]:
    """The files ``Trainer.save_model()`` writes beside the weights of
    ``model``, by path: what ``model.save_pretrained`` writes (config.json,
    with the model's own class as its architecture and only the fields
    that differ from the defaults; generation_config.json for a model that
    generates; the code of a remote-code model), then what
    ``processing_class.save_pretrained`` writes (a tokenizer's files).
    Both are written by transformers itself, into a temporary directory,
    with no weights (an empty state dict); like the Trainer's save, this
    sets ``model.config``'s dtype and architectures. A model without
    ``save_pretrained`` (a plain torch module) contributes nothing."""
    from transformers.utils import logging as hf_logging

    files: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory(prefix="wdiff-checkpoint-files-") as tmp:
        if hasattr(model, "save_pretrained") and getattr(model, "config", None) is not None:
            bar = hf_logging.is_progress_bar_enabled()
            hf_logging.disable_progress_bar()  # "Writing model shards: 0it": nothing is written
            try:
                model.save_pretrained(os.path.join(tmp, "model"), state_dict={})
            finally:
                if bar:
                    hf_logging.enable_progress_bar()
            files.update(_read_tree(os.path.join(tmp, "model")))
        if processing_class is not None and hasattr(processing_class, "save_pretrained"):
            processing_class.save_pretrained(os.path.join(tmp, "processing"))
            files.update(_read_tree(os.path.join(tmp, "processing")))  # the Trainer writes it last, over the rest
    return files


def _read_tree(root: str) -> dict[str, bytes]:
    """Every regular file under ``root`` (a directory transformers just
    wrote), by relative path with ``/``, less the weights."""
    out: dict[str, bytes] = {}
    for dirpath, dirs, names in os.walk(root):
        dirs.sort()
        for n in sorted(names):
            rel = os.path.relpath(os.path.join(dirpath, n), root).replace(os.sep, "/")
            if n.endswith(_WEIGHTS):
                continue
            with open(os.path.join(dirpath, n), "rb") as f:
                out[rel] = f.read()
    return out


class WdiffCallback(TrainerCallback):
    """Publish ``model.state_dict()`` to ``remote`` every ``every`` steps
    (and at the end of training, when the last step was not published),
    labelled ``step-N``, with the files :func:`checkpoint_files` gives for
    the model and the Trainer's processing class (a ``files=`` entry of
    your own takes the place of one of them). Keyword arguments go to
    :class:`Publisher` (``background=True``: the push and mirror update
    overlap the next steps)."""

    def __init__(self, remote, mirror_dir, *, every: int = 1, on_publish=None, **publisher_kw) -> None:
        if every < 1:
            raise ValueError("every must be at least 1")
        self.remote, self.mirror_dir, self.every = remote, mirror_dir, every
        self.publisher_kw = publisher_kw
        self.on_publish = on_publish
        self.publisher: Publisher | None = None
        self.results: list = []
        self._last = None

    def _publish(self, model, step: int, processing_class=None) -> None:
        model = _unwrap(model)
        if self.publisher is None:
            files = dict(checkpoint_files(model, processing_class))
            files.update(self.publisher_kw.pop("files", {}) or {})
            self.publisher = Publisher(self.remote, self.mirror_dir, files=files, **self.publisher_kw)
        res = self.publisher.publish(model.state_dict(), label=f"step-{step}")
        self._last = step
        self.results.append(res)
        if self.on_publish is not None:
            self.on_publish(res)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if model is not None and state.is_world_process_zero and state.global_step % self.every == 0:
            self._publish(model, state.global_step, kwargs.get("processing_class"))
        return control

    def on_train_end(self, args, state, control, model=None, **kwargs):
        if model is not None and state.is_world_process_zero and self._last != state.global_step:
            self._publish(model, state.global_step, kwargs.get("processing_class"))
        if self.publisher is not None:
            self.publisher.wait()  # a background publish is on the remote before training returns
        return control
