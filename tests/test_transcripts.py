"""CLI transcripts: run every tests/transcripts/NAME.sh and compare what it
prints with NAME.sh.stdout, NAME.sh.stderr and NAME.sh.exit.

    UPDATE_TRANSCRIPTS=1 pytest tests/test_transcripts.py   rewrite them

The format, the environment and the redactions are described in
tests/transcripts/README.md. Every script runs in a fresh copy of the golden
checkpoints and bundles (tests/golden/data/) with `wdiff` standing for
`python -m wdiff` of this source tree. The scripts run at once, on a few
threads, before the first test that needs them (the module fixture `ran`)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from kit.cli import ok

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TRANSCRIPTS = HERE / "transcripts"
DATA = HERE / "golden" / "data"
SCRIPTS = sorted(p.name for p in TRANSCRIPTS.glob("*.sh"))
EXPECTED = (".stdout", ".stderr", ".exit")
UPDATE = os.environ.get("UPDATE_TRANSCRIPTS") == "1"

#: the `wdiff` of the scripts: it shows each command line on both streams,
#: so that every output can be read next to the command that printed it
WRAPPER = """#!/bin/sh
line='$ wdiff'
for a in "$@"; do line="$line $a"; done
printf '%s\\n' "$line"
printf '%s\\n' "$line" >&2
exec "$WDIFF_PYTHON" -m wdiff "$@"
"""


def workdir(root: Path, remote: Path | None) -> Path:
    """base/ sparse/ dense/ struct/, the golden bundles, corrupt/, keys/ and
    remote/ (a copy of ``remote``)."""
    work = root / "work"
    work.mkdir()
    for p in sorted(DATA.iterdir()):
        if p.name == "ckpt":
            for c in sorted(p.iterdir()):
                shutil.copytree(c, work / c.name)
        elif p.is_dir():
            shutil.copytree(p, work / p.name)
        elif p.suffix != ".md":
            shutil.copyfile(p, work / p.name)
    if remote is not None:
        shutil.copytree(remote, work / "remote")
    return work


def environment(root: Path, pycache: Path) -> dict[str, str]:
    """A small fixed environment; only WDIFF_NATIVE is passed through, so
    that the suite can run on the numpy kernels as well."""
    bin_ = root / "bin"
    bin_.mkdir()
    (bin_ / "wdiff").write_text(WRAPPER)
    (bin_ / "wdiff").chmod(0o755)
    (root / "home").mkdir()
    env = {
        "PATH": f"{bin_}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": str(root / "home"),
        "LC_ALL": "C.UTF-8",
        "LANG": "C.UTF-8",
        "TZ": "UTC",
        "NO_COLOR": "1",
        "COLUMNS": "100",
        "WDIFF_CACHE_DIR": str(root / "cache"),
        "WDIFF_PYTHON": sys.executable,
        "PYTHONPATH": str(ROOT),
        # compiled modules are shared by every run of the session (and never
        # written into the source tree)
        "PYTHONPYCACHEPREFIX": str(pycache),
        "HF_HUB_OFFLINE": "1",
    }
    if "WDIFF_NATIVE" in os.environ:
        env["WDIFF_NATIVE"] = os.environ["WDIFF_NATIVE"]
    return env


def version() -> str:
    return ok("--version", env={"PYTHONPATH": ROOT}).out.split()[1]


DATE = re.compile(r"\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\b")
KERNELS = re.compile(r"^(wdiff <VERSION>) \((?:C|numpy) kernels[^)\n]*\)$", re.M)
RELATIVE_L2 = re.compile(r'("relative_l2": )(-?\d[\d.eE+-]*)')


def redact(text: str, root: Path, work: Path, ver: str) -> str:
    """The substitutions documented in tests/transcripts/README.md."""
    for path, name in ((work, "$WORK"), (root / "cache", "$CACHE"), (root / "home", "$HOME"), (root, "$TMP")):
        for form in dict.fromkeys((str(path.resolve()), str(path))):
            text = text.replace(form, name)
    text = DATE.sub("YYYY-MM-DDTHH:MM:SSZ", text)
    text = text.replace(f"wdiff {ver}", "wdiff <VERSION>")
    text = KERNELS.sub(r"\1 (<KERNELS>)", text)
    text = RELATIVE_L2.sub(lambda m: f"{m[1]}~{float(m[2]):.5g}", text)
    return text


def bash(script: Path, work: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "--noprofile", "--norc", "-e", "-u", "-o", "pipefail", str(script)],
                          cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=120)


SEED_REMOTE = """\
wdiff push -q --anchor base remote --label step-0
wdiff push -q sparse.wdb remote --label step-1
"""


def seed_remote(root: Path, pycache: Path) -> Path:
    """The remote/ of every work directory, pushed once per session."""
    work = workdir(root, None)
    (root / "seed.sh").write_text(SEED_REMOTE)
    r = bash(root / "seed.sh", work, environment(root, pycache))
    assert r.returncode == 0, r.stderr.decode()
    return work / "remote"


def run_script(name: str, root: Path, ver: str, remote: Path, pycache: Path) -> dict[str, str]:
    work = workdir(root, remote)
    r = bash(TRANSCRIPTS / name, work, environment(root, pycache))
    return {
        ".stdout": redact(r.stdout.decode("utf-8", "backslashreplace"), root, work, ver),
        ".stderr": redact(r.stderr.decode("utf-8", "backslashreplace"), root, work, ver),
        ".exit": f"{r.returncode}\n",
    }


@pytest.fixture(scope="module")
def ran(request, tmp_path_factory):
    wanted = [item.callspec.params["script"] for item in request.session.items
              if item.module is request.module and hasattr(item, "callspec") and "script" in item.callspec.params]
    if not wanted:
        return {}
    pycache = tmp_path_factory.getbasetemp() / "pycache"
    ver = version()
    remote = seed_remote(tmp_path_factory.mktemp("seed"), pycache)
    with ThreadPoolExecutor(max(2, min(4, os.cpu_count() or 2))) as pool:
        futures = {s: pool.submit(run_script, s, tmp_path_factory.mktemp(s.removesuffix(".sh")), ver, remote, pycache)
                   for s in dict.fromkeys(wanted)}
        return {s: f.result() for s, f in futures.items()}


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS)
def test_transcript(script, ran):
    got = ran[script]
    if UPDATE:
        for suffix, text in got.items():
            (TRANSCRIPTS / (script + suffix)).write_text(text)
        return
    missing = [script + s for s in EXPECTED if not (TRANSCRIPTS / (script + s)).exists()]
    assert not missing, f"no expected output {missing}: run UPDATE_TRANSCRIPTS=1 pytest {__file__}"
    for suffix in EXPECTED:
        want = (TRANSCRIPTS / (script + suffix)).read_text()
        assert got[suffix] == want, f"{script}{suffix} differs (UPDATE_TRANSCRIPTS=1 rewrites it)"


def test_every_expected_file_has_its_script():
    orphans = [p.name for p in TRANSCRIPTS.iterdir()
               if p.name.endswith(EXPECTED) and p.name.rsplit(".", 1)[0] not in SCRIPTS]
    assert not orphans, f"expected outputs without a script: {orphans}"


def test_there_are_transcripts():
    assert len(SCRIPTS) >= 20


def test_redaction_leaves_other_text_alone(tmp_path):
    """The substitutions hit only what they name."""
    work = tmp_path / "work"
    text = (f"{work}/x {tmp_path}/cache 2026-12-01T13:47:04Z wdiff 9.9.9 wdiff 0.0.1 (C kernels) "
            '"relative_l2": 0.02645170567289382, "max_abs_change": 0.005126953125 2026-12-01\n'
            "wdiff 9.9.9 (numpy kernels: WDIFF_NATIVE=0)\nwdiff 9.9.9 (C kernels)\nWDIFF_NATIVE=0 (numpy kernels)\n")
    assert redact(text, tmp_path, work, "9.9.9") == (
        "$WORK/x $CACHE YYYY-MM-DDTHH:MM:SSZ wdiff <VERSION> wdiff 0.0.1 (C kernels) "
        '"relative_l2": ~0.026452, "max_abs_change": 0.005126953125 2026-12-01\n'
        "wdiff <VERSION> (<KERNELS>)\nwdiff <VERSION> (<KERNELS>)\nWDIFF_NATIVE=0 (numpy kernels)\n")
