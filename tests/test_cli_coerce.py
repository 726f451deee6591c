"""wdiff.cli.coerce: typer 0.29's option values without pydantic, with the
same answers as typer's own coercion (and typer 0.28: nothing touched)."""

import functools
import os
import subprocess
import sys

import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st

from wdiff.cli import _lazy_group
from wdiff.cli.app import app
from wdiff.cli.coerce import Quick

HAS_COERCION = hasattr(typer, "_coercion") or os.path.exists(os.path.join(os.path.dirname(typer.__file__),
                                                                          "_coercion.py"))


@functools.lru_cache(maxsize=None)
def _params():
    group = _lazy_group(app)
    out = [(group, p) for p in group.params]
    for name in list(group.commands):
        cmd = group.commands[name]
        out += [(cmd, p) for p in cmd.params]
    return tuple(out)


def _outcome(rp, value, param, ctx):
    try:
        got = rp.coerce(value, param, ctx)
    except Exception as e:  # noqa: BLE001 - the answer compared is the refusal itself
        return ("raised", type(e).__name__, str(e))
    # repr: nan is a value too (nan != nan)
    return ("value", type(got).__name__, repr(tuple(got) if isinstance(got, list) else got))


def _ctx(cmd):
    from typer import _click as click

    return click.Context(cmd, info_name=cmd.name or "wdiff")


def test_quick_params_only_where_typer_coerces_through_pydantic():
    quick = [p for _, p in _params() if isinstance(getattr(p, "_runtime_param", None), Quick)]
    if not HAS_COERCION:  # typer 0.28: click's types, nothing to take past
        assert quick == []
        return
    # every option and argument of every command (--help aside: made when asked)
    assert len(quick) == len(_params()) > 100
    assert {"threads", "json_mode", "level", "exclude", "remote"} <= {p.name for p in quick}


@pytest.mark.skipif(not HAS_COERCION, reason="typer 0.28 coerces with click's types: nothing of wdiff's runs")
def test_quick_answers_as_typer_does(tmp_path):
    f = tmp_path / "file"
    f.write_bytes(b"x")
    values = ["0", "7", "007", "-0", "-3", "1_000", " 5", "5 ", "+5", "1e3", "1.5", "0.25", "-1.5", ".5", "5.",
              "", "-", "abc", "a b", "x\0y", str(f), str(tmp_path), str(tmp_path / "missing"), "9" * 30, "256",
              "257", "22", "23", "1", "-1", "nan", "inf", 0, 3, 300, True, False, None]
    checked = 0
    for cmd, p in _params():
        rp = getattr(p, "_runtime_param", None)
        if not isinstance(rp, Quick):
            continue
        ctx = _ctx(cmd)
        multi = p.multiple or p.nargs == -1
        for v in values:
            given_ = (v,) if multi and v is not None else v
            assert _outcome(rp, given_, p, ctx) == _outcome(rp.full(), given_, p, ctx), (cmd.name, p.name, v)
            checked += 1
        if multi:
            assert _outcome(rp, (), p, ctx) == _outcome(rp.full(), (), p, ctx)
            assert _outcome(rp, ("a", "1"), p, ctx) == _outcome(rp.full(), ("a", "1"), p, ctx)
    assert checked > 1000


def _kinds():
    """One parameter of each kind (annotation, bounds, one or many values)."""
    out = {}
    for cmd, p in _params():
        rp = getattr(p, "_runtime_param", None)
        if isinstance(rp, Quick):
            i = rp.descriptor.parameter_info
            out.setdefault((repr(rp.descriptor.annotation), i.min, i.max, p.multiple or p.nargs == -1), (cmd, p, rp))
    return list(out.values())


@pytest.mark.skipif(not HAS_COERCION, reason="typer 0.28 coerces with click's types: nothing of wdiff's runs")
def test_quick_answers_as_typer_does_for_any_text():
    kinds = [(cmd, p, rp, _ctx(cmd)) for cmd, p, rp in _kinds()]
    assert len(kinds) >= 8

    @settings(max_examples=300, deadline=None)
    @given(st.one_of(st.text(max_size=12), st.from_regex(r"-?[0-9]{1,20}(\.[0-9]{0,4})?", fullmatch=True)))
    def check(text):
        for cmd, p, rp, ctx in kinds:
            v = (text,) if p.multiple or p.nargs == -1 else text
            assert _outcome(rp, v, p, ctx) == _outcome(rp.full(), v, p, ctx), (cmd.name, p.name, text)

    check()


def test_a_command_and_its_help_never_import_pydantic(tmp_path):
    """The start-up guard: whatever typer is installed, pydantic stays out."""
    from factory import simple_pair

    a, b = simple_pair(tmp_path)
    code = ("import sys\nfrom wdiff.cli import main\n"
            f"rc = main(['diff', {str(a)!r}, {str(b)!r}, '-j', '2', '--json'])\n"
            "rc2 = main(['--help'])\n"
            "print('PYDANTIC' if any(m == 'pydantic' or m.startswith('pydantic.') for m in sys.modules) else 'CLEAN',"
            " rc, rc2)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "CLEAN 0 0", out.stderr[-2000:]


def test_arguments_read_as_typer_028_wrote_them():
    """Usage lines and the Arguments section of every command's help, under
    whichever typer is installed: ``{A B}`` (never ``{A B}...``), ``[DIR]``
    (never ``[[DIR]]``), and an argument's name without its type."""
    from typer import _click as click

    group = _lazy_group(app)
    seen = 0
    for name in list(group.commands):
        cmd = group.commands[name]
        ctx = click.Context(cmd, info_name=name)
        usage = cmd.get_usage(ctx)
        assert "[[" not in usage and "}..." not in usage, usage
        for p in cmd.params:
            if getattr(p, "param_type_name", "") != "argument" or not p.metavar:
                continue
            var = p.metavar
            want = var if var.startswith("[") else (f"{{{var}}}" if p.required else f"[{var}]")
            assert usage.endswith(" " + want) or f" {want} " in usage, (usage, want)
            assert p.get_help_record(ctx)[0] == var, (name, p.get_help_record(ctx))
            seen += 1
    assert seen >= 20
