"""The benchmark's generated checkpoints and the children that make them:
generation is deterministic, so a checkpoint a run made complete (stamped
with its recipe beside it) is reused by the next run with the same recipe;
each data step runs in a child process so the benchmark's own process stays
small. Shared by the main benchmark (__init__.py) and fanout.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

#: bump when the generated data changes, so that --dir regenerates it
GENERATOR = 2


def in_child(fn: str, *args):
    """Run a data step in a child process, so that this process stays small:
    a child's peak RSS as the kernel reports it includes what it inherited
    from us at fork time."""
    code = (
        "import json, sys; from wdiff.bench import scenarios; "
        f"r = scenarios._child_{fn}(*json.loads(sys.argv[1])); print(json.dumps(r))"
    )
    p = subprocess.run([sys.executable, "-c", code, json.dumps(args)], check=False, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(p.stderr)
    return json.loads(p.stdout)


def compile_package() -> bool:
    """Write wdiff's bytecode beside its modules, as pip does when it
    installs a package, so that the timed commands cost what they cost a
    user. Where it is missing and cannot be written (PYTHONDONTWRITEBYTECODE
    is set in some environments; an editable install has none of its own),
    every command would compile wdiff's hundred-odd modules first: measured
    here, 0.06-0.12 s of each wdiff row, a third of the start-up. Returns
    whether every module has bytecode now."""
    import compileall

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return bool(compileall.compile_dir(root, quiet=2, workers=1))


def _stamp_path(root: str) -> str:
    return root.rstrip("/") + ".json"  # beside the checkpoint, not in it


def unstamp(root: str) -> None:
    """Before generating into ``root``: nothing of an earlier run is left."""
    try:
        os.unlink(_stamp_path(root))
    except FileNotFoundError:
        pass
    shutil.rmtree(root, ignore_errors=True)


def _recipe(size: int, shards: int, tensors: int | None, what: str) -> dict:
    return {"size": size, "shards": shards, "tensors": tensors, "what": what, "generator": GENERATOR}


def stamp(root: str, size: int, shards: int, tensors: int | None, what: str) -> None:
    """Record how a generated checkpoint was made, once it is complete, so
    that a --dir run can reuse it: generation is deterministic."""
    with open(_stamp_path(root), "w") as f:
        json.dump(_recipe(size, shards, tensors, what), f)


def generated(root: str, size: int, shards: int, tensors: int | None, what: str) -> bool:
    try:
        with open(_stamp_path(root)) as f:
            stamp = json.load(f)
    except (OSError, ValueError):
        return False
    return stamp == _recipe(size, shards, tensors, what) and os.path.isdir(root)


def files_of(d: str) -> list[str]:
    return sorted(os.path.join(d, f) for f in os.listdir(d) if not f.startswith("."))
