"""weir: mix, tokenize and pack training data for LLM training.

Commands: validate, plan, build, inspect, lookup, epochs, diff, calibrate, export-megatron, demo-data, ui.

The cheap loop: weir plan MIX (seconds, from tokenized documents), edit the mix file, plan again, then weir build MIX.
"""

from __future__ import annotations

import typer

from pipelines import cli_build, cli_inspect, cli_plan, cli_tools

__all__ = ["app"]

# the commands live in modules named after what they work on (cli_plan: a mix file; cli_build: a build; cli_inspect:
# a finished build; cli_tools: the rest); registered here, in this order, which is the order `weir --help` lists
app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__, pretty_exceptions_enable=False)
app.command()(cli_plan.validate)
app.command()(cli_build.build)
app.command()(cli_inspect.inspect)
app.command()(cli_inspect.lookup)
app.command()(cli_inspect.epochs)
app.command()(cli_inspect.diff)
app.command()(cli_tools.calibrate)
app.command("export-megatron")(cli_tools.export_megatron)
app.command("plan")(cli_plan.plan_cmd)
app.command("demo-data")(cli_tools.demo_data)
app.command()(cli_tools.ui)


if __name__ == "__main__":
    from pipelines.entry import run_and_exit

    run_and_exit(app)
