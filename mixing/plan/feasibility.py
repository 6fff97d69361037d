"""Whether a plan can be met with the documents there are: the epochs of each source to draw, every way
its caps (``max_epochs``, a phase's ``max_doc_tokens``) make it infeasible, and the warnings of a feasible plan
(of a source as a whole, and of the short documents a phase's ``max_doc_tokens`` leaves it).

The figures: ``need`` maps (phase, source) to the tokens the quotas plan; ``got`` the same for the tokens
drawn; ``have`` maps a source to (tokens, documents) of all its documents; ``short`` maps (limit, source) to
those of its documents of at most ``limit`` tokens. Problems are sentences naming phase, source and tokens.
"""

from __future__ import annotations

import math

import duckdb
import polars as pl

from mixing.mixfile.mix import Mix
from mixing.plan.curriculum import PhaseSpan, length_segments

__all__ = ["available", "epochs_needed", "plan_warnings", "short_document_warnings", "shortfalls"]


def available(
    con: duckdb.DuckDBPyConnection, spans: tuple[PhaseSpan, ...]
) -> tuple[dict[str, tuple[int, int]], dict[tuple[int, str], tuple[int, int]]]:
    """``have`` and ``short`` (for every ``max_doc_tokens`` of ``spans``) from the ``documents`` table."""
    have = {r[0]: (int(r[1]), int(r[2])) for r in con.sql(_HAVE).fetchall()}
    limits = sorted({sp.max_doc_tokens for sp in spans if sp.max_doc_tokens is not None})
    return have, _short_tokens(con, limits)


_HAVE = "SELECT source, sum(n_tokens)::BIGINT, count(*)::BIGINT FROM documents GROUP BY 1"


def _short_tokens(con: duckdb.DuckDBPyConnection, limits: list[int]) -> dict[tuple[int, str], tuple[int, int]]:
    """(limit, source) → (tokens, docs) of documents of at most ``limit`` tokens."""
    out: dict[tuple[int, str], tuple[int, int]] = {}
    for lim in limits:
        rows = con.sql(
            "SELECT source, sum(n_tokens)::BIGINT, count(*)::BIGINT FROM documents WHERE n_tokens <= ? GROUP BY 1",
            params=[lim],
        ).fetchall()
        out.update({(lim, r[0]): (int(r[1]), int(r[2])) for r in rows})
    return out


def _epoch_cap(mix: Mix, source: str) -> int:
    cap = mix.sources[source].max_epochs
    return math.ceil(cap) if math.isfinite(cap) else 1 << 20


def _limited(spans: tuple[PhaseSpan, ...]) -> list[tuple[int, list[PhaseSpan], str]]:
    """Per ``max_doc_tokens`` of ``spans``, ascending: the limit, the phases that draw from the documents of at
    most that many tokens (theirs or a smaller limit), and their names as a sentence shows them."""
    out = []
    for lim in sorted({sp.max_doc_tokens for sp in spans if sp.max_doc_tokens is not None}):
        phases = [sp for sp in spans if sp.max_doc_tokens is not None and sp.max_doc_tokens <= lim]
        out.append((lim, phases, ", ".join(repr(sp.name) for sp in phases)))
    return out


def epochs_needed(
    mix: Mix,
    source: str,
    spans: tuple[PhaseSpan, ...],
    need: dict[tuple[str, str], int],
    have: dict[str, tuple[int, int]],
    short: dict[tuple[int, str], tuple[int, int]],
    spent: int = 0,
) -> tuple[int, list[str]]:
    """Epochs of ``source`` to draw, and every way the caps make it infeasible (then 0 epochs). ``spent``: its
    tokens a continuation's base trained already (they count against ``max_epochs``; the draw skips them)."""
    asked = sum(need.get((sp.name, source), 0) for sp in spans)
    if asked == 0:
        return 0, []
    total = asked + spent
    segments, seq = length_segments(spans), mix.sequence.length
    first = next(sp.name for sp in spans if need.get((sp.name, source), 0) > 0)
    avail = have.get(source, (0, 0))[0]
    cap = mix.sources[source].max_epochs
    if avail == 0:
        return 0, [f"phase {first!r} needs {asked} tokens of source {source!r}, but it has no documents"]
    problems = []
    if total > cap * avail:
        run, at = spent, first
        for sp in spans:
            run += need.get((sp.name, source), 0)
            if run > cap * avail:
                at = sp.name
                break
        left = (
            f"; {max(0, int(cap * avail) - spent)} tokens are left after the {spent} the base trained" if spent else ""
        )
        problems.append(
            f"source {source!r} runs out in phase {at!r}: the plan needs {asked} tokens of it "
            f"({total / avail:.2f} epochs{' in all' if spent else ''}) but it has {avail} tokens and "
            f"max_epochs is {cap:g} "
            f"({int(cap * avail)} tokens at most){left}"
        )
    for lim, phases, names in _limited(spans):
        want = sum(need.get((sp.name, source), 0) for sp in phases)
        if want == 0:
            continue
        tokens = short.get((lim, source), (0, 0))[0]
        if tokens == 0:
            problems.append(
                f"phase(s) {names} need {want} tokens of source {source!r} from documents of at most {lim} "
                f"tokens, but it has no document that short"
            )
        elif want > cap * tokens:
            problems.append(
                f"phase(s) {names} need {want} tokens of source {source!r} from documents of at most {lim} "
                f"tokens, but those hold {tokens} tokens and max_epochs is {cap:g} ({int(cap * tokens)} at most)"
            )
    if problems:
        return 0, problems
    # Enough epochs that every segment finds its tokens: segments before g take at most their demand plus
    # half a unit (< S) each, so a stream holding Σ_{h ≤ g} (demand_h + S) tokens that g may draw suffices.
    epochs, run = 1, spent
    for seg in segments:
        run += sum(need.get((sp.name, source), 0) for sp in seg) + seq
        seg_limit = seg[0].max_doc_tokens
        pool = avail if seg_limit is None else short.get((seg_limit, source), (0, 0))[0]
        if pool and any(need.get((sp.name, source), 0) for sp in seg):
            epochs = max(epochs, -(-run // pool))
    return min(epochs, _epoch_cap(mix, source)), []


def shortfalls(
    mix: Mix,
    spans: tuple[PhaseSpan, ...],
    need: dict[tuple[str, str], int],
    got: dict[tuple[str, str], int],
    have: dict[str, tuple[int, int]],
    epochs: dict[str, int],
) -> list[str]:
    """Every length segment and drawn source (``epochs`` > 0) whose draw fell short of its demand."""
    problems: list[str] = []
    names = sorted(mix.sources)
    # A unit goes to the step holding its midpoint, so a segment's draw is within half a unit of its
    # demand: one short by more than a unit ran out of documents (possible only when max_epochs capped
    # the epochs drawn below the sufficient count of epochs_needed).
    seq = mix.sequence.length
    for seg in length_segments(spans):
        for s in names:
            if not epochs[s]:
                continue
            if sum(got.get((sp.name, s), 0) for sp in seg) < sum(need.get((sp.name, s), 0) for sp in seg) - seq:
                sp = seg[-1]
                limit = f" from documents of at most {sp.max_doc_tokens} tokens" if sp.max_doc_tokens else ""
                problems.append(
                    f"phase {sp.name!r} runs out of source {s!r}{limit}: the phases up to it need "
                    f"{_upto(need, spans, sp, s)} tokens of it, but only {_upto(got, spans, sp, s)} can be drawn "
                    f"in order within max_epochs {mix.sources[s].max_epochs:g} "
                    f"({have.get(s, (0, 0))[0]} tokens per epoch)"
                )
    return problems


def _upto(tokens: dict[tuple[str, str], int], spans: tuple[PhaseSpan, ...], last: PhaseSpan, source: str) -> int:
    """Σ tokens of ``source`` over the phases up to and including ``last``."""
    return sum(tokens.get((sp.name, source), 0) for sp in spans[: spans.index(last) + 1])


def plan_warnings(mix: Mix, per_source: pl.DataFrame) -> list[str]:
    """One sentence per source a feasible plan never draws, repeats with no ``max_epochs`` cap, or draws
    up to its ``max_epochs`` (``per_source``: the ``plan_sources`` frame)."""
    out = []
    for row in per_source.iter_rows(named=True):
        s = row["source"]
        if row["tokens_planned"] == 0:
            out.append(f"source {s!r} is declared but no phase draws it")
        elif row["epochs"] > 1 and not math.isfinite(mix.sources[s].max_epochs):
            out.append(f"source {s!r} is repeated {row['epochs']:.2f} times (no max_epochs caps it)")
        elif row["epochs"] > 0.999 * row["max_epochs"]:
            out.append(f"source {s!r} is drawn {row['epochs']:.2f} epochs, at its max_epochs {row['max_epochs']:g}")
    return out


def short_document_warnings(
    mix: Mix,
    spans: tuple[PhaseSpan, ...],
    need: dict[tuple[str, str], int],
    have: dict[str, tuple[int, int]],
    short: dict[tuple[int, str], tuple[int, int]],
) -> list[str]:
    """One sentence per ``max_doc_tokens`` limit and source whose phases at that limit or below draw its documents
    of at most that many tokens more than once over with no ``max_epochs`` cap, or up to the cap: a warmup of short
    documents cycling the few a source has, which the source's own epochs (over all its documents) do not show.
    Skipped where the limit leaves out none of the source's documents (the source's own warning covers it)."""
    out = []
    for lim, phases, names in _limited(spans):
        for s in sorted(mix.sources):
            want = sum(need.get((sp.name, s), 0) for sp in phases)
            tokens, docs = short.get((lim, s), (0, 0))
            if not want or not tokens or docs == have.get(s, (0, 0))[1]:
                continue
            times, cap = want / tokens, mix.sources[s].max_epochs
            what = f"phase(s) {names} draw {want} tokens of source {s!r} from its {docs} documents of at most {lim}"
            what += f" tokens ({tokens} tokens): each {times:.2f} times"
            if times > 1 and not math.isfinite(cap):
                out.append(f"{what} (no max_epochs caps it)")
            elif times > 0.999 * cap:
                out.append(f"{what}, at its max_epochs {cap:g}")
    return out
