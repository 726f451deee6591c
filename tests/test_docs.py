"""Man pages, completions and documented contracts stay true to the code."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import typer
from kit.cli import in_process

from wdiff.cli.app import app
from wdiff.cli.generate import check, render
from wdiff.errors import EXIT_CODE_TABLE

ROOT = Path(__file__).resolve().parent.parent
GROUP = typer.main.get_command(app)


def test_generated_files_are_committed_and_current():
    assert check(str(ROOT), GROUP) == [], "run `wdiff generate` and commit the result"


def test_generation_is_deterministic():
    assert render(GROUP) == render(GROUP)


@pytest.mark.skipif(shutil.which("groff") is None, reason="groff is not installed")
def test_man_pages_render_without_warnings():
    pages = sorted((ROOT / "man").glob("*.[15]"))
    assert {p.name for p in pages} >= {"wdiff.1", "wdiff-diff.1", "wdiff-pull.1", "wdiff-format.5"}
    for page in pages:
        r = subprocess.run(["groff", "-t", "-man", "-ww", "-z", str(page)], capture_output=True)
        assert r.returncode == 0 and r.stdout == b"" and r.stderr == b"", (page.name, r.stderr)


def complete(words: list[str]) -> list[str]:
    script = (
        f"source {ROOT / 'completions' / 'wdiff.bash'}\n"
        f"COMP_WORDS=({' '.join(repr(w) for w in words)})\n"
        f"COMP_CWORD={len(words) - 1}\n"
        "_wdiff\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    r = subprocess.run(["bash", "--norc", "--noprofile", "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return [x for x in r.stdout.splitlines() if x]


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_bash_completion_completes_commands_and_options():
    assert set(complete(["wdiff", ""])) >= {"diff", "pack", "apply", "push", "pull", "log", "status", "squash"}
    assert complete(["wdiff", "pu"]) == ["pull", "push"] or sorted(complete(["wdiff", "pu"])) == ["pull", "push"]
    assert "--exit-code" in complete(["wdiff", "diff", "--e"])
    assert set(complete(["wdiff", "pull", "--"])) >= {"--to", "--json", "--quiet", "--threads"}
    assert "--in-place" in complete(["wdiff", "apply", "x.wdb", "--in"])
    # a value for --threads is a number: no file names offered
    assert complete(["wdiff", "diff", "--threads", ""]) == []
    # positional arguments complete file names
    assert "README.md" in complete(["wdiff", "diff", "READ"])


@pytest.mark.parametrize("shell,flag", [("zsh", "-n"), ("fish", "--no-execute")])
def test_other_completions_parse(shell, flag):
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed")
    name = {"zsh": "_wdiff", "fish": "wdiff.fish"}[shell]
    r = subprocess.run([shell, flag, str(ROOT / "completions" / name)], capture_output=True)
    assert r.returncode == 0, r.stderr


def test_exit_codes_agree_across_help_man_and_readme():
    help_text = in_process("--help", want=0).out
    readme = (ROOT / "README.md").read_text()
    man = (ROOT / "man" / "wdiff.1").read_text()
    readme_rows = dict(re.findall(r"^\| (\d+) \| (.+?) \|$", readme, re.M))
    assert {int(k) for k in readme_rows} == {int(c) for c, _ in EXIT_CODE_TABLE}
    for code, text in EXIT_CODE_TABLE:
        assert re.search(rf"^\s+{int(code)}\s+{re.escape(text)}$", help_text, re.M), (code, help_text)
        assert readme_rows[str(int(code))].replace("`", "") == text, code
        assert f".B {int(code)}\n{text.replace('-', chr(92) + '-')}" in man, code
