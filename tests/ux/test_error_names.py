"""A name in an error message is escaped once: a newline reads ``\\x0a``
and a backslash ``\\\\`` (so that the two cannot be confused), whether the
name came from the command line or from a file inside a checkpoint, and no
control character of it reaches the terminal."""

from __future__ import annotations

from kit.cli import run


def test_a_file_name_inside_a_checkpoint_is_escaped_once(tmp_path):
    A = tmp_path / "A"
    A.mkdir()
    (A / "bad\nna\\me.safetensors").write_bytes(b"garbage")
    r = run("diff", A, A)
    assert r.returncode == 2, r.stderr
    assert "file name bad\\x0ana\\\\me.safetensors is not a plain relative path" in r.stderr, r.stderr
    assert "\\\\x0a" not in r.stderr, r.stderr
    assert r.stderr.count("\n") == 2, r.stderr  # the error and its hint: no newline of the name


def test_a_path_on_the_command_line_reaches_the_terminal_without_its_controls(tmp_path):
    missing = tmp_path / "no\nsuch\x1b[31mdir"
    r = run("diff", missing, tmp_path)
    assert r.returncode == 3, r.stderr
    assert "no\\x0asuch\\x1b[31mdir" in r.stderr, r.stderr
    assert "\x1b" not in r.stderr and r.stderr.count("\n") <= 2, r.stderr
