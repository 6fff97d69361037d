"""Feedback that stays a build: a continuation's mixture weights from step N on, taken from the run's loss log.

``weir build NEW --continue BASE --at N --feedback LOSSES --policy NAME`` reads LOSSES, the per-source loss log
the training examples write (one row per step and source: ``step, source, loss_sum, tokens``; CSV with that
header, or JSON lines), takes each source's losses over the last :data:`WINDOW` logged steps before N (their mean per
token, and their curve against the source's tokens trained), and lets the named policy turn those losses into a
factor per source. Only the mix's sources count (a log naming none of them is refused); a source the window
logs no tokens of keeps its weight (factor 1, and :func:`unlogged` names it). Every phase of NEW that starts at or
after N gets its weights multiplied by the factors and renormalized (rounded to 1e-6, so that the same log
and policy give the same mix, and so the same build_id); the phases before N are the base's. The inputs and
the result are recorded in the continuation's manifest (:class:`contract.record.FeedbackNote`, in its
lineage). An online mixer changes sampling while the run runs, so what a step saw depends on timing; here
the reweighted future is a build like any other, checked, digested and replayable.

The policies (:data:`POLICIES`: ``loss_proportional``, ``scaling_law``) are :mod:`mixing.loss_policy`'s.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
from pathlib import Path

from contract.errors import WeirError
from contract.record import FeedbackNote
from mixing.loss_policy import POLICIES, Losses
from mixing.mixfile.mix import Mix

__all__ = ["POLICIES", "WINDOW", "FeedbackError", "apply_feedback", "read_losses", "unlogged"]

WINDOW = 100  # logged steps before the switch that the losses are averaged over
_COLUMNS = ("step", "source", "loss_sum", "tokens")


class FeedbackError(WeirError, ValueError):
    """A loss log that cannot be read (names file and line), an unknown policy, or a mix it cannot reweight."""


def read_losses(path: Path) -> dict[tuple[int, str], tuple[float, int]]:
    """(step, source) → (loss_sum, tokens), summed over rows of the same step and source. Raises
    :class:`FeedbackError` naming the file and line of the first malformed row."""
    try:
        text = path.read_text(encoding="utf-8-sig")  # a spreadsheet's export starts with a byte-order mark
    except (OSError, UnicodeDecodeError) as e:
        raise FeedbackError(f"{path}: cannot read the loss log ({e}); pass the file the trainer wrote") from None
    rows: list[tuple[int, dict[str, object]]] = []
    if text.lstrip().startswith("{"):
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append((n, json.loads(line)))
                except ValueError:
                    raise FeedbackError(f"{path}:{n}: not a JSON object; expected {', '.join(_COLUMNS)}") from None
    else:
        reader = csv.DictReader(io.StringIO(text))
        if reader.fieldnames is None:
            raise FeedbackError(f"{path}: the loss log is empty; expected a header {', '.join(_COLUMNS)} and rows")
        if not set(_COLUMNS) <= set(reader.fieldnames):
            raise FeedbackError(f"{path}:1: the header is {reader.fieldnames}; expected {', '.join(_COLUMNS)}")
        rows = [(reader.line_num, dict(r)) for r in reader]  # the row's last line: a quoted field may span lines
    out: dict[tuple[int, str], tuple[float, int]] = {}
    for n, row in rows:
        try:
            step, source = int(str(row["step"])), str(row["source"])
            loss, tokens = float(str(row["loss_sum"])), int(str(row["tokens"]))
        except (KeyError, TypeError, ValueError):
            raise FeedbackError(f"{path}:{n}: expected {', '.join(_COLUMNS)} (integers, a number) in {row}") from None
        if step < 0 or tokens < 0 or not math.isfinite(loss) or loss < 0:
            raise FeedbackError(f"{path}:{n}: step, tokens and loss_sum must be finite and ≥ 0")
        old = out.get((step, source), (0.0, 0))
        out[(step, source)] = (old[0] + loss, old[1] + tokens)
    return out


def apply_feedback(mix: Mix, losses: Path, policy: str) -> Mix:
    """``mix`` (a continuation: :meth:`Mix.continuing`) with the weights of its phases from the switch on taken
    from the loss log ``losses`` under ``policy``, and the :class:`FeedbackNote` in ``mix.continues``.
    Deterministic: the same log and policy give the same mix."""
    if mix.continues is None:
        raise FeedbackError("--feedback reweights a continuation: give --continue BASE --at N too")
    if policy not in POLICIES:
        raise FeedbackError(f"--policy {policy!r}: unknown; policies are {sorted(POLICIES)}")
    at = mix.continues.at
    log = read_losses(losses)
    logged = sorted({step for step, _ in log if step < at})
    if not logged:
        raise FeedbackError(f"{losses}: no step before the switch {at} is logged; pass the log of the base's run")
    first = logged[max(0, len(logged) - WINDOW)]
    window = _window({k: v for k, v in log.items() if k[1] in mix.sources}, first, at)
    if not window.per_token:  # another run's log: every weight would stay as it is, unseen
        named = sorted({source for step, source in log if first <= step < at})
        raise FeedbackError(
            f"{losses}: steps {first}..{at - 1} log no source of this mix (they log {', '.join(named) or 'no tokens'};"
            f" the mix has {', '.join(sorted(mix.sources))}); pass the log of a run of the base"
        )
    factor = {s: round(f, 6) for s, f in POLICIES[policy](window).items()}
    curriculum, weights, start = [], {}, 0
    for ph, n in zip(mix.curriculum, mix.phase_steps, strict=True):
        if start >= at:
            w = _reweighted(ph.shares, factor)
            weights[ph.phase] = w
            ph = ph.model_copy(update={"mixture": w, "normalize": None})
        curriculum.append(ph)
        start += n
    if not weights:
        raise FeedbackError(f"no phase starts at or after step {at}: start one there for the feedback to reweight")
    note = FeedbackNote(
        policy=policy,
        losses_sha256=hashlib.sha256(losses.read_bytes()).hexdigest(),
        steps=(first, max(logged) + 1),
        loss=window.per_token,
        factor=factor,
        weights=weights,
    )
    out = mix.model_copy(update={"curriculum": curriculum})
    object.__setattr__(out, "continues", mix.continues.model_copy(update={"feedback": note}))
    return out


def unlogged(note: FeedbackNote) -> list[str]:
    """The sources with weight in a reweighted phase that the log's window has no losses of (their factor is 1)."""
    return sorted({s for w in note.weights.values() for s, v in w.items() if v > 0} - set(note.factor))


def _window(log: dict[tuple[int, str], tuple[float, int]], first: int, at: int) -> Losses:
    """The log's steps ``[first, at)`` as a policy sees them (:class:`mixing.loss_policy.Losses`): each source's
    loss per token over them (rounded to 1e-6), and its curve there, the tokens of a step counted from the
    log's first step (a step the log lacks adds none)."""
    sums: dict[str, list[float]] = {}
    curves: dict[str, list[tuple[float, float]]] = {}
    seen: dict[str, int] = {}
    for (step, source), (loss, tokens) in sorted(log.items()):
        if step >= at or not tokens:
            continue
        seen[source] = seen.get(source, 0) + tokens
        if step >= first:
            acc = sums.setdefault(source, [0.0, 0.0])
            acc[0] += loss
            acc[1] += tokens
            curves.setdefault(source, []).append((float(seen[source]), loss / tokens))
    per_token = {s: round(v[0] / v[1], 6) for s, v in sorted(sums.items())}
    return Losses(per_token, {s: tuple(curves[s]) for s in per_token})


def _reweighted(shares: dict[str, float], factor: dict[str, float]) -> dict[str, float]:
    """``shares`` × ``factor`` (1 where none), renormalized and rounded to 1e-6, summing to 1 within 1e-6."""
    raw = {s: w * factor.get(s, 1.0) for s, w in shares.items()}
    total = sum(raw.values())
    out = {s: round(v / total, 6) for s, v in sorted(raw.items())}
    top = max(out, key=lambda s: (out[s], s))
    out[top] = round(out[top] + 1.0 - sum(out.values()), 6)
    return out
