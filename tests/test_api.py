"""The public API: ``wdiff.NAME`` is the library's own function or class, found
lazily through one table, so that its signature and docstring are the ones
that do the work; ``import wdiff`` stays light; what ``wdiff`` exports works
as documented."""

import ast
import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import wdiff

ROOT = Path(__file__).resolve().parent.parent
EAGER = {"DEFAULT_CHUNK", "DEFAULT_LEVEL", "DEFAULT_PART_SIZE", "SILENT", "ExitCode", "Reporter", "WdiffError",
         "__version__"}
FUNCTIONS = [n for n, where in wdiff._LAZY.items() if inspect.isfunction(getattr(wdiff, n))]
CLASSES = [n for n in wdiff._LAZY if inspect.isclass(getattr(wdiff, n))]


def fresh(code: str) -> str:
    """What ``code`` prints in a new interpreter, where nothing was imported yet."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_all_is_the_eager_names_and_the_table():
    assert len(set(wdiff.__all__)) == len(wdiff.__all__)
    assert set(wdiff.__all__) == EAGER | set(wdiff._LAZY)
    assert len(FUNCTIONS) == 14 and len(CLASSES) == 12


def test_every_public_name_resolves_in_a_fresh_interpreter():
    code = ("import wdiff\nmissing = [n for n in wdiff.__all__ if not hasattr(wdiff, n)]\n"
            "from wdiff import *\nprint(missing, sorted(n for n in wdiff.__all__ if n not in globals()))")
    assert fresh(code) == "[] []"


def test_each_public_name_is_the_library_object_itself():
    """``wdiff.pull is wdiff.sync.pull.pull``: no wrapper, no copy of the signature."""
    for name, where in wdiff._LAZY.items():
        module, attr = where.split(":")
        assert getattr(wdiff, name) is getattr(importlib.import_module(module), attr), name
    for name in FUNCTIONS:
        fn = getattr(wdiff, name)
        assert fn.__name__ == name and fn.__module__.startswith(("wdiff.ops.", "wdiff.sync.")), name
    assert wdiff.pull is importlib.import_module("wdiff.sync.pull.inplace").pull
    assert wdiff.squash_remote is importlib.import_module("wdiff.sync.push").squash_remote


def test_a_lookup_is_kept_and_an_unknown_name_is_an_attribute_error():
    fn = wdiff.diff
    assert vars(wdiff)["diff"] is fn  # looked up once, then a plain attribute
    assert not hasattr(wdiff, "no_such_name")
    with pytest.raises(AttributeError, match="no_such_name"):
        wdiff.no_such_name  # noqa: B018


def test_dir_lists_every_public_name_before_any_is_used():
    listed = fresh("import wdiff; print(' '.join(dir(wdiff)))").split()
    assert set(wdiff.__all__) <= set(listed)


def test_type_checkers_see_the_same_table():
    """The ``if TYPE_CHECKING:`` imports (what IDEs and type checkers read)
    name exactly the objects of the lazy table, from the same modules."""
    tree = ast.parse((ROOT / "wdiff" / "__init__.py").read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    static = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom) and node.level == 1, ast.dump(node)
        for alias in node.names:
            assert alias.asname is None
            static[alias.name] = f"wdiff.{node.module}:{alias.name}"
    assert static == wdiff._LAZY


def test_every_public_name_has_a_docstring_of_its_own():
    for name in wdiff.__all__:
        obj = getattr(wdiff, name)
        if not (inspect.isfunction(obj) or inspect.isclass(obj)):
            continue  # a constant, a str, a type alias
        doc = (obj.__doc__ or "").strip()
        assert doc, f"wdiff.{name} has no docstring"
        assert not doc.startswith(f"{name}("), f"wdiff.{name} has only the docstring dataclass makes up"
    for name in FUNCTIONS:  # the reference for every parameter: each is named in it
        fn, doc = getattr(wdiff, name), getattr(wdiff, name).__doc__
        unnamed = [p for p in inspect.signature(fn).parameters if p not in {"reporter", "threads"}
                   and f"``{p}" not in doc and f"``{p}=" not in doc]
        assert not unnamed, (name, unnamed)


def test_public_functions_take_options_by_keyword_only():
    for name in FUNCTIONS:
        params = inspect.signature(getattr(wdiff, name)).parameters.values()
        kinds = {p.kind for p in params}
        assert inspect.Parameter.VAR_KEYWORD not in kinds and inspect.Parameter.VAR_POSITIONAL not in kinds, name
        for p in params:
            if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD:
                assert p.name in {"a", "b", "out", "bundle", "base", "bundles", "directory", "remote", "source"}, (name, p.name)


def test_import_wdiff_loads_no_use_case_and_nothing_heavy():
    code = ("import sys, wdiff; wdiff.__version__, wdiff.WdiffError, wdiff.ExitCode, wdiff.Reporter; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'zstandard', 'typer', 'rich', "
            "'huggingface_hub', 'cryptography', 'xxhash', 'fsspec') or m.startswith('wdiff.')))")
    assert fresh(code) == "['wdiff.defaults', 'wdiff.errors', 'wdiff.progress']"
    # the first use loads what that function needs
    assert "'wdiff.ops.diff'" in fresh("import sys, wdiff; wdiff.diff; print(sorted(sys.modules))")


@pytest.mark.parametrize("spell", [str, Path], ids=["str", "Path"])
def test_the_api_round_trips(tmp_path, spell):
    """Every path the API takes may be a str or an os.PathLike."""
    from factory import simple_pair, tree

    A, B = (spell(p) for p in simple_pair(tmp_path))
    d = wdiff.diff(A, B)
    assert d.differs and isinstance(d, wdiff.DiffResult)
    p = wdiff.pack(A, B, spell(tmp_path / "b.wdb"))
    assert isinstance(p, wdiff.PackResult)
    assert wdiff.inspect(spell(tmp_path / "b.wdb")).bundle_id == p.bundle_id
    wdiff.apply(spell(tmp_path / "b.wdb"), A, spell(tmp_path / "out"))
    assert tree(tmp_path / "out") == tree(B)
    assert wdiff.verify(spell(tmp_path / "out"), bundle=spell(tmp_path / "b.wdb")).ok
    s = wdiff.squash([spell(tmp_path / "b.wdb")], A, spell(tmp_path / "s.wdb"))
    assert s.target_fingerprint == p.target_fingerprint
    remote = str(tmp_path / "remote")
    wdiff.push(A, remote, anchor=True, label="a")
    wdiff.push(B, remote, base=A, label="b")
    assert [e.label for e in wdiff.log(remote).entries] == ["b", "a"]
    r = wdiff.pull(remote, spell(tmp_path / "pulled"))
    assert r.from_anchor and r.bundles and not r.up_to_date
    assert tree(tmp_path / "pulled") == tree(B) and wdiff.status(spell(tmp_path / "pulled"), remote).up_to_date
    g = wdiff.gc(remote, keep_last=1, grace=0.0, work=spell(tmp_path / "gc-work"))
    assert isinstance(g, wdiff.GcResult) and len(g.kept) == 1
