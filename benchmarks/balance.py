"""DP and CP balance on real document lengths: weir beside docs/design.md's baselines B0, B1 and B3.

Documents and packing: ``benchmarks/simulation.py`` (real lengths of five sources, drawn per step to the
mixture's token quota, documents longer than S cut into S-sized pieces). Rows:

- B0: concatenate and chunk into S (documents cut at chunk edges), sequences dealt round-robin, contiguous CP;
- B1: B0 with whole-sequence zigzag CP (Megatron's default);
- B3: best-fit-decreasing packing (units that do not fit wait for the next step), LPT over DP ranks;
- weir: the same BFD packing, training steps planned by the loader's own ``loaders.planner.StepPlanner``
  (regrouping windows of ``--window`` steps with a per-block cost template of ``--period`` steps, 0 = none,
  refined under ``--slack``; it reads the simulated steps' metadata, :class:`SimulatedShards`, as it reads a
  build's), ``loaders.balance.assign_ranks`` (LPT + swaps), per-document zigzag CP. At one sequence per rank the
  other (window, period) settings follow as ``w<W>p<P>`` rows: the trade-off between balance and mixture error.
  With several sequences per rank the ``unequal`` row deals each step with ``loaders.balance.assign_unequal``
  (``balance.micro_batches: unequal``: counts per rank may differ), which leaves every step, and so the mixture,
  as built.

Prints ``dp_imbalance`` mean/p95 over steps, ``cp_imbalance`` mean/max over sequences, and
``mixture_error`` (max over 10-step windows and sources, of real tokens per source in each step's sequences
as the trainer receives them, against the planned mixture) per regime: over all windows, over the windows
inside the phase's whole blocks of 10 steps (``body``: leaves out the last ``steps mod 10`` steps), and over
the whole run. Cost of a document: l² + 49152·l.

The three-phase curricula (several phases, ramps, an anneal) are ``benchmarks/curriculum.py``.

    TIKTOKEN_CACHE_DIR=../shared/tokenizers/tiktoken_cache .venv/bin/python benchmarks/balance.py [--steps 64]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.simulation import (
    MIXTURE,
    SimulatedShards,
    bfd,
    concat_chunk,
    cost,
    draw,
    real_lengths,
    regrouped_steps,
    run_arguments,
    source_tokens,
)
from loaders.balance import assign_ranks, assign_unequal, dp_imbalance
from loaders.context_parallel import attention_work, split


def cp_imbalance(seq: list[tuple[int, int]], seq_len: int, cp: int, how: str) -> float:
    """max/mean causal attention work over CP ranks for one sequence (padding slots do no work)."""
    lens = np.array([length for _, length in seq] or [0], dtype=np.int64)
    used = int(lens.sum())
    seg = np.append(lens, seq_len - used) if used < seq_len else lens
    work = []
    for r in range(cp):
        idx = split(seg, cp, r, how)
        work.append(attention_work(seg, np.where(idx < used, idx, -1)))
    return float(max(work) / np.mean(work)) if np.mean(work) > 0 else 1.0


def mixture_error(steps: list[list[list[tuple[int, int]]]], window: int = 10, end: int | None = None) -> float:
    """max over windows of ``window`` steps (ending at or before step ``end``) and sources of abs(realized
    token share − planned share); shares count real tokens only."""
    per = np.array([sum((source_tokens(s) for s in st), np.zeros(len(MIXTURE))) for st in steps])
    want = np.array(list(MIXTURE.values()))
    worst = 0.0
    for a in range((len(per) if end is None else end) - window + 1):
        tot = per[a : a + window].sum(axis=0)
        worst = max(worst, float(np.abs(tot / tot.sum() - want).max()))
    return worst


def regime(
    lens: dict,
    seq_len: int,
    batch: int,
    dp: int,
    cp: int,
    steps: int,
    window: int,
    seed: int,
    period: int = 0,
    slack: float = 0.0,
) -> None:
    units = draw(lens, seq_len, batch, steps, seed)
    b0, packed = concat_chunk(units, seq_len, batch), bfd(units, seq_len, batch)
    rr = np.arange(batch) % dp
    rows = {}

    def dp_stats(per_step_costs: list[np.ndarray], ranks_of) -> tuple[float, float]:
        imb = [dp_imbalance(c, ranks_of(c), dp) for c in per_step_costs]
        return float(np.mean(imb)), float(np.percentile(imb, 95))

    b0_costs = [np.array([cost(s) for s in st.seqs]) for st in b0]
    bfd_costs = [np.array([cost(s) for s in st.seqs]) for st in packed]
    rows["B0"] = dp_stats(b0_costs, lambda c: rr)
    rows["B1"] = rows["B0"]
    rows["B3"] = dp_stats(bfd_costs, lambda c: lpt(c, dp))
    # weir: regroup windows of `window` steps, then LPT + swaps; other settings at one sequence per rank
    run = SimulatedShards(packed, batch)
    regrouped = regrouped_steps(run, window, period, slack)
    rows["weir"] = dp_stats([np.array([cost(s) for s in st]) for st in regrouped], lambda c: assign_ranks(c, dp))
    others = {}
    if batch > dp:  # several sequences per rank: unequal counts per rank (balance.micro_batches: unequal)
        per_step_costs = [np.array([cost(s) for s in st]) for st in regrouped]
        rows["unequal"] = dp_stats(per_step_costs, lambda c: assign_unequal(c, dp))
        others["unequal"] = regrouped
        # with a token budget of 1.5× an equal share (balance.max_tokens): a rank's variable-length micro-batch
        budget = int(1.5 * batch // dp * seq_len)
        capped = [
            dp_imbalance(c, assign_unequal(c, dp, tokens=t, max_tokens=budget), dp)
            for c, t in zip(
                per_step_costs, (np.array([sum(x for _, x in s) for s in st]) for st in regrouped), strict=True
            )
        ]
        rows["unequal1.5x"] = (float(np.mean(capped)), float(np.percentile(capped, 95)))
        others["unequal1.5x"] = regrouped
    if batch == dp:
        for w, p, x in ((8, 0, 0.0), (16, 0, 0.0), (window, period, 0.0), (10, period, slack), (window, period, 1.3)):
            if (w, p, x) != (window, period, slack):
                name = f"w{w}p{p}" + (f"s{x:g}" if x else "")
                others[name] = regrouped_steps(run, w, p, x)
                per_step = [np.array([cost(s) for s in st]) for st in others[name]]
                rows[name] = dp_stats(per_step, lambda c: assign_ranks(c, dp))
    sample = [s for st in packed[: max(1, 256 // batch)] for s in st.seqs]  # CP on a sample of sequences
    b0_sample = [s for st in b0[: max(1, 256 // batch)] for s in st.seqs]
    cps = {
        "B0": [cp_imbalance(s, seq_len, cp, "contiguous") for s in b0_sample],
        "B1": [cp_imbalance(s, seq_len, cp, "sequence_zigzag") for s in b0_sample],
        "B3": [cp_imbalance(s, seq_len, cp, "contiguous") for s in sample],
        "weir": [cp_imbalance(s, seq_len, cp, "zigzag") for s in sample],
    }
    streams = {"B0": [st.seqs for st in b0], "B3": [st.seqs for st in packed], "weir": regrouped}
    streams["B1"] = streams["B0"]
    streams.update(others)
    mix = {k: mixture_error(v) for k, v in streams.items()}
    body = {k: mixture_error(v, end=steps - steps % 10) for k, v in streams.items()}
    whole = {k: mixture_error(v, window=len(v)) for k, v in streams.items()}  # the run is one phase
    eff = sum(length for st in packed for s in st.seqs for _, length in s) / (steps * batch * seq_len)
    print(
        f"\nS={seq_len} global_batch={batch} dp={dp} cp={cp} steps={steps} window={window} "
        f"(BFD packing_efficiency {eff:.4f})"
    )
    head = f"{'':12} {'dp_imb mean':>11} {'dp_imb p95':>10} {'cp_imb mean':>11} {'cp_imb max':>10}"
    print(f"{head} {'mix_err/10':>10} {'body /10':>9} {'mix_err/run':>11}")
    for name, (mean, p95) in rows.items():
        c = cps.get(name, cps["weir"])
        cells = f"{name:12} {mean:11.3f} {p95:10.3f} {np.mean(c):11.3f} {np.max(c):10.3f}"
        print(f"{cells} {mix[name]:10.4f} {body[name]:9.4f} {whole[name]:11.4f}")


def lpt(costs: np.ndarray, dp: int) -> np.ndarray:
    """Plain LPT under equal counts (B3), no local search."""
    per, loads, counts = len(costs) // dp, np.zeros(dp), np.zeros(dp, int)
    ranks = np.empty(len(costs), dtype=np.int64)
    for i in np.argsort(-costs, kind="stable"):
        open_ = np.flatnonzero(counts < per)
        r = int(open_[np.argmin(loads[open_])])
        ranks[i], loads[r], counts[r] = r, loads[r] + costs[i], counts[r] + 1
    return ranks


def main() -> None:
    args = run_arguments(__doc__.split("\n\n")[0]).parse_args()
    lens = real_lengths()
    regime(lens, 8192, 64, 8, 2, args.steps, 1, args.seed)  # 8 sequences per rank: LPT+swaps suffice
    regime(lens, 32768, 16, 16, 4, args.steps, args.window, args.seed, args.period, args.slack)
    regime(lens, 131072, 16, 16, 8, args.steps, args.window, args.seed, args.period, args.slack)
    regime(lens, 131072, 64, 16, 8, args.steps, 1, args.seed)  # 4 sequences per rank: unequal counts


if __name__ == "__main__":
    main()
