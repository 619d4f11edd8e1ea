"""The command line itself: help, usage errors, the subcommand hook, option plumbing."""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import types
from pathlib import Path

import pytest
from launch_util import ringworld

from ringworld.launch import cli

SRC = Path(cli.__file__).resolve().parents[1]

pytestmark = pytest.mark.timeout(60)


def test_top_level_help_lists_the_commands(capsys) -> None:
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "usage: ringworld" in out
    assert "run" in out and "start N ranks of a program" in out
    has_bench = importlib.util.find_spec("ringworld.bench") is not None and (
        importlib.util.find_spec("ringworld.bench.cli") is not None
    )
    assert ("bench" in out) == has_bench


def test_run_help_documents_every_option(capsys) -> None:
    assert cli.main(["run", "--help"]) == 0
    out = capsys.readouterr().out
    for option in ("-n N, --np N", "--tag-output", "--transport {auto,shm,tcp}",
                   "--timeout SECONDS", "--bind ADDR", "--grace SECONDS", "-m MODULE", "-c CODE",
                   "exit status", "ringworld run -n 4 python examples/hello.py"):
        assert option in out, option


def test_no_command_prints_help_and_fails(capsys) -> None:
    assert cli.main([]) == 2
    assert "usage: ringworld" in capsys.readouterr().err


def test_unknown_command_is_a_clear_error(capsys) -> None:
    assert cli.main(["frobnicate", "-n", "2"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'frobnicate'" in err
    assert "'run'" in err


@pytest.mark.parametrize(("argv", "message"), [
    (["run"], "missing PROGRAM"),
    (["run", "-n", "2"], "missing PROGRAM"),
    (["run", "--"], "missing PROGRAM"),
    (["run", "-m"], "-m needs a MODULE"),
    (["run", "-c"], "-c needs CODE"),
    (["run", "-n", "0", "prog"], "0 must be at least 1"),
    (["run", "-n", "two", "prog"], "'two' is not an integer"),
    (["run", "--timeout", "0", "prog"], "must be positive"),
    (["run", "--timeout", "nan", "prog"], "must be positive"),
    (["run", "--grace", "-1", "prog"], "must be at least 0"),
    (["run", "--transport", "carrier-pigeon", "prog"], "invalid choice: 'carrier-pigeon'"),
])
def test_usage_errors(capsys, argv: list[str], message: str) -> None:
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


def test_version(capsys) -> None:
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("ringworld ")


@pytest.mark.parametrize(("argv", "expected"), [
    (["prog.py", "a"], [sys.executable, "prog.py", "a"]),
    (["python3", "x.py", "-n", "3"], ["python3", "x.py", "-n", "3"]),
    (["--", "-weird-name", "x"], ["-weird-name", "x"]),
    (["-m", "pkg.mod", "--flag", "-c", "v"],
     [sys.executable, "-m", "pkg.mod", "--flag", "-c", "v"]),
    (["-c", "print(1)", "-m", "x"], [sys.executable, "-c", "print(1)", "-m", "x"]),
    (["-n", "3", "--tag-output", "prog", "--tag-output"], ["prog", "--tag-output"]),
])
def test_program_argv(argv: list[str], expected: list[str]) -> None:
    args = cli.build_parser(load_subcommands=False).parse_args(["run", *argv])
    assert cli.program_argv(args) == expected


def test_options_after_program_belong_to_the_program() -> None:
    args = cli.build_parser(load_subcommands=False).parse_args(
        ["run", "-n", "2", "prog", "-n", "5", "--grace", "9"])
    assert args.np == 2
    assert args.grace == 1.0
    assert args.program == ["prog", "-n", "5", "--grace", "9"]


def test_subcommand_modules_plug_in(monkeypatch, capsys) -> None:
    seen: list[argparse.Namespace] = []
    fake = types.ModuleType("ringworld_test_fake_cli")

    def handler(args: argparse.Namespace) -> int:
        seen.append(args)
        return 42

    def add_parser(subparsers) -> None:
        p = subparsers.add_parser("fake", help="a fake subcommand for tests")
        p.add_argument("--size", type=int)
        p.set_defaults(func=handler)

    fake.add_parser = add_parser  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ringworld_test_fake_cli", fake)
    monkeypatch.setattr(cli, "SUBCOMMAND_MODULES", ("ringworld_test_no_such_module.cli",
                                                    "ringworld_test_fake_cli"))
    assert cli.main(["fake", "--size", "8"]) == 42
    assert seen[0].size == 8
    assert cli.main(["--help"]) == 0
    assert "a fake subcommand for tests" in capsys.readouterr().out


def test_run_does_not_import_subcommand_modules(monkeypatch) -> None:
    def explode(subparsers) -> None:
        raise AssertionError("run must not load other subcommands")

    fake = types.ModuleType("ringworld_test_explode_cli")
    fake.add_parser = explode  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ringworld_test_explode_cli", fake)
    monkeypatch.setattr(cli, "SUBCOMMAND_MODULES", ("ringworld_test_explode_cli",))
    assert cli.main(["run", "-n", "1", "true"]) == 0


def test_absent_subcommand_modules_are_skipped(monkeypatch, capsys) -> None:
    monkeypatch.setattr(cli, "SUBCOMMAND_MODULES", ("ringworld.launch.cli_does_not_exist",
                                                    "ringworld_no_such_package.cli"))
    assert cli.main(["--help"]) == 0
    assert "COMMAND" in capsys.readouterr().out


def test_broken_subcommand_module_is_not_hidden(monkeypatch, tmp_path) -> None:
    pkg = tmp_path / "rwtest_broken_plugin"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "cli.py").write_text("import rwtest_dependency_that_is_missing\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(cli, "SUBCOMMAND_MODULES", ("rwtest_broken_plugin.cli",))
    with pytest.raises(ModuleNotFoundError, match="rwtest_dependency_that_is_missing"):
        cli.build_parser()


def test_launcher_modules_do_not_import_numpy() -> None:
    # Bypass ringworld/__init__ (the public API may need numpy); everything `ringworld run`
    # itself loads must stay light, because its start-up is part of every job's.
    code = (
        "import sys, types\n"
        f"pkg = types.ModuleType('ringworld'); pkg.__path__ = [{str(SRC)!r}]\n"
        "sys.modules['ringworld'] = pkg\n"
        "import ringworld.launch.cli, ringworld.launch.procset, ringworld.launch.job\n"
        "import ringworld.store.tcp, ringworld.__main__\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'numpy'))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "[]\n"


def test_bind_to_wildcard_hands_ranks_a_loopback_store(tmp_path) -> None:
    r = ringworld("run", "-n", "2", "--bind", "0.0.0.0", "sh", "-c",
                  'echo "$RINGWORLD_STORE $RINGWORLD_BIND"')
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and lines[0] == lines[1]
    store, bind = lines[0].split()
    assert store.startswith("127.0.0.1:") and bind == "0.0.0.0"


def test_unusable_bind_address_is_a_clear_error() -> None:
    r = ringworld("run", "-n", "2", "--bind", "203.0.113.9", "true")  # TEST-NET: not ours
    assert r.returncode == 1
    assert r.stderr.startswith("ringworld: cannot serve the job store on 203.0.113.9: ")
    assert "Traceback" not in r.stderr
