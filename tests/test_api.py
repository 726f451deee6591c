"""The public API: what ``wdiff`` exports works as documented, every public
function says what it does, and its options are keyword-only and stay in
step with the use case behind it."""

import inspect
import subprocess
import sys

import wdiff

FUNCTIONS = [n for n in wdiff.__all__ if inspect.isfunction(getattr(wdiff, n))]


def test_star_import_gives_everything_in_all():
    code = "from wdiff import *\nimport wdiff\nprint(sorted(n for n in wdiff.__all__ if n not in globals()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_every_public_name_has_a_docstring():
    for name in wdiff.__all__:
        obj = getattr(wdiff, name)
        if isinstance(obj, str):
            continue
        assert (obj.__doc__ or "").strip(), f"wdiff.{name} has no docstring"
    assert len(FUNCTIONS) >= 10


def test_public_functions_take_options_by_keyword_only():
    for name in FUNCTIONS:
        params = inspect.signature(getattr(wdiff, name)).parameters.values()
        kinds = {p.kind for p in params}
        assert inspect.Parameter.VAR_KEYWORD not in kinds and inspect.Parameter.VAR_POSITIONAL not in kinds, name
        for p in params:
            if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD:
                assert p.name in {"a", "b", "out", "bundle", "base", "bundles", "directory", "remote", "source"}, (name, p.name)


def test_public_signatures_match_the_use_cases_behind_them():
    """A wrapper that drifts from the function it calls (a dropped option, a
    changed default) fails here, not in a user's script."""
    import importlib

    behind = {
        "diff": "wdiff.ops.diff", "pack": "wdiff.ops.pack", "apply": "wdiff.ops.apply", "squash": "wdiff.ops.squash",
        "verify": "wdiff.sync.verify", "inspect": "wdiff.ops.inspect", "push": "wdiff.sync.push",
        "squash_remote": "wdiff.sync.push", "pull": "wdiff.sync.pull.inplace", "status": "wdiff.sync.history",
        "log": "wdiff.sync.history", "gc": "wdiff.sync.gc",
        "push_part": "wdiff.sync.stage", "commit": "wdiff.sync.stage",
    }
    assert set(behind) == set(FUNCTIONS)
    for name, module in behind.items():
        inner = inspect.signature(getattr(importlib.import_module(module), name)).parameters
        outer = inspect.signature(getattr(wdiff, name)).parameters
        # squash's base_fingerprint and check_out are for pull's own use, not public options
        hidden = {"base_fingerprint", "check_out"}
        assert [p for p in inner if p not in hidden] == list(outer), name
        for p in outer:
            assert outer[p].default == inner[p].default, (name, p)
            assert outer[p].kind == inner[p].kind or inner[p].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD, (name, p)


def test_the_api_round_trips(tmp_path):
    from factory import simple_pair, tree

    A, B = simple_pair(tmp_path)
    d = wdiff.diff(A, B)
    assert d.differs
    p = wdiff.pack(A, B, tmp_path / "b.wdb")
    assert wdiff.inspect(tmp_path / "b.wdb").bundle_id == p.bundle_id
    wdiff.apply(tmp_path / "b.wdb", A, tmp_path / "out")
    assert tree(tmp_path / "out") == tree(B)
    assert wdiff.verify(tmp_path / "out", bundle=tmp_path / "b.wdb").ok
    remote = str(tmp_path / "remote")
    wdiff.push(A, remote, anchor=True, label="a")
    wdiff.push(B, remote, base=A, label="b")
    assert [e.label for e in wdiff.log(remote).entries] == ["b", "a"]
    r = wdiff.pull(remote, tmp_path / "pulled")
    assert r.from_anchor and r.bundles and not r.up_to_date
    assert tree(tmp_path / "pulled") == tree(B) and wdiff.status(tmp_path / "pulled", remote).up_to_date
