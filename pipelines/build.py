"""A build of a mix as one Dagster run: the job ``build_<mix>``, one op per stage and partition of
:data:`mixing.stages.STAGES`, and ``weir build``'s in-process run of it, shown on a console (the stages'
warnings as lines, tokenization as progress bars: :mod:`pipelines.display`).

Why ops and not an asset job: Dagster runs one partition of an asset per run, and a build is every partition of
the per-source stages (``source_index``, ``documents``) between whole-mix ones (``tokenizer``, ``length_stats``,
...), so no asset job holds a build. Each op materializes its stage's asset (:func:`assets.mix_assets`) for one
partition as Dagster does it, in a throwaway instance (the asset's own context, checks, and a blocking check
failing it), and reports what that recorded in the build's run (:mod:`pipelines.relay`): the materialization under
the asset's key and partition, the checks' evaluations, the log lines. A failed blocking check stops the run
there, so the stages after it are not built. The UI shows the run with every materialization and check, and the
assets show them as theirs.

A run of ``build_<mix>`` with no partition is a whole build. A run for one source (what the nightly schedule
and the source sensor request, or ``dg launch --job build_<mix> --partition <source>``) re-indexes that source
only; the later stages' ops do nothing in it, and automation builds them (:mod:`pipelines.automation`).
"""

# No `from __future__ import annotations` here: Dagster reads the ops' context annotation as a class.
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dagster as dg
from dagster import OpExecutionContext

from assets import WeirEngine, mix_assets
from contract.errors import WeirError
from contract.redaction import redact_url
from contract.store import is_local
from mixing import Mix, stages
from mixing.engine import Engine, LocalEngine
from pipelines import PROJECT_ROOT
from pipelines.display import step_line, warnings_to
from pipelines.relay import recorded
from pipelines.resources import engine_resource, mix_storage_options, storage_resource

__all__ = [
    "BUILD_TAG",
    "ELSEWHERE_TAG",
    "OUT_TAG",
    "BlockingCheckFailed",
    "build_job",
    "build_mix",
    "build_tags",
    "ui_build_root",
    "ui_output",
]

BUILD_TAG = "weir/build"
"""Run tag of a whole build: ``cli`` (``weir build``) or ``ui`` (a run of ``build_<mix>`` with no partition).
Automation does not take a whole build's materializations for news to act on (:mod:`pipelines.automation`)."""
OUT_TAG = "weir/out"
"""Run tag of a ``weir build``: the output it built (credentials redacted)."""
ELSEWHERE_TAG = "weir/elsewhere"
"""Run tag (``true``) of a ``weir build`` into another output than the mix's own folder (:func:`ui_output`):
automation ignores its materializations altogether, so an experiment never stands for the mix's own build."""


_QUIET = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}  # Dagster's console log, silenced


class BlockingCheckFailed(WeirError):
    """A blocking check of a stage failed: the stages after it were not built."""


def ui_build_root(env: Mapping[str, str] = os.environ) -> str:
    """Where the Dagster definitions build: ``$WEIR_BUILD_ROOT`` (a folder or an ``s3://`` URL), else ``build/``
    in the checkout."""
    return env.get("WEIR_BUILD_ROOT") or str(PROJECT_ROOT / "build")


def ui_output(mix: Mix, root: Path | str | None = None) -> Path | str:
    """The mix's own output: the folder (resolved) or URL the definitions' ``storage`` resource builds it in
    under ``root`` (default :func:`ui_build_root`)."""
    root = str(root or ui_build_root())
    if is_local(root):
        return Path(root.removeprefix("file://")).expanduser().resolve() / mix.name
    return f"{root.rstrip('/')}/{mix.name}"


def build_tags(mix: Mix, dest: Path | str, root: Path | str | None = None) -> dict[str, str]:
    """The run tags of ``weir build`` of ``mix`` into ``dest``: :data:`BUILD_TAG`, :data:`OUT_TAG`, and
    :data:`ELSEWHERE_TAG` unless ``dest`` is the mix's own output under ``root`` (:func:`ui_output`)."""
    own = ui_output(mix, root)
    if isinstance(own, Path):
        here = is_local(str(dest)) and Path(str(dest).removeprefix("file://")).expanduser().resolve() == own
    else:
        here = str(dest).rstrip("/") == own
    return {BUILD_TAG: "cli", OUT_TAG: redact_url(str(dest))} | ({} if here else {ELSEWHERE_TAG: "true"})


def build_mix(
    mix: Mix,
    out: Path | str,
    say: Callable[[str], None] = print,
    instance: dg.DagsterInstance | None = None,
    engine: WeirEngine | None = None,
    tags: Mapping[str, str] | None = None,
) -> None:
    """Build ``mix`` into ``out`` (a local folder, or an fsspec URL: see :class:`assets.WeirStorage`) as one run
    of its job ``build_<mix>`` (:func:`build_job`), in this process: every stage of :data:`mixing.stages.STAGES`
    in its order, a per-source stage once per source (sorted), each materialization and check recorded in the
    run. ``engine`` runs the stages' fan-out work (default: the ``local`` engine, in this process). On a cluster
    engine, a stage with work to start ahead (:meth:`mixing.stage.Stage.run_ahead`: every source's chunks)
    submits all of it before its first partition, so the cluster tokenizes the sources side by side while the
    run collects them one after another.

    The run is recorded in ``instance`` (default: a throwaway one; pass the UI's to see the build there) with
    :data:`BUILD_TAG` ``cli`` and ``tags``. A stage that fails raises its own error (a ``PlanError``, a
    ``ShardError``, ..., or Dagster's step error wrapping it as ``user_exception``), a failed blocking check
    :class:`BlockingCheckFailed`; the CLI reports either. Dagster's own console log is silenced; each stage's
    start goes to ``say`` (:func:`step_line`), and the stages' warnings (logger ``weir``: damaged chunks
    tokenized again, records lacking a template field, chat markers the tokenizer lacks) as ``warning: ...``.
    """
    engine = engine or engine_resource(kind="local")
    resources = {"storage": storage_resource(out, per_mix=False), "engine": engine}
    instance = instance or dg.DagsterInstance.ephemeral()
    # one throwaway instance for every stage's run: making one costs ~0.2 s (its tables created in SQLite)
    with dg.DagsterInstance.ephemeral() as throwaway, warnings_to(say), _forgetting(engine.engine()):
        build_job(mix, say=say, ahead=True, throwaway=throwaway).execute_in_process(
            resources=resources, instance=instance, run_config=_QUIET, tags={BUILD_TAG: "cli", **(tags or {})}
        )


def build_job(
    mix: Mix,
    say: Callable[[str], None] | None = None,
    ahead: bool = False,
    throwaway: dg.DagsterInstance | None = None,
) -> dg.JobDefinition:
    """The job ``build_<mix>``: one op per stage and partition (``documents__qa``, ``plan``), each after the ops
    of the stages it reads (so ``multiprocess`` runs the sources' ops side by side; in one process they run in
    the stage table's order, partitions sorted). Partitioned by source, so that a run can ask for one source:
    see the module's docstring. ``say`` gets each op's :func:`step_line` (default: the run's log); ``ahead``
    (for one process only: what is started ahead is collected in the process that started it) starts a
    stage's work for every source on a cluster engine before its first partition's op runs. ``throwaway``
    (for one process only, the caller disposes of it): the instance every op materializes its asset in (default:
    one of its own per op)."""
    assets = mix_assets(mix)
    table = {s.name: s for s in stages.STAGES}
    names = _op_names(mix)

    def compose() -> None:
        done: dict[tuple[str, str | None], Any] = {}
        for stage in stages.STAGES:
            for i, partition in enumerate(stage.partitions(mix)):
                after = [
                    done[(dep, p)]
                    for dep in stage.deps
                    for p in ([partition] if table[dep].per_source and stage.per_source else table[dep].partitions(mix))
                ]
                name = names[(stage.name, partition)]
                op = _stage_op(mix, stage, partition, assets, name, say, ahead and i == 0, throwaway)
                done[(stage.name, partition)] = op(after=after) if after else op()

    return dg.job(
        name=f"build_{mix.name}",
        partitions_def=dg.StaticPartitionsDefinition(sorted(mix.sources)),
        description=f"Build mix {mix.name!r}: launched with no partition, every stage and source in this one run; "
        "for one source, re-index it (automation builds the later stages).",
    )(compose)


def _op_names(mix: Mix) -> dict[tuple[str, str | None], str]:
    """Each (stage, partition)'s op name: ``stage`` or ``stage__source`` (characters Dagster refuses as ``_``).

    In one process Dagster runs the ops that are ready in the order of their names, so where the names of a
    stage's partitions would not sort as the partitions do (or two would be the same), each gets its index.
    """
    names: dict[tuple[str, str | None], str] = {}
    for stage in stages.STAGES:
        if not stage.per_source:
            names[(stage.name, None)] = stage.name
            continue
        sources = sorted(mix.sources)
        slugs = [re.sub(r"[^A-Za-z0-9_]", "_", p) for p in sources]
        if slugs != sorted(set(slugs)):
            slugs = [f"{i:0{len(str(len(slugs)))}d}_{s}" for i, s in enumerate(slugs)]
        for p, slug in zip(sources, slugs, strict=True):
            names[(stage.name, p)] = f"{stage.name}__{slug}"
    return names


def _stage_op(
    mix: Mix,
    stage: stages.Stage,
    partition: str | None,
    assets: Sequence[dg.AssetsDefinition],
    name: str,
    say: Callable[[str], None] | None,
    ahead: bool,
    throwaway: dg.DagsterInstance | None,
) -> dg.OpDefinition:
    """The op that materializes the stage's asset for ``partition`` and reports it in the build's run."""
    key = dg.AssetKey([mix.name, stage.name])
    ahead = ahead and stage.ahead is not None

    @dg.op(
        name=name,
        ins={"after": dg.In(dg.Nothing)},
        out=dg.Out(dg.Nothing),
        required_resource_keys={"storage", "engine"},
        tags={"weir/stage": stage.name, **({"weir/source": partition} if partition else {})},
        description=f"{stage.name}" + (f" of source {partition!r}" if partition else "") + f" ({key.to_user_string()})",
    )
    def run_stage(context: OpExecutionContext) -> Iterator[Any]:
        scope = set(context.partition_keys) if context.has_partition_key or context.has_partition_key_range else None
        if scope is not None and not (stage.name == "source_index" and partition in scope):
            context.log.info(f"this run re-indexes {', '.join(sorted(scope))}: automation builds {stage.name}")
            yield dg.Output(None)
            return
        if scope is None and BUILD_TAG not in context.run.tags:  # a whole build launched in the UI
            context.instance.add_run_tags(context.run_id, {BUILD_TAG: "ui"})
        tell = say or context.log.info
        resources = {"storage": context.resources.storage, "engine": context.resources.engine}
        if ahead:
            runner = resources["engine"].engine()
            if not isinstance(runner, LocalEngine):
                n = stage.run_ahead(mix, resources["storage"].layout(mix), mix_storage_options(mix), runner)
                tell(f"  {stage.name}: {n} tasks of every source started on {runner.name}")
        tell(step_line(stage.name, partition))
        # The asset runs as Dagster runs it (its own context, checks and blocking) in a throwaway instance;
        # what it recorded there is then reported here, in the build's run, under the asset's key.
        inner = throwaway or dg.DagsterInstance.ephemeral()
        before = {run.run_id for run in inner.get_runs()}
        error: Exception | None = None
        try:
            dg.materialize(
                assets, selection=[key], partition_key=partition, resources=resources, instance=inner, run_config=_QUIET
            )
        except Exception as e:  # the stage's own error, raised as it is once what it recorded is reported
            error = e
        # read it all, then close it here if it is this op's own (the build's is closed as the build ends): its
        # SQLite connections, left to the garbage collector, would be closed on whatever thread runs then (the
        # lease's, an upload's) and print SQLAlchemy's tracebacks
        events = list(recorded(inner, context, skip=before))
        if throwaway is None:
            inner.dispose()
        failed = []
        for event in events:
            yield event
            if (
                isinstance(event, dg.AssetCheckEvaluation)
                and event.blocking
                and not event.passed
                and event.severity == dg.AssetCheckSeverity.ERROR
            ):
                failed.append(f"{event.check_name}: {event.description}")
        if failed:
            raise BlockingCheckFailed(
                f"{step_line(stage.name, partition).strip()}: blocking check {'; '.join(failed)} "
                "(the later stages were not built)"
            )
        if error is not None:
            raise error
        yield dg.Output(None)

    return run_stage


@contextmanager
def _forgetting(engine: Engine) -> Iterator[None]:
    """Drop what ``engine`` still holds of work submitted ahead when the build ends (a failed run leaves some)."""
    try:
        yield
    finally:
        engine.forget()
