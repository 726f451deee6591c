"""A ``transformers.TrainerCallback`` that publishes the model every N
optimizer steps with :class:`wdiff.live.Publisher` (TRL's trainers are
Trainers, so it works there too)::

    from wdiff.integrations.transformers import WdiffCallback
    trainer = Trainer(model=model, args=args, train_dataset=ds,
                      callbacks=[WdiffCallback("hf://me/policy-live", "mirror", every=1)])

Only the main process publishes (``state.is_world_process_zero``). The
model's config (and generation config, when it has one) go with every
version, so the mirror and every pull are checkpoints ``from_pretrained``
loads.
"""

from __future__ import annotations

from transformers import TrainerCallback

from ..live import Publisher


def _unwrap(model):
    while hasattr(model, "module"):  # DDP, DeepSpeed engines
        model = model.module
    return model


class WdiffCallback(TrainerCallback):
    """Publish ``model.state_dict()`` to ``remote`` every ``every`` steps
    (and at the end of training, when the last step was not published),
    labelled ``step-N``. Keyword arguments go to :class:`Publisher`
    (``background=True``: the push and mirror update overlap the next
    steps)."""

    def __init__(self, remote, mirror_dir, *, every: int = 1, on_publish=None, **publisher_kw) -> None:
        if every < 1:
            raise ValueError("every must be at least 1")
        self.remote, self.mirror_dir, self.every = remote, mirror_dir, every
        self.publisher_kw = publisher_kw
        self.on_publish = on_publish
        self.publisher: Publisher | None = None
        self.results: list = []
        self._last = None

    def _publish(self, model, step: int) -> None:
        model = _unwrap(model)
        if self.publisher is None:
            files = dict(self.publisher_kw.pop("files", {}) or {})
            cfg = getattr(model, "config", None)
            if cfg is not None and hasattr(cfg, "to_json_string"):
                files.setdefault("config.json", cfg.to_json_string(use_diff=False))
            gen = getattr(model, "generation_config", None)
            if gen is not None and hasattr(gen, "to_json_string"):
                files.setdefault("generation_config.json", gen.to_json_string(use_diff=False))
            self.publisher = Publisher(self.remote, self.mirror_dir, files=files, **self.publisher_kw)
        res = self.publisher.publish(model.state_dict(), label=f"step-{step}")
        self._last = step
        self.results.append(res)
        if self.on_publish is not None:
            self.on_publish(res)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if model is not None and state.is_world_process_zero and state.global_step % self.every == 0:
            self._publish(model, state.global_step)
        return control

    def on_train_end(self, args, state, control, model=None, **kwargs):
        if model is not None and state.is_world_process_zero and self._last != state.global_step:
            self._publish(model, state.global_step)
        if self.publisher is not None:
            self.publisher.wait()  # a background publish is on the remote before training returns
        return control
