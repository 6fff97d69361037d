"""What ``weir build`` and ``weir inspect`` print about a finished build, and which goals it misses."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from mixing.plan.mixture import GOAL_PHASE, GOAL_WINDOW, goal_text
from mixing.report import MIN_PACKING_EFFICIENCY, BuildReport

__all__ = ["missed_goals", "per_source", "print_summary"]


def per_source(values: dict[str, float]) -> str:
    """``a 0.1234, b 0.5678``: a number per source (a feedback's factors, a phase's weights), as printed."""
    return ", ".join(f"{s} {v:.4f}" for s, v in values.items())


def missed_goals(r: BuildReport) -> list[str]:
    """One phrase per goal of docs/design.md the build misses (packing, truncation, mixture_error)."""
    missed = []
    if r.packing_efficiency < MIN_PACKING_EFFICIENCY:
        missed.append(f"packing_efficiency {r.packing_efficiency:.4f} < {MIN_PACKING_EFFICIENCY}")
    if r.truncated_docs > 0:
        missed.append(f"truncated_docs {r.truncated_docs:.4f} > 0")
    me = r.mixture_error
    if me.window > me.goal_window:
        missed.append(f"mixture_error {me.window:.4f} per {me.window_steps}-step window > {me.goal_window:.4g}")
    if me.phase > me.goal_phase:
        missed.append(f"mixture_error {me.phase:.4f} per phase > {me.goal_phase:.4g}")
    st = r.mixture_error_stream
    if st and not st.ok:
        missed.append(f"mixture_error of the trainer's stream {st.window:.4f} per window, {st.phase:.4f} per phase")
    return missed


def print_summary(out: Console, r: BuildReport) -> list[str]:
    """Print a build's figures on ``out``, each missed goal marked "[goal missed]"; return the missed goals."""
    eff_missed = r.packing_efficiency < MIN_PACKING_EFFICIENCY
    out.print(
        f"mix {r.mix!r}: {r.steps} steps, {r.sequences} sequences of {r.seq_len} tokens, "
        f"{r.tokens:,} tokens; packing_efficiency {r.packing_efficiency:.4f} (goal ≥ {MIN_PACKING_EFFICIENCY})"
        + (" [goal missed]" if eff_missed else "")
        + f", truncated_docs {r.truncated_docs:.4f} (goal 0)"
        + (" [goal missed]" if r.truncated_docs > 0 else ""),
        highlight=False,
        markup=False,
    )
    c, g = r.sequence_cost, r.segments_per_sequence
    out.print(
        f"shards {r.shards} (format {r.format_version}, {r.dtype}); documents per sequence "
        f"mean {g.mean:.1f} max {g.max}; sequence cost max/mean {c.max_over_mean:.3f}, "
        f"p95/mean {c.p95_over_mean:.3f}, cv {c.cv:.3f}; tokens dropped at phase ends "
        f"{r.tokens_dropped:,}",
        highlight=False,
    )
    me = r.mixture_error  # realized vs planned token shares
    out.print(
        f"mixture_error {me.window:.4f} per {me.window_steps}-step window "
        f"(goal {goal_text(GOAL_WINDOW, me.unit_window, me.window, 'a window')})"
        + (" [goal missed]" if me.window > me.goal_window else "")
        + f", {me.phase:.4f} per phase (goal {goal_text(GOAL_PHASE, me.unit_phase, me.phase, 'the smallest phase')})"
        + (" [goal missed]" if me.phase > me.goal_phase else ""),
        highlight=False,
        markup=False,
    )
    st = r.mixture_error_stream  # the same, of the training steps the loader makes (balance.regroup)
    if st is not None:
        rg = st.regroup
        out.print(
            f"mixture_error of the trainer's stream (regroup window {rg.window}, period {rg.period}, slack "
            f"{rg.slack:g}): {st.window:.4f} per window, {st.phase:.4f} per phase"
            + ("" if st.ok else " [goal missed]"),
            highlight=False,
            markup=False,
        )
    for e in r.lineage:  # a continuation: whose steps it keeps, up to where
        out.print(
            f"continues build {e.base[:12]}… (mix {(e.base_mix or '?')[:12]}…): its steps 0..{e.at - 1}, then this "
            f"mix{f' (base at {e.base_url})' if e.base_url else ''}",
            highlight=False,
            markup=False,
        )
        fb = e.feedback
        if fb is not None:  # its weights from the switch on came from a loss log
            out.print(
                f"  weights from step {e.at} by feedback ({fb.policy}, losses of steps {fb.steps[0]}.."
                f"{fb.steps[1] - 1}, log sha256 {fb.losses_sha256[:12]}…): factors {per_source(fb.factor)}",
                highlight=False,
                markup=False,
            )
    t = Table("source", "documents", "tokens packed", "tokens dropped", "share")
    for name, s in r.per_source.items():
        share = s.tokens_packed / r.tokens if r.tokens else 0.0
        t.add_row(name, f"{s.documents_packed:,}", f"{s.tokens_packed:,}", f"{s.tokens_dropped:,}", f"{share:.3f}")
    out.print(t)
    return missed_goals(r)
