"""The command line builds only the subcommand it runs (wdiff.cli._lazy_group),
and the group it builds is the one typer would build, command for command."""

import typer
from typer import _click as click

from wdiff.cli import _lazy_group
from wdiff.cli.app import app
from wdiff.cli.coerce import quicken


def test_the_lazy_group_is_typers_group_command_for_command():
    full, lazy = typer.main.get_command(app), _lazy_group(app)
    for cmd in [full, *full.commands.values()]:  # typer 0.29: the text wdiff keeps (wdiff.cli.coerce)
        quicken(cmd)
    assert list(lazy.commands) == list(full.commands)
    assert lazy.get_help(click.Context(lazy, info_name="wdiff")) == full.get_help(click.Context(full, info_name="wdiff"))
    for name, cmd in full.commands.items():
        mine = lazy.commands[name]
        assert mine.get_help(click.Context(mine, info_name=name)) == cmd.get_help(click.Context(cmd, info_name=name))
        assert [p.name for p in mine.params] == [p.name for p in cmd.params]


def test_running_one_command_builds_that_command_alone():
    lazy = _lazy_group(app)
    assert lazy.commands.get("diff") is lazy.commands["diff"]  # built once, then kept
    assert set(lazy.commands._built) == {"diff"}
    assert lazy.commands.get("no-such-command") is None
