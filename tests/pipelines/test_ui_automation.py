"""``weir build`` beside a running ``weir ui`` (its webserver, daemon and code server, as a user starts them):
the build is one run of ``build_<mix>`` with every materialization and check in it, its figures numeric; the
daemon's automation evaluates throughout and starts nothing after it (the build folder is left as the build
made it) nor while the output's lock is held, and acts on a re-index once it is released; and ``weir ui``
starts without Dagster's supersession warning.

One ``weir ui`` for the module (its start is most of the time), on a copy of the tiny mix, a temporary
DAGSTER_HOME and a free port on 127.0.0.1. The sensor daemon looks at its sensors every 5 s at most, so the
automation sensor (every second here) ticks that often.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest

from assets import WeirEngine, WeirStorage, mix_assets
from mixing import Mix, load_mix, stages
from pipelines.build import BUILD_TAG, ELSEWHERE_TAG, OUT_TAG, build_job
from pipelines.instance import project_instance
from pipelines.output_lock import output_lock
from pipelines.transaction import build_output
from tests.conftest import TINY_MIX, write_tiny_sources

ROOT = Path(__file__).resolve().parents[2]
TICK = "Checking for new runs for sensor: automation_tiny"  # the daemon's line as a tick starts
pytestmark = pytest.mark.slow


@dataclass
class UI:
    """A running ``weir ui`` over the tiny mix, and what a test needs of it."""

    mix: Mix
    own: Path  # the mix's own output, where the UI builds it
    instance: dg.DagsterInstance  # the UI's instance, as weir build opens it
    log: Path  # weir ui's output
    proc: subprocess.Popen[bytes]

    def ticks(self) -> int:
        """The automation ticks the daemon has started so far."""
        return self.log.read_text(errors="replace").count(TICK)

    def wait(self, what: str, done: Callable[[], bool], timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            if self.proc.poll() is not None:
                pytest.fail(f"weir ui exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                runs = [(r.job_name, r.status.value, r.tags) for r in self.instance.get_runs()]
                pytest.fail(f"no {what} within {timeout_s:.0f} s; runs {runs}:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.2)

    def wait_ticks(self, n: int) -> None:
        """Return once the daemon has made ``n`` whole automation ticks from now (a tick under way now may have
        read the state before now: the ticks are one after another, so ``n`` + 1 starts are waited for)."""
        target = self.ticks() + n + 1
        self.wait(f"{n} automation ticks", lambda: self.ticks() >= target)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UI]:
    base = tmp_path_factory.mktemp("ui")
    mixes = base / "mixes"
    mixes.mkdir()
    write_tiny_sources(base / "data")
    (mixes / "tiny.yaml").write_text(TINY_MIX.format(root=base / "data"))
    home = base / "dagster_home"
    instance = project_instance(home)  # its storage made before the UI opens it (two migrations at once break it)
    env = {**os.environ, "DAGSTER_HOME": str(home), "WEIR_MIXES": str(mixes), "WEIR_BUILD_ROOT": str(base / "build")}
    env.pop("WEIR_AUTOMATION", None)  # on, as it is by default
    env["WEIR_AUTOMATION_INTERVAL"] = "1"
    log = base / "weir-ui.log"
    cmd = [sys.executable, "-m", "pipelines.cli", "ui", "--port", str(_free_port()), "--home", str(home)]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    mp = pytest.MonkeyPatch()
    mp.setenv("WEIR_BUILD_ROOT", str(base / "build"))  # weir build's view of the mix's own output, as the UI's
    try:
        running = UI(load_mix(mixes / "tiny.yaml"), base / "build" / "tiny", instance, log, proc)
        running.wait("first automation tick", lambda: running.ticks() >= 1, timeout_s=300)
        yield running
    finally:
        mp.undo()
        proc.send_signal(signal.SIGTERM)  # weir ui stops its whole group of Dagster processes
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def built(ui: UI) -> dg.DagsterRun:
    """The tiny mix built by weir build's transaction into its own output, recorded in the UI's instance."""
    build_output(ui.mix, ui.own, instance=ui.instance, say=lambda _s: None)
    (run,) = ui.instance.get_runs()
    return run


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_build_is_one_run_and_automation_starts_nothing_after_it_nor_while_the_output_is_locked(
    ui: UI, built: dg.DagsterRun
) -> None:
    manifest = ui.own / "shards" / "manifest.json"
    made = (_sha(manifest), manifest.stat().st_mtime_ns, sorted(p.name for p in ui.own.iterdir()))
    assert (built.job_name, built.status) == ("build_tiny", dg.DagsterRunStatus.SUCCESS)
    assert built.tags[BUILD_TAG] == "cli" and built.tags[OUT_TAG] == str(ui.own) and ELSEWHERE_TAG not in built.tags
    # every stage and partition materialized in this one run, every check evaluated in it
    for stage in stages.STAGES:
        for partition in stage.partitions(ui.mix):
            key = dg.AssetKey(["tiny", stage.name])
            found = dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition] if partition else None)
            (record,) = ui.instance.fetch_materializations(found, limit=1).records
            assert record.run_id == built.run_id, (stage.name, partition)
    checks = [dg.AssetCheckKey(a.key, s.name) for a in mix_assets(ui.mix) for s in a.check_specs]
    evaluations = ui.instance.event_log_storage.get_latest_asset_check_execution_by_key(checks)
    assert {k: e.run_id for k, e in evaluations.items()} == dict.fromkeys(checks, built.run_id)

    ui.wait_ticks(1)  # a whole tick of the daemon's automation saw every stage newly built: it started nothing
    assert [r.run_id for r in ui.instance.get_runs()] == [built.run_id], "automation started no run"

    # Then, as weir build holds the lock while it builds, a source re-indexed (as the nightly schedule does): a
    # tick sees the new index and starts nothing. (In a tick after the build's: Dagster's eager takes an update
    # of a stage's input in the same tick as one of the stage itself for handled, whichever came first.)
    resources = {"storage": WeirStorage(root=str(ui.own.parent)), "engine": WeirEngine()}
    with output_lock(ui.own, wait=False, say=lambda _s: None):
        index = build_job(ui.mix).execute_in_process(partition_key="notes", instance=ui.instance, resources=resources)
        ui.wait_ticks(1)
        assert [r.run_id for r in ui.instance.get_runs()] == [index.run_id, built.run_id], "nothing while locked"
    assert (_sha(manifest), manifest.stat().st_mtime_ns, sorted(p.name for p in ui.own.iterdir())) == made

    def requested() -> bool:  # the tokenizer, which the new index of notes calls for, is asked for in a run
        tokenizer = dg.AssetKey(["tiny", "tokenizer"])
        return any(r.asset_selection and tokenizer in r.asset_selection for r in ui.instance.get_runs())

    ui.wait("a run of the tokenizer once the lock is released", requested, timeout_s=180)


def test_the_build_figures_are_numeric_metadata(ui: UI, built: dg.DagsterRun) -> None:
    """The figures the assets' Plots tab draws across builds: ints and floats, never text."""
    figures = {
        "documents": {"docs_seen": int, "docs_kept": int, "docs_quarantined": int, "tokens": int, "mb_per_s": float},
        "length_stats": {"documents": int, "tokens": int, "share_over_seq": float},
        "plan": {
            "steps": int,
            "units": int,
            "fit_plans": int,
            "documents_deferred": int,
            "tokens_held": int,
            "mixture_error_window": float,
            "mixture_error_phase": float,
        },
        "packed_shards": {
            "sequences": int,
            "tokens": int,
            "tokens_dropped": int,
            "packing_efficiency": float,
            "truncated_docs": float,
            "mixture_error_window": float,
            "mixture_error_phase": float,
        },
    }
    kinds = {int: dg.IntMetadataValue, float: dg.FloatMetadataValue}
    for stage, expected in figures.items():
        record = ui.instance.fetch_materializations(dg.AssetKey(["tiny", stage]), limit=1).records[0]
        assert record.asset_materialization is not None
        meta = record.asset_materialization.metadata
        for name, kind in expected.items():
            assert isinstance(meta[name], kinds[kind]), (stage, name, meta[name])
        numeric = [k for k, v in meta.items() if isinstance(v, dg.TextMetadataValue) and _number(v.value)]
        assert numeric == [], (stage, numeric)


def _number(text: str | None) -> bool:
    try:
        float(text or "")
    except ValueError:
        return False
    return True


def test_weir_ui_starts_without_the_supersession_warning(ui: UI) -> None:
    text = ui.log.read_text(errors="replace")
    assert TICK in text and "SupersessionWarning" not in text and "dg dev' instead" not in text, text[-3000:]
