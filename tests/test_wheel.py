"""What an installed wdiff carries: built as a wheel from a copy of the
tree, run from the unpacked wheel. `wdiff man` and `wdiff completion` print
exactly the committed files (one generator for both), the format spec and
the JSON schemas come with the package, and safetensors is not required."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from kit.cli import run

#: the module builds a wheel with pip (from a copy of the sources) and runs it
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> tuple[Path, list[str], str]:
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    src.mkdir()
    skip = shutil.ignore_patterns("__pycache__", "*.so", "*.pyc", "*.egg-info")
    for name in ("pyproject.toml", "setup.py", "README.md", "wdiff", "man", "completions"):
        p = ROOT / name
        (shutil.copytree(p, src / name, ignore=skip) if p.is_dir() else shutil.copy2(p, src / name))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w",
                        str(work / "dist"), str(src)], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, CC="false"))
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = (work / "dist").glob("wdiff-*.whl")
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        z.extractall(work / "site")
    return work / "site", names, meta


def in_site(site: Path, *args):
    """The wheel's wdiff, from the folder beside its files (not this checkout)."""
    return run(*args, env={"PYTHONPATH": site}, cwd=site.parent, timeout=60)


def test_the_wheel_carries_types_spec_and_schemas(site):
    _, names, meta = site
    assert "wdiff/py.typed" in names
    assert "wdiff/cli/wdiff-format.5" in names
    assert {"wdiff/cli/schemas/diff.json", "wdiff/cli/schemas/error.json"} <= set(names)
    requires = [line for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    assert not [r for r in requires if "safetensors" in r and "extra ==" not in r], requires


def test_the_wheel_and_the_sdist_carry_every_c_source(site, tmp_path):
    """The extension is built from every file of wdiff/codec/native/ (setup.py
    takes the folder's .c files): an sdist without one builds no extension,
    softly (the numpy twins run), so both the sdist and the wheel carry them
    all, the header with them."""
    import tarfile

    tree = {f"wdiff/codec/native/{p.name}" for p in (ROOT / "wdiff" / "codec" / "native").iterdir()
            if p.suffix in (".c", ".h")}
    assert "wdiff/codec/native/native.h" in tree and len(tree) > 2
    assert tree <= set(site[1])
    src = site[0].parent / "src"
    r = subprocess.run([sys.executable, "-c", f"from setuptools import build_meta; build_meta.build_sdist({str(tmp_path)!r})"],
                       cwd=src, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    (sdist,) = tmp_path.glob("wdiff-*.tar.gz")
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    assert tree <= names, tree - names


@pytest.mark.parametrize("args,committed", [
    ((), "man/wdiff.1"), (("diff",), "man/wdiff-diff.1"), (("completion",), "man/wdiff-completion.1"),
    (("format",), "man/wdiff-format.5"),
])
def test_wdiff_man_prints_the_committed_page(site, args, committed):
    r = in_site(site[0], "man", *args)  # stdout is a pipe: the roff source, not man(1)
    assert r.returncode == 0, r.stderr
    assert r.stdout == (ROOT / committed).read_text()


@pytest.mark.parametrize("shell,committed", [("bash", "wdiff.bash"), ("zsh", "_wdiff"), ("fish", "wdiff.fish")])
def test_wdiff_completion_prints_the_committed_script(site, shell, committed):
    r = in_site(site[0], "completion", shell)
    assert r.returncode == 0, r.stderr
    assert r.stdout == (ROOT / "completions" / committed).read_text()


def test_unknown_pages_and_shells_are_usage_errors(site):
    for args in (("man", "nope"), ("completion", "tcsh")):
        r = in_site(site[0], *args)
        assert r.returncode == 2 and r.stdout == "" and "hint: one of:" in r.stderr, (args, r)
