"""``mixing/pack/whole_drops.py`` as ``make_plan``'s probe, on the demo build (whose short phases' packing drops
whole documents): the fitted plan's packing drops no document whole in any phase but its source's last, every
unit of it is drawn once per epoch and placed or dropped, and the phase totals stay on the plan's budget."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import numpy as np

from mixing.mixfile.mix import load_mix
from mixing.pack.packing import pack_plan
from mixing.pack.whole_drops import whole_drops
from mixing.plan.audit import audit_plan
from mixing.plan.curriculum import phase_demand
from mixing.plan.curriculum_plan import make_plan
from mixing.plan.database import duckdb_config


def test_a_fitted_plan_drops_no_document_whole_before_its_sources_last_phase(demo_build: Path, tmp_path: Path) -> None:
    mix = load_mix(demo_build.parent / "demo.yaml")
    db = tmp_path / "weir.duckdb"
    shutil.copy(demo_build / "weir.duckdb", db)
    final = {s: ph for (ph, s), tokens in phase_demand(mix).tokens().items() if tokens}
    probe = whole_drops(mix)

    make_plan(mix, db, duckdb_config())  # as drawn before any packing
    before = [u for u in probe(db) if u.phase != final[u.source]]
    assert len(before) > 5, "the demo's short phases drop whole documents unless the plan is fitted"

    fitted = make_plan(mix, db, duckdb_config(), probe=probe)
    assert [u for u in probe(db) if u.phase != final[u.source]] == []
    assert fitted.plans > 1 and fitted.deferred >= len(before), "the plans it took and the units it deferred"
    audit = audit_plan(db, mix.sequence.length)
    assert audit.duplicate_units == 0 and audit.missing_units == 0 and audit.budget_met
    with duckdb.connect(str(db), read_only=True) as con:
        units = con.sql("SELECT source, doc_id, start, length, phase FROM plan_units").fetchnumpy()
        held = dict(con.sql("SELECT phase, sum(held)::BIGINT FROM plan_quotas GROUP BY 1").fetchall())
    assert sum(held.values()) >= sum(u.length for u in before) > 0, "each phase draws short of what it dropped"
    packing = pack_plan(db, mix.sequence.length, mix.sequence.global_batch, mix.balance.cost.model())
    assert packing.segments[:, 3].sum() + packing.dropped[:, 3].sum() == units["length"].sum(), "tokens conserved"
    # each document the unfitted plan's packing dropped whole is planned again, in a later phase
    spans = [ph.phase for ph in mix.curriculum]
    for u in before:
        with duckdb.connect(str(db), read_only=True) as con:
            again = con.execute(
                "SELECT phase FROM plan_units WHERE source = ? AND ord = ?", [u.source, u.ord]
            ).fetchall()
        assert again and spans.index(again[0][0]) > spans.index(u.phase), (u, again)
    assert np.isin(packing.dropped[:, 2], 0).sum() <= len(before), "whole drops only in a source's last phase"
