"""The architecture, enforced: the import contract in pyproject.toml (layers
top to bottom, no cycles, third-party packages in their one module) holds,
and ``import wdiff`` stays light."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_import_contract_holds():
    lint = Path(sys.executable).with_name("lint-imports")
    r = subprocess.run([str(lint), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
                       cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout


def test_the_contract_catches_a_violation(tmp_path):
    """The contract is not vacuous: a remote that imports the bundle format
    (planted in a copy of the package) breaks it."""
    import shutil

    pkg = tmp_path / "wdiff"
    shutil.copytree(ROOT / "wdiff", pkg, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    with open(pkg / "remotes" / "local.py", "a") as f:
        f.write("\nfrom ..format import bundle  # planted\n")
    r = _lint_copy(tmp_path)
    assert r.returncode != 0 and "wdiff.remotes.local -> wdiff.format.bundle" in r.stdout, r.stdout[-3000:]


def _lint_copy(tmp_path):
    """lint-imports over the copy of the package in ``tmp_path``, with the
    project's contracts and its own contract type."""
    import shutil

    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "import_contracts.py", tmp_path / "scripts" / "import_contracts.py")
    lint = Path(sys.executable).with_name("lint-imports")
    return subprocess.run([str(lint), "--no-cache"], cwd=tmp_path, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(tmp_path)))


def test_the_contract_catches_a_package_and_its_module_importing_each_other(tmp_path):
    """A package's face and one of its own modules importing each other are
    no siblings, so acyclic_siblings passes them (wdiff.bench and
    wdiff.bench.fanout did once); acyclic_modules does not."""
    import shutil

    pkg = tmp_path / "wdiff"
    shutil.copytree(ROOT / "wdiff", pkg, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    with open(pkg / "bench" / "generated.py", "a") as f:
        f.write("\n\ndef _planted():\n    from . import main  # planted, inside a function\n\n    return main\n")
    r = _lint_copy(tmp_path)
    assert r.returncode != 0, r.stdout[-3000:]
    said = " ".join(r.stdout.split())  # the report wraps long lines
    cycle = said.split("These modules import each other: ")[1].split(", ")
    assert "wdiff.bench" in cycle and "wdiff.bench.generated" in cycle, r.stdout[-3000:]
    assert "No import cycles, inside any package either KEPT" in r.stdout, r.stdout[-3000:]


def test_import_wdiff_stays_light():
    code = ("import sys, wdiff; heavy = [m for m in ('numpy', 'zstandard', 'typer', 'rich', 'huggingface_hub', "
            "'cryptography', 'xxhash') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_nothing_imports_click():
    """typer keeps its click private (typer._click) and does not depend on
    click: an import of click works in a test venv (other tools bring it) and
    fails on a user's plain install."""
    import ast

    for path in (ROOT / "wdiff").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            assert not any(n == "click" or n.startswith("click.") for n in names), path
