"""``python -m coordinator demo`` hands every option to the demo's own parser; these tests stop
at argument parsing (or at the demo's own checks), so no demo runs."""

from __future__ import annotations

import pytest

from foldplane import cli


def test_demo_help_lists_its_options(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["demo", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    # called from a program, the help names the form that works anywhere foldplane is installed
    assert "usage: python -m foldplane.coordinator demo" in out
    assert "--db" in out and "--port" in out


def test_demo_db_reaches_the_demo(tmp_path, capsys):
    existing = tmp_path / "log.db"
    existing.write_bytes(b"")
    with pytest.raises(SystemExit) as done:
        cli.main(["demo", "--db", str(existing), "--port", "1"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert f"{existing} exists; the demo writes a new log" in err
    assert existing.read_bytes() == b""  # refused before anything was written


def test_an_unknown_demo_option_is_named_by_the_demo(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["demo", "--dbb", "x"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "python -m foldplane.coordinator demo: error" in err
    assert "unrecognized arguments: --dbb x" in err


def test_other_commands_still_reject_unknown_options(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["token", "--group", "g", "--rank", "0", "--bogus"])
    assert done.value.code == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err
