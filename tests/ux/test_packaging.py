"""A command line that never surprises once installed from a wheel: the man
pages and shell completions come with it (as data files, or printed by
`wdiff man` and `wdiff completion SHELL`), type checkers see py.typed, and
`from wdiff import *` works.

The wheel is built from a copy of the source tree (the tree itself is not
touched) and unpacked into a directory that stands in for site-packages; the
package's dependencies come from the running interpreter."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from kit.cli import environment, run
from uxkit import ROOT, Promises

SOURCES = ["pyproject.toml", "setup.py", "README.md", "wdiff", "man", "completions"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> tuple[Path, list[str]]:
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    src.mkdir()
    skip = shutil.ignore_patterns("__pycache__", "*.so", "*.pyc", "*.egg-info")
    for name in SOURCES:
        p = ROOT / name
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=skip)
        elif p.exists():
            shutil.copy2(p, src / name)
    out = work / "dist"
    # CC=false: the C extension is optional (setup.py) and what is tested here
    # is the wheel's file list, so its compilation is skipped to save time
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)],
                       capture_output=True, text=True, timeout=300, cwd=work, env=dict(os.environ, CC="false"))
    assert r.returncode == 0, f"building the wheel failed:\n{r.stdout}\n{r.stderr}"
    (whl,) = out.glob("wdiff-*.whl")
    site = work / "site"
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
        z.extractall(site)
    return site, names


def _installed(site: Path, *args, code: str | None = None) -> subprocess.CompletedProcess:
    """Run the wheel's wdiff, not the source tree's: from an unrelated
    directory, with only the unpacked wheel ahead of the interpreter's own
    site-packages (where the dependencies are)."""
    if code is None:
        return run(*args, env={"PYTHONPATH": site}, cwd=site.parent, timeout=60)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=environment({"PYTHONPATH": site}), cwd=site.parent)


@pytest.mark.slow
def test_the_wheel_carries_docs_types_and_a_working_star_import(wheel):
    site, names = wheel
    with Promises() as p:
        where = _installed(site, code="import wdiff; print(wdiff.__file__)")
        p.check(where.returncode == 0 and where.stdout.strip().startswith(str(site)),
                "the checks below run the wheel's wdiff, not the source tree's", where.stdout + where.stderr)

        p.check("wdiff/py.typed" in names, "the wheel has wdiff/py.typed (PEP 561)", "\n".join(names))

        star = _installed(site, code="from wdiff import *; print(sorted(k for k in dir() if not k.startswith('_')))")
        p.check(star.returncode == 0, "`from wdiff import *` works (every name in __all__ exists)",
                star.stdout + star.stderr[-2000:])

        man_files = [n for n in names if n.endswith("wdiff.1")]
        man = _installed(site, "man")
        p.check(man_files or (man.returncode == 0 and ".TH" in man.stdout),
                "the man pages come with the wheel: as data files, or printed by `wdiff man`",
                f"man page files in the wheel: {man_files}\n$ wdiff man -> {man.returncode}\n{man.stderr[-1500:]}")

        for shell, mark in (("bash", "complete"), ("zsh", "compdef"), ("fish", "complete -c wdiff")):
            files = [n for n in names if n.endswith({"bash": "wdiff.bash", "zsh": "_wdiff", "fish": "wdiff.fish"}[shell])]
            comp = _installed(site, "completion", shell)
            p.check(files or (comp.returncode == 0 and mark in comp.stdout),
                    f"the {shell} completion comes with the wheel: as a data file, or printed by `wdiff completion {shell}`",
                    f"files in the wheel: {files}\n$ wdiff completion {shell} -> {comp.returncode}\n{comp.stderr[-1500:]}")
