"""The command line hands its options to the library by name (wdiff.cli.common.call):
an option reaches the parameter of the same name, a converted value wins, None
leaves the library's default, and an option that names no parameter is a bug
caught on the first run, not an option silently dropped."""

import pytest

from wdiff.cli.common import PRESENTATION, call


def lib(a, b=None, *, level: int = 3, names=(), reporter=None):
    return dict(a=a, b=b, level=level, names=names, reporter=reporter)


def test_each_option_reaches_the_parameter_of_its_name():
    got = call(lib, {"a": "x", "b": "y", "level": 9, "names": ["n"]})
    assert got == dict(a="x", b="y", level=9, names=["n"], reporter=None)


def test_none_leaves_the_librarys_default_and_a_given_value_wins():
    got = call(lib, {"a": "x", "b": None, "level": None, "names": None}, level=5, reporter="r")
    assert got == dict(a="x", b=None, level=5, names=(), reporter="r")
    # a parameter without a default gets the None it was given
    assert call(lib, {"a": None})["a"] is None


def test_output_options_and_the_commands_own_stay_out_of_the_call():
    options = {"a": "x", "json_mode": True, "quiet": False, "verbose": 2, "stat": True}
    assert call(lib, options, cli=("stat",))["a"] == "x"
    assert PRESENTATION == {"json_mode", "quiet", "verbose"}


def test_an_option_that_names_no_parameter_is_refused():
    with pytest.raises(TypeError, match="'stat'.*names no parameter of lib"):
        call(lib, {"a": "x", "stat": True})
    with pytest.raises(TypeError, match="'lvl' names no parameter"):
        call(lib, {"a": "x"}, lvl=3)
    with pytest.raises(TypeError, match="not options of the command"):
        call(lib, {"a": "x"}, cli=("gone",))

