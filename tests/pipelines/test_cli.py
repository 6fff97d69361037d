"""``pipelines/cli.py``: the ``weir`` app itself. Each command comes from the module named after what it works on
(cli_plan: a mix file; cli_build: a build; cli_inspect: a finished build; cli_tools: the rest), registered in the
order ``weir --help`` lists them; ``python -m pipelines.cli`` runs the app, and with no command prints its help.
(Each command's behaviour: the namesake test of its module, tests/pipelines/test_cli_<module>.py.)"""

from __future__ import annotations

import re

import typer.main

from pipelines.cli import app
from tests.pipelines.cli_helpers import weir

# the commands in the order cli.py registers them, each with the module that holds it
COMMANDS = {
    "validate": "pipelines.cli_plan",
    "build": "pipelines.cli_build",
    "inspect": "pipelines.cli_inspect",
    "lookup": "pipelines.cli_inspect",
    "epochs": "pipelines.cli_inspect",
    "diff": "pipelines.cli_inspect",
    "calibrate": "pipelines.cli_tools",
    "export-megatron": "pipelines.cli_tools",
    "plan": "pipelines.cli_plan",
    "demo-data": "pipelines.cli_tools",
    "ui": "pipelines.cli_tools",
}


def listed(help_text: str) -> list[str]:
    """The command names of ``--help``'s Commands panel, top to bottom (a description's next lines are indented)."""
    panel = help_text[help_text.index("Commands") :]
    return re.findall(r"^│ ([a-z][a-z-]*) ", panel, flags=re.MULTILINE)


def test_each_command_is_registered_from_the_module_named_after_what_it_works_on() -> None:
    names = list(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
    modules = [c.callback.__module__ for c in app.registered_commands if c.callback is not None]
    assert dict(zip(names, modules, strict=True)) == COMMANDS
    assert names == list(COMMANDS)


def test_python_m_pipelines_cli_runs_the_app_and_help_lists_the_commands_in_their_order() -> None:
    r = weir("--help")
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    assert r.stdout.lstrip().startswith("Usage: python -m pipelines.cli [OPTIONS] COMMAND [ARGS]..."), r.stdout
    assert listed(r.stdout) == list(COMMANDS), r.stdout


def test_no_command_prints_the_help() -> None:
    r = weir()
    assert r.returncode != 0 and "Usage: python -m pipelines.cli" in r.stdout, r.stdout + r.stderr
    assert listed(r.stdout) == list(COMMANDS), r.stdout
