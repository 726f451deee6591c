"""What a follower pulls from a ``WdiffCallback`` loads anywhere, exactly as
the Trainer's own checkpoint does (issue 30, mistake 8).

A tiny BERT sequence classifier is fine-tuned from a local base checkpoint
whose config says ``BertModel`` (as a sentence-transformers MiniLM's does),
with a tokenizer built from a vocabulary written here: nothing is
downloaded. The pulled directory's config.json must be byte for byte the
one ``trainer.save_model()`` writes (its architecture, not the base's; no
local ``_name_or_path``; only the non-default fields), the tokenizer's files
must be there too, and a process on "another machine" (another cwd, the
trainer's directories gone, HF_HUB_OFFLINE=1) loads the tokenizer and the
model with the Auto classes and gets the trainer's logits, bit for bit."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

transformers = __import__("transformers")
from transformers import (  # noqa: E402
    BertConfig,
    BertForSequenceClassification,
    BertModel,
    BertTokenizerFast,
    Trainer,
    TrainingArguments,
)

pytestmark = pytest.mark.slow  # real trainings: minutes

WORDS = ["good", "bad", "movie", "plot", "great", "awful", "the", "was", "a", "film", "acting", "fine"]
TEXTS = ["the movie was good", "the plot was awful", "a great film", "bad acting", "the film was fine",
         "great plot", "awful movie", "good acting"]

LOADER = textwrap.dedent(
    """
    import json, sys
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(sys.argv[1])
    model = AutoModelForSequenceClassification.from_pretrained(sys.argv[1]).eval()
    batch = tok(json.loads(sys.argv[2]), padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits
    print(json.dumps({"class": type(model).__name__, "ids": batch["input_ids"].tolist(),
                      "logits": logits.view(torch.int32).tolist()}))
    """
)


def _base(tmp_path):
    """A base checkpoint on the trainer's disk, saved as a plain BertModel
    (config ``architectures: ["BertModel"]``), with its tokenizer."""
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    tok = BertTokenizerFast(vocab_file=str(vocab))
    cfg = BertConfig(vocab_size=len(WORDS) + 5, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=32)
    torch.manual_seed(0)
    base = tmp_path / "trainer-disk" / "base"
    BertModel(cfg).save_pretrained(base)
    tok.save_pretrained(base)
    return base


def test_pulled_directory_loads_anywhere_as_the_trainers_checkpoint(tmp_path):
    from wdiff.integrations.transformers import WdiffCallback

    base = _base(tmp_path)
    tok = BertTokenizerFast.from_pretrained(base)
    model = BertForSequenceClassification.from_pretrained(base, num_labels=2)
    assert model.config.architectures == ["BertModel"] and model.config._name_or_path == str(base)
    enc = tok(TEXTS, padding="max_length", max_length=8)
    data = [{"input_ids": enc["input_ids"][i], "attention_mask": enc["attention_mask"][i],
             "token_type_ids": enc["token_type_ids"][i], "labels": i % 2} for i in range(len(TEXTS))]
    remote, mirror = tmp_path / "remote", tmp_path / "trainer-disk" / "mirror"
    cb = WdiffCallback(remote, mirror, every=2)
    args = TrainingArguments(output_dir=str(tmp_path / "trainer-disk" / "out"), max_steps=3,
                             per_device_train_batch_size=4, learning_rate=1e-2, report_to=[], save_strategy="no",
                             logging_strategy="no", use_cpu=True, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=data, processing_class=tok, callbacks=[cb])
    trainer.train()
    assert [r.label for r in cb.results] == ["step-2", "step-3"]
    saved = tmp_path / "trainer-disk" / "saved"
    trainer.save_model(str(saved))

    pulled = tmp_path / "follower" / "pulled"
    r = subprocess.run([sys.executable, "-m", "wdiff", "pull", str(remote), str(pulled)], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    # config.json: byte for byte what save_model() wrote
    assert (pulled / "config.json").read_bytes() == (saved / "config.json").read_bytes()
    cfg = json.loads((pulled / "config.json").read_text())
    assert cfg["architectures"] == ["BertForSequenceClassification"] and "_name_or_path" not in cfg
    # every file the Trainer saved beside the weights is there, the same bytes
    # (training_args.bin is the trainer's own pickle, not part of the model)
    beside = sorted(p.name for p in saved.iterdir() if p.name != "training_args.bin"
                    and not p.name.endswith(".safetensors"))
    assert "tokenizer.json" in beside or "vocab.txt" in beside
    for name in beside:
        assert (pulled / name).read_bytes() == (saved / name).read_bytes(), name

    # another machine: the trainer's disk is gone, the Hub is off, another cwd
    shutil.rmtree(tmp_path / "trainer-disk")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HOME=str(elsewhere / "hf-home"))
    r = subprocess.run([sys.executable, "-c", LOADER, str(pulled), json.dumps(TEXTS[:3])], capture_output=True,
                       text=True, cwd=elsewhere, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.splitlines()[-1])
    model.eval()
    batch = tok(TEXTS[:3], padding=True, return_tensors="pt")
    with torch.no_grad():
        want = model(**batch).logits
    assert got["class"] == "BertForSequenceClassification"
    assert got["ids"] == batch["input_ids"].tolist()
    assert got["logits"] == want.view(torch.int32).tolist()  # bit for bit


def test_checkpoint_files_are_the_ones_beside_the_weights(tmp_path):
    """checkpoint_files: the model's config as save_pretrained writes it and
    the tokenizer's files, never a weights file; a plain torch module (no
    config, no save_pretrained) and no processing class: nothing."""
    from wdiff.integrations.transformers import checkpoint_files

    base = _base(tmp_path)
    model = BertForSequenceClassification.from_pretrained(base, num_labels=2)
    tok = BertTokenizerFast.from_pretrained(base)
    files = checkpoint_files(model, tok)
    assert json.loads(files["config.json"])["architectures"] == ["BertForSequenceClassification"]
    assert "tokenizer_config.json" in files
    assert not any(n.endswith((".safetensors", ".bin")) for n in files)
    assert checkpoint_files(torch.nn.Linear(2, 2), None) == {}
