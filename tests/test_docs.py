"""Man pages, completions and documented contracts stay true to the code."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from kit.cli import in_process

from wdiff.cli.app import app
from wdiff.cli.generate import check, render, render_all
from wdiff.errors import EXIT_CODE_TABLE

ROOT = Path(__file__).resolve().parent.parent
GROUP = typer.main.get_command(app)


def test_generated_files_are_committed_and_current():
    """Man pages, completions, and the site's reference pages (the command
    line, the Python API, the bundle format): `wdiff generate .` writes them."""
    assert check(str(ROOT), GROUP) == [], "run `wdiff generate .` and commit the result"


def test_generate_check_fails_on_drift_and_is_clean_from_a_fresh_interpreter(tmp_path):
    """`wdiff generate --check` as CI runs it: in a new process (what the API
    page shows must not depend on what else was imported), and failing on a
    reference page edited by hand."""
    def run(root):
        return subprocess.run([sys.executable, "-m", "wdiff", "generate", "--check", str(root)],
                              capture_output=True, text=True, timeout=120, cwd=ROOT,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)))

    r = run(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    for rel in render_all(GROUP):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, tmp_path / rel)
    cli = tmp_path / "docs" / "reference" / "cli.md"
    cli.write_text(cli.read_text().replace("--exit-code", "--exit-status", 1))
    r = run(tmp_path)
    assert r.returncode == 1 and r.stdout.strip() == "out of date: docs/reference/cli.md", r.stdout + r.stderr


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


def test_exit_codes_agree_across_help_man_and_docs():
    help_text = in_process("--help", want=0).out
    page = (ROOT / "docs" / "reference" / "exit-codes.md").read_text()
    man = (ROOT / "man" / "wdiff.1").read_text()
    rows = dict(re.findall(r"^\| (\d+) \| (.+?) \|$", page, re.M))
    assert {int(k) for k in rows} == {int(c) for c, _ in EXIT_CODE_TABLE}
    for code, text in EXIT_CODE_TABLE:
        assert re.search(rf"^\s+{int(code)}\s+{re.escape(text)}$", help_text, re.M), (code, help_text)
        assert rows[str(int(code))].replace("`", "") == text, code
        assert f".B {int(code)}\n{text.replace('-', chr(92) + '-')}" in man, code


# -- the README and the documentation site ---------------------------------------------------

DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
MARKDOWN = [ROOT / "README.md", *PAGES]
SETUP = [
    "python3 -m venv .venv && .venv/bin/pip install . && .venv/bin/wdiff demo",
    "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/pip uninstall -y -q torchvision torchaudio torchcodec "
    "&& .venv/bin/python -m pytest -q -n 2",
]


def _mkdocs(config: Path, site: Path) -> subprocess.CompletedProcess:
    # offline: any request for the network goes to a closed port
    dead = "http://127.0.0.1:9"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", HTTP_PROXY=dead, HTTPS_PROXY=dead, http_proxy=dead,
               https_proxy=dead, NO_PROXY="", no_proxy="")
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
                          capture_output=True, text=True, timeout=300, env=env)


def test_the_site_builds_offline_with_warnings_as_errors(tmp_path):
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    # plugins that fetch at build time (privacy, social: cairo and fonts) stay out
    assert config["plugins"] == ["search"], config["plugins"]
    assert config["theme"]["font"] is False, "web fonts would be fetched by every reader's browser"
    r = _mkdocs(ROOT / "mkdocs.yml", tmp_path / "site")
    assert r.returncode == 0, r.stderr[-4000:]
    assert "WARNING" not in r.stderr, r.stderr[-4000:]
    for page in PAGES:
        rel = page.relative_to(DOCS).with_suffix("")
        built = tmp_path / "site" / ("index.html" if rel.name == "index" else rel / "index.html")
        assert built.is_file(), f"{page} was not built"
    assert "fonts.googleapis.com" not in (tmp_path / "site" / "index.html").read_text()


def test_a_broken_link_or_anchor_fails_the_build(tmp_path):
    shutil.copytree(DOCS, tmp_path / "docs")
    shutil.copy2(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    guide = tmp_path / "docs" / "guides" / "pipelines.md"
    guide.write_text(guide.read_text() + "\n[gone](no-such-page.md) and [nowhere](../reference/cli.md#wdiff-frobnicate)\n")
    r = _mkdocs(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert r.returncode != 0
    assert "no-such-page.md" in r.stderr and "wdiff-frobnicate" in r.stderr, r.stderr[-3000:]


def test_the_readme_is_short_and_starts_with_the_two_set_up_commands():
    text = (ROOT / "README.md").read_text()
    lines = text.splitlines()
    assert len(lines) < 250, len(lines)
    blocks = re.findall(r"^```sh\n(.*?)\n```", text, re.S | re.M)
    assert blocks[:2] == SETUP
    first_heading = next(i for i, line in enumerate(lines) if line.startswith("## "))
    assert all(cmd in "\n".join(lines[:first_heading]) for cmd in SETUP), "the set-up commands come first"
    jobs = [i for i, line in enumerate(lines) if re.match(r"### [123]\. ", line)]
    assert len(jobs) == 3 and max(jobs) < 100, jobs
    # and CI runs the second of them exactly
    assert (ROOT / ".ci" / "run").read_text().rstrip().endswith(SETUP[1])


def test_readme_links_resolve():
    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert targets
    for t in targets:
        if "://" not in t:
            assert (ROOT / t).exists(), t


def test_every_json_schema_and_environment_variable_is_documented():
    from wdiff.cli.generate import ENVIRONMENT

    json_page = (DOCS / "reference" / "json.md").read_text()
    for path in sorted((ROOT / "wdiff" / "cli" / "schemas").glob("*.json")):
        name = __import__("json").loads(path.read_text())["properties"]["schema"]["const"]
        assert f"`{name}`" in json_page, name
    read = set()
    for path in (ROOT / "wdiff").rglob("*.py"):
        read |= set(re.findall(r"\bWDIFF_[A-Z_]+\b", path.read_text()))
    documented = {name for name, _ in ENVIRONMENT}
    assert read <= documented, read - documented
    env_page = (DOCS / "reference" / "environment.md").read_text()
    assert all(f"`{name}" in env_page for name in documented if name.startswith("WDIFF_")), documented


def test_every_command_has_examples_and_exit_notes():
    from wdiff.cli.generate import commands
    from wdiff.cli.help import EXAMPLES, EXIT_NOTES

    for c in commands(GROUP):
        assert any(line.startswith("wdiff ") or " wdiff " in line for line in EXAMPLES.get(c.name, [])), c.name
        assert EXIT_NOTES.get(c.name), c.name


def test_commands_in_the_docs_and_help_examples_are_real():
    """Every `wdiff ...` in the README, the site's pages and the --help
    examples names a real command and only options that command has."""
    from docscheck import check_command_line, shell_lines

    from wdiff.cli.help import EXAMPLES

    problems, seen = [], 0
    for path in MARKDOWN:
        for line in shell_lines(path.read_text()):
            seen += 1
            problems += [f"{path.relative_to(ROOT)}: {p}" for p in check_command_line(GROUP, line)]
    for name, lines in EXAMPLES.items():
        for line in lines:
            problems += [f"--help of {name}: {p}" for p in check_command_line(GROUP, line)]
    assert seen > 100 and not problems, "\n".join(problems)


def test_python_snippets_in_the_docs_use_the_real_api():
    from docscheck import check_python, fenced

    problems, seen = [], 0
    for path in MARKDOWN:
        if path.parent.name == "reference" and path.name == "api.md":
            continue  # generated from the same objects
        for block in fenced(path.read_text(), ("python",)):
            seen += 1
            problems += [f"{path.relative_to(ROOT)}: {p}" for p in check_python(block)]
    assert seen >= 8 and not problems, "\n".join(problems)


def test_the_readme_exit_codes_are_the_real_ones():
    text = (ROOT / "README.md").read_text()
    codes = {int(c) for arm in re.findall(r"^\s+([\d|]+)\) ", text, re.M) for c in arm.split("|")}
    assert codes and codes <= {int(c) for c, _ in EXIT_CODE_TABLE}, codes
    for comment in re.findall(r"#\s*((?:\d+(?:, | or | )?)+)\s+[a-z]", text):
        assert {int(c) for c in re.findall(r"\d+", comment)} <= {int(c) for c, _ in EXIT_CODE_TABLE}, comment


def _job(text: str, number: int) -> str:
    section = text.split(f"### {number}. ", 1)[1].split("\n### ", 1)[0].split("\n## ", 1)[0]
    return "\n".join(fenced_sh(section))


def fenced_sh(text: str) -> list[str]:
    from docscheck import fenced

    return fenced(text, ("sh",))


def test_the_readme_jobs_run_as_written(tmp_path):
    """The README's three jobs, run for real against a directory remote in
    place of the Hub: by hand on the demo's data; publishing three steps,
    one of them after a step whose push never happened (exit 5: published
    whole); and the cron lines, pulling into a directory and into a link."""
    text = (ROOT / "README.md").read_text()
    remote = tmp_path / "remote"
    by_hand = _job(text, 1)
    publish = _job(text, 2).replace("hf://acme/policy", str(remote))
    cron = []
    for line in _job(text, 3).splitlines():
        line = re.sub(r"^\*/5 \* \* \* \* ", "", line).replace("/opt/wdiff/.venv/bin/wdiff", "wdiff")
        cron.append(line.replace("hf://acme/policy", str(remote)).replace("/models/", f"{tmp_path}/models/")
                    .replace("/srv/", f"{tmp_path}/srv/"))
    script = f"""
set -e
wdiff() {{ "{sys.executable}" -m wdiff "$@"; }}
{by_hand}
cmp demo/B2/model-00001-of-00002.safetensors demo/B/model-00001-of-00002.safetensors
wdiff demo -q data
mkdir ckpt && cp -r data/A ckpt/step-0 && cp -r data/B ckpt/step-1
cp -r data/A ckpt/step-2 && echo '{{"step": 2}}' > ckpt/step-2/notes.json
cp -r data/B ckpt/step-3 && echo '{{"step": 3}}' > ckpt/step-3/notes.json
STEP=1 PREV=0
set +e   # the snippet branches on exit codes
{publish}
[ $? = 0 ] || exit 101
publish 3 2 2>/dev/null || exit 102   # step 2 was never pushed: 5, then step 3 whole
set -e
wdiff log --json "{remote}" > log.json
{chr(10).join(cron)}
"""
    env = dict(os.environ, PYTHONPATH=str(ROOT), NO_COLOR="1")
    r = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    import json

    entries = json.loads((tmp_path / "log.json").read_text())["entries"]
    assert [e["label"] for e in entries] == ["step-3", "step-1", "step-0"], entries
    for pulled in (tmp_path / "models" / "policy", tmp_path / "srv" / "policy" / "current"):
        assert (pulled / "notes.json").read_text() == '{"step": 3}\n'
        assert (pulled / ".wdiff" / "state.json").is_file()
    assert os.readlink(tmp_path / "srv" / "policy" / "current") != "step-0"


def test_files_and_modules_the_docs_name_exist():
    """A page that says `tests/test_x.py` checks something, or that
    `python -m wdiff.bench.y` prints a table, names a file that is there."""
    import importlib.util

    named = set()
    for path in MARKDOWN:
        text = path.read_text()
        for rel in re.findall(r"(?<![\w./])((?:tests|scripts|wdiff)/[\w/.-]+\.(?:py|c|json|5))\b", text):
            named.add(rel)
            assert (ROOT / rel).exists(), f"{path.relative_to(ROOT)} names {rel}"
        for module in re.findall(r"python -m (wdiff(?:\.\w+)*)", text):
            named.add(module)
            assert importlib.util.find_spec(module) is not None, f"{path.relative_to(ROOT)} names {module}"
    assert len(named) > 20, named
