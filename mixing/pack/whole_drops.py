"""The packing's verdict on a plan: the whole documents it would leave at phase ends (a plan's ``probe``).

A phase's packing leaves gaps (padding), so a plan that draws exactly a phase's tokens has more than its
sequences hold, and the phase end drops the surplus (:mod:`mixing.pack.phase_end` chooses which, preferring
pieces of long documents). Where no piece can stand in, it drops whole documents, occurrences the trainer never
gets. :func:`mixing.plan.fit.fit` defers those past their phase and draws the phase short of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from mixing.mixfile.mix import Mix
from mixing.pack.packing import stream_plan
from mixing.plan.curriculum import phase_spans
from mixing.plan.database import duckdb_config
from mixing.plan.fit import Left, Probe

__all__ = ["whole_drops"]


def whole_drops(mix: Mix, sources: Sequence[str] | None = None) -> Probe:
    """A probe packing the plan in a build's DuckDB file as the build will (``mix``'s sequence length, global
    batch and cost model; ``sources``: the order of the source indices, as :func:`mixing.stages.pack` passes
    it) and returning the dropped units that start a document (a whole document, or a long one's first piece);
    pieces after a document's first are left out (the document reached the trainer). A unit planned twice in
    its phase (two epochs) is named by its later draw. Deterministic: the packing is."""
    spans = phase_spans(mix)
    of = np.repeat(np.arange(len(spans)), [sp.steps for sp in spans])  # each step's phase
    name = np.array([sp.name for sp in spans])[of]
    first = np.array([sp.first_step for sp in spans], np.int64)[of]
    last = first + np.array([sp.steps - 1 for sp in spans], np.int64)[of]
    cost = mix.balance.cost.model()

    def probe(db: Path) -> list[Left]:
        config = duckdb_config()
        stream = stream_plan(db, mix.sequence.length, mix.sequence.global_batch, cost, config=config, sources=sources)
        rows = [
            (stream.sources[src], doc, start, int(first[step.step]), int(last[step.step]), length)
            for step in stream.steps
            for src, doc, start, length in step.dropped.tolist()
            if start == 0
        ]
        if not rows:
            return []
        cols = ("source", "doc_id", "start", "lo", "hi", "length")
        dropped = pa.table({c: [r[i] for r in rows] for i, c in enumerate(cols)})
        with duckdb.connect(str(db), read_only=True, config=dict(config.items())) as con:
            con.register("dropped", dropped)
            found = con.sql(  # one pass over plan_units, whatever the number of drops
                "SELECT d.source, max(u.ord), arg_max(u.step, u.ord), d.hi, d.length FROM dropped d JOIN plan_units u "
                "ON u.source = d.source AND u.doc_id = d.doc_id AND u.start = d.start AND u.step BETWEEN d.lo AND d.hi "
                "GROUP BY d.source, d.doc_id, d.start, d.hi, d.length ORDER BY 1, 2"
            ).fetchall()
        return [Left(str(s), int(o), int(at), str(name[hi]), int(hi), int(n)) for s, o, at, hi, n in found]

    return probe
