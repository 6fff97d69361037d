"""The checks of a mix's assets and the figures they record: what each check judges, which ones block what
follows, and the metadata values Dagster plots.

Every check here is a pure function of a stage's result (no Dagster context), so the CLI and the tests judge
with the same code the UI shows.
"""

from typing import Any

import dagster as dg

from mixing import BuildLayout, Mix
from mixing.continuation import Base
from mixing.plan.mixture import GOAL_PHASE, GOAL_WINDOW, MixtureReport, goal_text, unit_goal

__all__ = [
    "BLOCKING_CHECKS",
    "check_specs",
    "continuation",
    "float_value",
    "int_value",
    "mixture_check",
    "stream_check",
]

BLOCKING_CHECKS = frozenset(
    {"planned_documents_exist", "token_budget_per_phase", "manifest_checksums", "prefix_unchanged"}
)
"""Checks whose failure stops what follows (``blocking``): a stage after a plan that draws missing pieces or runs
short, or after shards that do not match their manifest or a continuation's base, would build on a wrong
result. The goals (``mixture_error``, ``packing_efficiency``: WARN) and the rest report without stopping."""


def int_value(value: Any) -> dg.IntMetadataValue:
    """A count as Dagster's int metadata (numpy's integers are not ``int``: they would be stored as text)."""
    return dg.MetadataValue.int(int(value))


def float_value(value: Any) -> dg.FloatMetadataValue:
    """A figure as Dagster's float metadata, which the asset's *Plots* tab draws across materializations."""
    return dg.MetadataValue.float(float(value))


def continuation(
    mix: Mix, layout: BuildLayout, storage_options: dict[str, object] | None
) -> tuple[dict[str, Any], list[Any]]:
    """A continuation's metadata (its base, the switch step, the lineage) and its ``prefix_unchanged`` check;
    nothing for a build of its own. ``storage_options``: fsspec's, for a base in an object store."""
    if mix.continues is None:
        return {}, []
    base = Base(mix.continues.base, mix.continues.at, storage_options)
    problems = base.prefix_problems(layout.shard_set())
    at = mix.continues.at
    meta = {
        "continues": dg.MetadataValue.path(mix.continues.base),
        "continues_build_id": base.build_id,
        "switch_step": int_value(at),
        "lineage": dg.MetadataValue.md(
            "\n".join(f"- {e.base[:12]}… → this build at step {e.at} (base mix {e.base_mix})" for e in base.lineage())
        ),
    }
    check = dg.AssetCheckResult(
        check_name="prefix_unchanged",
        passed=not problems,
        description=f"steps 0..{at - 1} identical to the base ({at} digests, the base's shard files)"
        if not problems
        else "; ".join(problems),
        metadata={"switch_step": int_value(at)},
    )
    return meta, [check]


def check_specs(asset: dg.AssetKey, described: dict[str, str]) -> list[dg.AssetCheckSpec]:
    """One check spec per ``name: description`` on ``asset``, blocking when named in :data:`BLOCKING_CHECKS`."""
    return [
        dg.AssetCheckSpec(name, asset=asset, description=text, blocking=name in BLOCKING_CHECKS)
        for name, text in described.items()
    ]


def mixture_check(
    window: float, phase: float, what: str, units: tuple[float, float], unit: str = "sequence"
) -> dg.AssetCheckResult:
    """The ``mixture_error`` check (WARN) against docs/design.md's goals, with both figures in its one line;
    where one whole ``unit`` (sequence, or the plan's document) is a larger share of a window or of the
    smallest phase (``units``, see :func:`mixing.plan.mixture.unit_goal`), the goal is that share, and the
    line says so."""
    goal_w, goal_p = unit_goal(GOAL_WINDOW, units[0]), unit_goal(GOAL_PHASE, units[1])
    return dg.AssetCheckResult(
        check_name="mixture_error",
        passed=bool(window <= goal_w and phase <= goal_p),
        severity=dg.AssetCheckSeverity.WARN,
        description=f"{what}: window {window:.4f} (goal {goal_text(GOAL_WINDOW, units[0], window, 'a window', unit)}), "
        f"phase {phase:.4f} (goal {goal_text(GOAL_PHASE, units[1], phase, 'the smallest phase', unit)})",
        metadata={
            "window": float_value(window),
            "phase": float_value(phase),
            "goal_window": float_value(goal_w),
            "goal_phase": float_value(goal_p),
        },
    )


def stream_check(root: BuildLayout, built: MixtureReport) -> dg.AssetCheckResult:
    """The ``mixture_error`` check of the build's steps and, when the mix file regroups them, of the stream
    the trainer receives (:func:`assets.stream.stream_report`): the worse of the two is judged."""
    regroup = root.shard_set().manifest.regrouping
    if regroup.window <= 1:
        return mixture_check(built.window, built.phase, "realized after packing", (built.unit_window, built.unit_phase))
    from assets.stream import stream_report

    st = stream_report(root)
    return mixture_check(
        max(built.window, st.window),
        max(built.phase, st.phase),
        f"build's steps {built.window:.4f} / {built.phase:.4f}; trainer's stream (regroup window "
        f"{regroup.window}, period {regroup.period})",
        (max(built.unit_window, st.unit_window), max(built.unit_phase, st.unit_phase)),
    )
