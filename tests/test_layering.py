"""The architecture, enforced: which modules may import what."""

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "wdiff"

# third-party packages that only one part of wdiff may touch
OWNERS = {
    "typer": ("cli/",),
    "rich": ("cli/",),
    "huggingface_hub": ("remotes/hub.py",),
    "hf_xet": ("remotes/hub.py",),
    "cryptography": ("signing.py",),
}


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = path.parent.relative_to(PKG).parts[: len(path.parent.relative_to(PKG).parts) - node.level + 1]
                out.add(".".join(("wdiff", *base, node.module or "")).rstrip("."))
            else:
                out.add(node.module or "")
    return out


def test_third_party_packages_stay_in_their_module():
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG).as_posix()
        for name in imports(path):
            top = name.split(".")[0]
            if top in OWNERS:
                assert rel.startswith(OWNERS[top]), f"{rel} imports {name}"


def test_the_library_never_imports_the_command_line():
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG).as_posix()
        if rel.startswith("cli/") or rel in ("__main__.py", "bench.py"):
            continue
        assert not any(n.startswith("wdiff.cli") for n in imports(path)), rel


def test_stores_know_nothing_of_bundles():
    for path in (PKG / "remotes").glob("*.py"):
        bad = {n for n in imports(path) if n.startswith(("wdiff.bundle", "wdiff.format", "wdiff.codecs", "wdiff.chain"))}
        assert not bad, (path.name, bad)


def test_import_wdiff_stays_light():
    code = "import sys, wdiff; heavy = [m for m in ('numpy', 'zstandard', 'typer', 'huggingface_hub') if m in sys.modules]; print(heavy)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"
