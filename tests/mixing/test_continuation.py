"""``mixing/continuation.py``: a build continued at step N with a new mix. For every kind of edit, steps < N
are the base's (equal digests, the base's own shard files), no document piece the base trained before N is
drawn again and none it drew is skipped, the continuation follows the new mix from N (its window mixture
across N on the goal), and a change that would alter steps < N is refused naming the field and N."""

from __future__ import annotations

import json
import random
from collections import Counter
from functools import partial
from pathlib import Path

import dagster as dg
import duckdb
import numpy as np
import polars as pl
import pytest

from contract.digests import compute_step_digests, read_step_digests
from contract.errors import WeirError
from contract.shards import ShardSet
from loaders import PackedDataset, Reading, StepLoader, World
from loaders.state import StateError
from mixing import load_mix
from mixing.continuation import Base, documents_digest
from mixing.feedback import apply_feedback
from mixing.plan.curriculum_plan import Past, PlanError, preview_plan
from mixing.plan.quotas import step_quotas
from mixing.report import inspect_build
from pipelines.diff import diff_builds
from pipelines.transaction import build_output

N = 8
HEAD = """\
name: cont
seed: 3
tokenizer: {kind: bytes}
sequence: {length: 64, global_batch: 4}
sources:
  a: {uri: "{root}/a.jsonl", format: jsonl, template: "{t}"}
  b: {uri: "{root}/b.jsonl", format: jsonl, template: "{t}"}
  c: {uri: "{root}/c.jsonl", format: jsonl, template: "{t}"}
"""
E = '  e: {uri: "{root}/e.jsonl", format: jsonl, template: "{t}"}\n'
D = '  d: {uri: "{root}/d.jsonl", format: jsonl, template: "{t}"}\n'
PAST = """\
curriculum:
  - {phase: warm, steps: 4, mixture: {a: 0.5, b: 0.5}}
  - {phase: main, steps: {main}, mixture: {a: 0.25, b: 0.5, c: 0.25}}
"""
BASE = (
    HEAD
    + E
    + PAST.replace("{main}", "8")
    + "  - {phase: anneal, steps: 4, mixture: {a: 0.25, b: 0.25, c: 0.25, e: 0.25}}\n"
)
# each edit: sources added to HEAD, then the phases from step N on (main runs 4..7 in every one)
EDITS = {
    "weights_and_ramp_at_N": (
        "",
        "  - {phase: late, steps: 4, mixture: {a: 0.75, b: 0.125, c: 0.125}, transition: {shape: linear, steps: 3}}\n"
        "  - {phase: anneal, steps: 4, mixture: {a: 0.25, b: 0.25, c: 0.5}}\n",
    ),
    "source_added": (
        D,
        "  - {phase: late, steps: 4, mixture: {a: 0.25, b: 0.25, c: 0.25, d: 0.25}}\n"
        "  - {phase: anneal, steps: 4, mixture: {a: 0.25, b: 0.25, d: 0.5}}\n",
    ),
    "sources_removed": (  # c gets no weight from N on; e (never drawn before N) is not declared any more
        "",
        "  - {phase: late, steps: 8, mixture: {a: 0.5, b: 0.5, c: 0.0}}\n",
    ),
    "anneal_moved_and_longer": (
        "",
        "  - {phase: late, steps: 2, mixture: {a: 0.25, b: 0.5, c: 0.25}}\n"
        "  - {phase: anneal, steps: 10, mixture: {a: 0.125, b: 0.125, c: 0.75}}\n",
    ),
    "shorter": ("", "  - {phase: anneal, steps: 2, mixture: {a: 0.25, b: 0.25, c: 0.5}}\n"),
}


def _write_data(root: Path) -> None:
    rng = random.Random(5)
    root.mkdir(parents=True, exist_ok=True)
    for name in "abcde":  # 300 documents of 10-60 bytes each: no source wraps into a second epoch here
        lines = [json.dumps({"t": f"{name}{i} " + "x" * rng.randint(5, 55)}) for i in range(300)]
        (root / f"{name}.jsonl").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("continuation")
    _write_data(root / "data")
    (root / "base.yaml").write_text(BASE.replace("{root}", str(root / "data")))
    build_output(load_mix(root / "base.yaml"), root / "base", say=lambda _s: None)
    return root / "base"


def _mix(base: Path, name: str, added: str, future: str) -> Path:
    text = (HEAD + added + PAST.replace("{main}", "4") + future).replace("{root}", str(base.parent / "data"))
    mix = base.parent / f"{name}.yaml"
    mix.write_text(text)
    return mix


INSTANCE: list[dg.DagsterInstance] = []  # the module's builds' Dagster instance


def _continue(base: Path, name: str, added: str, future: str, at: int = N) -> Path:
    out = base.parent / name
    if not INSTANCE:
        INSTANCE.append(dg.DagsterInstance.ephemeral())
    if not (out / "shards").is_dir():  # built once per module (the chain test continues an edit's build)
        mix = load_mix(_mix(base, name, added, future)).continuing(str(base), at)
        build_output(mix, out, say=lambda _s: None, instance=INSTANCE[0])
    return out


def _pieces(shards: ShardSet, keep: np.ndarray) -> Counter[tuple[str, int, int]]:
    """(source, doc_id, start) of every segment of the sequences ``keep`` (bool [n])."""
    offs, segs = shards.segments
    mine = segs[np.repeat(keep, np.diff(offs))]
    names = shards.manifest.sources or ()
    return Counter((names[s], d, st) for s, d, st in mine[:, :3].tolist())


def _recorded(shards: ShardSet) -> np.ndarray:
    """The step digests ``shards`` recorded (uint8 [steps, 16]); every build here records them."""
    digests = read_step_digests(shards)
    assert digests is not None, shards.url
    return digests


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_the_past_is_kept_and_every_piece_goes_on_once(base: Path, edit: str) -> None:
    out = _continue(base, edit, *EDITS[edit])
    b, c = ShardSet(base / "shards"), ShardSet(out / "shards")
    mix = load_mix(base.parent / f"{edit}.yaml")
    assert c.manifest.steps == mix.total_steps and c.manifest.lineage[-1].at == N
    # steps < N: the base's digests, recomputed from the continuation's own files, and the base's shard files
    digests = compute_step_digests(c)
    assert np.array_equal(digests, _recorded(c))
    assert np.array_equal(digests[:N], _recorded(b)[:N])
    assert not np.array_equal(digests[N : b.manifest.steps], _recorded(b)[N : c.manifest.steps])
    first = c.manifest.shards[0]
    assert first.files == b.manifest.shards[0].files and (out / "shards" / first.files.tokens.name).stat().st_nlink > 1
    assert diff_builds(b, c).identical == N and diff_builds(b, c).continues_at == N
    # no piece twice over base < N and continuation ≥ N, and none skipped: in each source's draw order (the
    # plan's ord, the same for both builds), the continuation draws exactly the first pieces the base had not
    # trained before N (those it drew but carried past N, or dropped at a phase end, included)
    past = _pieces(b, b.steps < N)
    assert max((past + _pieces(c, c.steps >= N)).values()) == 1
    query = "SELECT source, doc_id, start, ord FROM plan_units"
    with duckdb.connect(str(base / "weir.duckdb"), read_only=True) as con:
        ords = {(s, d, st): o for s, d, st, o in con.sql(query).fetchall()}
    with duckdb.connect(str(out / "weir.duckdb"), read_only=True) as con:
        again = con.sql(query).fetchall()
    for source in {r[0] for r in again}:
        trained = {ords[p] for p in past if p[0] == source}
        drawn = {o for s, _d, _st, o in again if s == source}
        assert not trained & drawn, f"{source}: the continuation draws a piece the base trained before N"
        assert set(range(max(drawn) + 1)) <= drawn | trained, f"{source}: a piece is skipped across the switch"
    # the new mix from N on: only its sources, and the trainer's mixture across N on the goal
    names = c.manifest.sources or ()
    late = {names[s] for s in c.segments[1][np.repeat(c.steps >= N, np.diff(c.segments[0])), 0].tolist()}
    assert late <= {s for s, w in _shares_after(mix).items() if w > 0}
    report = inspect_build(out)
    # tiny steps: one document is ~0.02 of a 10-step window, and the base's phase-end documents deferred to the
    # next phase's first steps (mixing.plan.draws) are two or three of them in a window the switch cuts
    assert report.mixture_error.window <= 0.06


def _shares_after(mix) -> dict[str, float]:  # type: ignore[no-untyped-def]
    out: dict[str, float] = {}
    for ph in mix.curriculum[2:]:
        for s, w in ph.mixture.items():
            out[s] = max(out.get(s, 0.0), w)
    return out


def test_a_continuation_continues(base: Path) -> None:
    """A continuation of a continuation keeps both pasts: its lineage names both switches."""
    first = _continue(base, "weights_and_ramp_at_N", *EDITS["weights_and_ramp_at_N"])
    second = _continue(first, "chain", *EDITS["weights_and_ramp_at_N"], at=12)
    c1, c2 = ShardSet(first / "shards"), ShardSet(second / "shards")
    assert [e.at for e in c2.manifest.lineage] == [N, 12] == [e.at for e in inspect_build(second).lineage]
    assert diff_builds(c1, c2).identical >= 12  # the past before 12 kept (the same mix on: maybe all of it)
    assert np.array_equal(_recorded(c2)[:N], _recorded(ShardSet(base / "shards"))[:N])


def _refusals(base: Path, text: str) -> str:
    mix = base.parent / "refused.yaml"
    mix.write_text(text)
    m = load_mix(mix).continuing(str(base), N)
    docs = {s: documents_digest(pl.read_parquet(base / "sources" / s / "docs.parquet")) for s in m.sources}
    return "\n".join(Base(str(base), N).refusals(m, step_quotas(m), docs))


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda t: t.replace("seed: 3", "seed: 4"), "seed"),
        (lambda t: t.replace("{a: 0.5, b: 0.5}", "{a: 0.75, b: 0.25}"), "phase 'warm'"),
        (lambda t: t.replace("length: 64", "length: 128"), "sequence.length"),
        (lambda t: t.replace("global_batch: 4", "global_batch: 8"), "sequence.global_batch"),
        (lambda t: t.replace("steps: 4, mixture: {a: 0.5", "steps: 3, mixture: {a: 0.5"), "phase 'warm'"),
        (
            lambda t: t.replace("{phase: main, steps: 4", "{phase: main, steps: 2").replace(
                "{phase: anneal, steps: 2", "{phase: anneal, steps: 6"
            ),
            "phase 'main'",
        ),
    ],
)
def test_a_change_to_the_past_is_refused_naming_field_and_step(base: Path, change, field: str) -> None:  # type: ignore[no-untyped-def]
    text = (HEAD + PAST.replace("{main}", "4") + EDITS["shorter"][1]).replace("{root}", str(base.parent / "data"))
    assert _refusals(base, text) == ""
    said = _refusals(base, change(text))
    assert field in said and f"step {N}" in said


def test_a_refused_build_fails_in_one_message(base: Path) -> None:
    """Through the build: the documents of a source drawn before N changed (its file edited)."""
    data = base.parent / "data-edited"
    data.mkdir(exist_ok=True)
    for f in (base.parent / "data").iterdir():
        (data / f.name).write_bytes(f.read_bytes())
    with (data / "a.jsonl").open("a") as fh:
        fh.write(json.dumps({"t": "a late addition"}) + "\n")
    text = (HEAD + PAST.replace("{main}", "4") + EDITS["shorter"][1]).replace("{root}", str(data))
    mix = base.parent / "edited.yaml"
    mix.write_text(text)
    with pytest.raises(WeirError) as e:
        build_output(load_mix(mix).continuing(str(base), N), base.parent / "edited", say=lambda _s: None)
    assert "sources.a: its documents differ from the base's" in str(e.value) and f"step {N}" in str(e.value)


def test_an_infeasible_continuation_names_phase_source_and_tokens_left(base: Path) -> None:
    future = "  - {phase: late, steps: 8, mixture: {a: 1.0}}\n"
    text = (HEAD + PAST.replace("{main}", "4") + future).replace("{root}", str(base.parent / "data"))
    text = text.replace('template: "{t}"}', 'template: "{t}", max_epochs: 0.2}', 1)
    mix = base.parent / "infeasible.yaml"
    mix.write_text(text)
    m = load_mix(mix).continuing(str(base), N)
    used = Base(str(base), N).used(64)
    past = Past(
        N,
        {s: partial(u.times, seq_len=64) for s, u in used.items()},
        {s: u.tokens for s, u in used.items()},
        pl.DataFrame(),
    )
    with pytest.raises(PlanError) as e:
        preview_plan(m, base / "weir.duckdb", past=past)
    text = str(e.value)
    assert "source 'a'" in text and "phase 'late'" in text and "tokens are left after" in text


def test_a_loader_state_of_the_base_switches_at_or_before_N(base: Path, tmp_path: Path) -> None:
    """A run on the base saved at step s ≤ N resumes on the continuation: the base's steps s … N−1, then the
    new ones; a state saved past N is refused naming N."""
    out = _continue(base, "weights_and_ramp_at_N", *EDITS["weights_and_ramp_at_N"])
    reading = Reading(cache_dir=tmp_path / "cache")

    def steps(root: Path, state: dict | None = None, world: World | None = None) -> list[list[int]]:  # type: ignore[type-arg]
        loader = StepLoader(PackedDataset(root, world=world or World(0, 1), reading=reading))
        if state is not None:
            loader.load_state_dict(state)
        return [sorted(int(i) for mb in s.micro_batches for i in mb["sequences"]) for s in loader]

    on_base = StepLoader(PackedDataset(base, world=World(0, 1), reading=reading))
    whole_base, whole_cont = steps(base), steps(out)
    assert whole_cont[:N] == whole_base[:N]
    for s in (0, 5, N):
        assert steps(out, on_base.state_at(s)) == whole_cont[s:]
    halves = [steps(out, on_base.state_at(5), World(r, 2)) for r in range(2)]  # elastic: onto dp 2 at the switch
    assert [sorted(a + b) for a, b in zip(*halves, strict=True)] == whole_cont[5:]
    with pytest.raises(StateError, match=f"continues at step {N}"):
        steps(out, on_base.state_at(N + 1))


def test_dagster_shows_the_continuation_with_its_base_and_prefix_check(base: Path) -> None:
    instance = dg.DagsterInstance.ephemeral()  # its own: one continuation's materialization and checks in it
    mix = load_mix(_mix(base, "dagster", *EDITS["shorter"])).continuing(str(base), N)
    build_output(mix, base.parent / "dagster", say=lambda _s: None, instance=instance)
    key = dg.AssetKey(["cont", "packed_shards"])
    event = instance.get_latest_materialization_event(key)
    assert event is not None and event.asset_materialization is not None
    meta = event.asset_materialization.metadata
    assert meta["switch_step"].value == N and meta["continues"].value == str(base)
    assert meta["continues_build_id"].value == Base(str(base), N).build_id
    check = dg.AssetCheckKey(key, "prefix_unchanged")
    evaluation = instance.event_log_storage.get_latest_asset_check_execution_by_key([check])[check]
    assert evaluation.event is not None and evaluation.event.dagster_event is not None
    data = evaluation.event.dagster_event.event_specific_data
    assert isinstance(data, dg.AssetCheckEvaluation)
    assert data.passed and f"steps 0..{N - 1} identical" in (data.description or "")


def test_a_continuation_in_object_storage_continues_a_base_there(
    base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Base and continuation in a real (local) S3 server: the base read through fsspec, its prefix shards copied
    object to object with the base's checksums, the digests of steps < N equal."""
    from tests.conftest import S3_BUCKET, s3_endpoint

    with s3_endpoint() as s3:
        for k, v in s3.env().items():
            monkeypatch.setenv(k, v)
        monkeypatch.setenv("WEIR_WORK_DIR", str(tmp_path / "work"))
        old, new = f"s3://{S3_BUCKET}/base", f"s3://{S3_BUCKET}/next"
        build_output(load_mix(base.parent / "base.yaml"), old, say=lambda _s: None)
        mix = load_mix(_mix(base, "remote", *EDITS["source_added"])).continuing(old, N)
        build_output(mix, new, say=lambda _s: None)
        b, c = (ShardSet(f"{u}/shards", s3.options) for u in (old, new))
        assert c.manifest.shards[0].files == b.manifest.shards[0].files and not c.verify()
        assert diff_builds(b, c).identical == N and diff_builds(b, c).continues_at == N


def test_feedback_reweights_the_future_and_is_recorded(base: Path) -> None:
    """Weights from a loss log: c's loss is highest, so from N on c is drawn more than without the feedback; the
    manifest records the policy's inputs and the weights."""
    plain = _continue(base, "weights_and_ramp_at_N", *EDITS["weights_and_ramp_at_N"])
    log = base.parent / "losses.csv"
    log.write_text(
        "step,source,loss_sum,tokens\n"
        + "".join(f"{t},{s},{v},100\n" for t in range(N) for s, v in (("a", 200), ("b", 250), ("c", 600)))
    )
    mix = load_mix(_mix(base, "feedback", *EDITS["weights_and_ramp_at_N"])).continuing(str(base), N)
    mix = apply_feedback(mix, log, "loss_proportional")
    build_output(mix, base.parent / "feedback", say=lambda _s: None)
    c = ShardSet(base.parent / "feedback" / "shards")
    note = c.manifest.lineage[-1].feedback
    assert note is not None and note.policy == "loss_proportional" and note.weights == mix.continues.feedback.weights  # type: ignore[union-attr]

    def late_share(shards: ShardSet, source: str) -> float:
        offs, segs = shards.segments
        late = segs[np.repeat(shards.steps >= N, np.diff(offs))]
        mine = late[late[:, 0] == (shards.manifest.sources or ()).index(source)]
        return float(mine[:, 3].sum() / late[:, 3].sum())

    assert late_share(c, "c") > late_share(ShardSet(plain / "shards"), "c") + 0.05
    assert np.array_equal(_recorded(c)[:N], _recorded(ShardSet(base / "shards"))[:N])
