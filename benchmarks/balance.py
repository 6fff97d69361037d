"""DP and CP balance on real document lengths: weir beside docs/design.md's baselines B0, B1 and B3.

Documents come from ``../shared/data`` (books = gutenberg_books_subset, one document per book; math =
gsm8k question + answer; chat = hh_rlhf_harmless_base_test ``chosen``; multilingual = udhr2, one per
language; drama = tinyshakespeare, one per speech), tokenized with tiktoken ``o200k_base`` (lengths cached
under ``build/bench``). Each step draws documents per source to the mixture's token quota, cuts those
longer than S into S-sized pieces, and packs:

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

# This folder holds tokenize.py (the tokenizer benchmark): run as a script, it would shadow the standard
# library's tokenize for every module imported below, so take this folder off the import path first.
if Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)

import argparse
import gzip
import itertools
import json
import os
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from loaders.balance import assign_ranks, assign_unequal, dp_imbalance
from loaders.context_parallel import attention_work, split
from loaders.planner import EDGE_WINDOWS, LAYOUT, StepPlanner
from loaders.refinement import SLACK
from mixing.format.cost import CostModel
from mixing.format.manifest import PhaseSpan
from mixing.format.shards import SequenceSpan

SHARED = next((p for p in (ROOT.parent / "shared", ROOT.parent.parent / "shared") if p.is_dir()), None)
MIXTURE = {"books": 0.4, "math": 0.15, "chat": 0.2, "multilingual": 0.1, "drama": 0.15}
COST = CostModel(1.0, 49152.0)  # the cost model of every sequence here


def texts(name: str, data: Path) -> list[str]:
    if name == "books":
        return [p.read_text(errors="replace") for p in sorted((data / "gutenberg_books_subset").rglob("*.txt"))]
    if name == "math":
        lines = (data / "gsm8k" / "train.jsonl").read_text().splitlines()
        return [f"{r['question']}\n\n{r['answer']}" for r in map(json.loads, lines)]
    if name == "chat":
        with gzip.open(data / "hh_rlhf_harmless_base_test" / "test.jsonl.gz", "rt") as f:
            return [json.loads(line)["chosen"] for line in f]
    if name == "multilingual":
        return [p.read_text(errors="replace") for p in sorted((data / "udhr2_multilingual").rglob("*.txt"))]
    if name == "drama":
        return [s for s in (data / "tinyshakespeare" / "input.txt").read_text().split("\n\n") if s.strip()]
    raise KeyError(name)


def lengths(data: Path) -> dict[str, np.ndarray]:
    """Tokens per document (+1 for EOS) per source, o200k_base; cached in build/bench/lengths-o200k.npz."""
    cache = ROOT / "build" / "bench" / "lengths-o200k.npz"
    if cache.exists():
        with np.load(cache) as z:
            return {k: z[k] for k in z.files}
    import tiktoken

    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(data.parent / "tokenizers" / "tiktoken_cache"))
    enc = tiktoken.get_encoding("o200k_base")
    out = {n: np.array([len(t) + 1 for t in enc.encode_ordinary_batch(texts(n, data), num_threads=2)]) for n in MIXTURE}
    cache.parent.mkdir(parents=True, exist_ok=True)
    np.savez(cache, **out)
    return out


@dataclass
class Step:
    """One step's sequences: per sequence a list of (source, length) segments."""

    seqs: list[list[tuple[int, int]]]


def draw(
    lens: dict[str, np.ndarray],
    seq_len: int,
    batch: int,
    steps: int,
    seed: int,
    shares: np.ndarray | None = None,
    caps: list[int | None] | None = None,
) -> list[list[tuple[int, int]]]:
    """Per step, the units (source, length) drawn to the mixture's cumulative token quota. Documents longer
    than S are cut into S-sized pieces first; a source's pieces are drawn in order (a plan at piece
    granularity, so that the plan itself meets the mixture closely). ``shares`` [steps, sources]: the
    planned share of each source at each step (default: :data:`MIXTURE` throughout); ``caps``: per step,
    a phase's ``max_doc_tokens`` (longer documents are skipped, as the planner does)."""
    rng = np.random.default_rng(seed)
    names = list(MIXTURE)
    if shares is None:
        shares = np.tile(np.array(list(MIXTURE.values())), (steps, 1))
    caps = caps or [None] * steps
    quota = np.cumsum(shares, axis=0) * seq_len * batch
    streams: dict[str, Iterator[int]] = {n: iter(()) for n in names}
    cap_of: dict[str, int | None] = dict.fromkeys(names)
    taken = dict.fromkeys(names, 0)
    out = []
    for t in range(steps):
        units = []
        for k, n in enumerate(names):
            if cap_of[n] != caps[t]:  # a new length limit: the source's order restarts under it
                streams[n], cap_of[n] = iter(()), caps[t]
            while taken[n] < quota[t, k]:
                length = next(streams[n], None)
                if length is None:  # a new epoch of this source, reshuffled
                    docs = [d for d in rng.permutation(lens[n]).tolist() if caps[t] is None or d <= caps[t]]
                    if not docs:
                        raise ValueError(f"no {n} document fits max_doc_tokens {caps[t]}")
                    streams[n] = iter([min(seq_len, d - a) for d in docs for a in range(0, d, seq_len)])
                    continue
                taken[n] += length
                units.append((k, length))
        order = rng.permutation(len(units))
        out.append([units[i] for i in order])
    return out


def concat_chunk(units_per_step: list, seq_len: int, batch: int) -> list[Step]:
    """B0 packing: one token stream cut every S tokens."""
    steps, carry = [], []
    for units in units_per_step:
        stream = deque(carry + list(units))
        seqs, cur, room = [], [], seq_len
        while len(seqs) < batch and stream:
            k, length = stream.popleft()
            take = min(length, room)
            cur.append((k, take))
            room -= take
            if length > take:
                stream.appendleft((k, length - take))
            if room == 0:
                seqs.append(cur)
                cur, room = [], seq_len
        if cur:
            seqs.append(cur)
        while len(seqs) < batch:
            seqs.append([])
        carry = list(stream)
        steps.append(Step(seqs))
    return steps


def bfd(units_per_step: list, seq_len: int, batch: int) -> list[Step]:
    """Best-fit decreasing into ``batch`` sequences per step; units that fit nowhere wait for the next step."""
    steps, carry = [], []
    for units in units_per_step:
        pool = sorted(carry + list(units), key=lambda u: -u[1])
        room = np.full(batch, seq_len)
        seqs: list[list[tuple[int, int]]] = [[] for _ in range(batch)]
        carry = []
        for k, length in pool:
            fits = np.flatnonzero(room >= length)
            if len(fits) == 0:
                carry.append((k, length))
                continue
            j = int(fits[np.argmin(room[fits])])
            seqs[j].append((k, length))
            room[j] -= length
        steps.append(Step(seqs))
    return steps


def cost(seq: list[tuple[int, int]]) -> float:
    return COST.sequence([length for _, length in seq])


def cp_imbalance(seq: list[tuple[int, int]], seq_len: int, cp: int, how: str) -> float:
    """max/mean causal attention work over CP ranks for one sequence (padding slots do no work)."""
    lens = np.array([length for _, length in seq] or [0], dtype=np.int64)
    used = int(lens.sum())
    seg = np.append(lens, seq_len - used) if used < seq_len else lens
    work = []
    for r in range(cp):
        idx = split(seg, cp, r, how)
        work.append(attention_work(seg, np.where(idx < used, idx, -1)))
    return max(work) / np.mean(work) if np.mean(work) > 0 else 1.0


def source_tokens(seq: list[tuple[int, int]]) -> np.ndarray:
    v = np.zeros(len(MIXTURE))
    for k, length in seq:
        v[k] += length
    return v


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


@dataclass(frozen=True)
class SimulatedManifest:
    """The manifest fields :class:`loaders.planner.StepPlanner` reads."""

    global_batch: int
    seq_len: int
    phases: tuple[PhaseSpan, ...]
    sources: tuple[str, ...] = tuple(MIXTURE)
    max_tokens: int | None = None


class SimulatedShards:
    """What :class:`loaders.planner.StepPlanner` reads of a build (its metadata only: it never reads tokens),
    taken from simulated steps instead of shard files: each sequence's step, cost and segments (source,
    length). So the benchmark plans with the loader's own planner, not a copy of it."""

    url = "simulated build"

    def __init__(self, packed: list[Step], batch: int, starts: list[int] | None = None) -> None:
        flat = [s for st in packed for s in st.seqs]
        self.steps = np.repeat(np.arange(len(packed), dtype=np.int64), batch)
        self.seq_cost = np.array([cost(s) for s in flat], dtype=np.float64)
        self.seq_tokens = np.array([sum(n for _, n in s) for s in flat], dtype=np.int64)
        self.seg_offsets = np.concatenate([[0], np.cumsum([len(s) for s in flat])]).astype(np.int64)
        # segments as the shards store them: (source, doc_id, start, length); the planner reads source and length
        self.segments = np.array([(k, 0, 0, n) for s in flat for k, n in s], dtype=np.int64).reshape(-1, 4)
        bounds = itertools.pairwise([*(starts or [0]), len(packed)])
        phases = tuple(PhaseSpan(phase=f"phase{k}", first_step=a, steps=b - a) for k, (a, b) in enumerate(bounds))
        # S: the longest sequence (the planner reads it only to check a token budget)
        self.manifest = SimulatedManifest(global_batch=batch, seq_len=int(self.seq_tokens.max()), phases=phases)

    def span(self, lo: int, hi: int) -> SequenceSpan:
        off = self.seg_offsets[lo : hi + 1]
        return SequenceSpan(self.seq_cost[lo:hi], off - off[0], self.segments[off[0] : off[-1]])


def regrouped_steps(
    packed: list[Step],
    batch: int,
    window: int,
    period: int,
    slack: float = 0.0,
    starts: list[int] | None = None,
    edge_windows: int = EDGE_WINDOWS,
    layout: int = LAYOUT,
) -> list[list[list[tuple[int, int]]]]:
    """The training steps as :class:`loaders.planner.StepPlanner` lays them out (regroup windows of
    ``window`` steps, template ``period``, refinement bound ``slack``, 0 = off; ``edge_windows`` and
    ``layout`` as its own), each a list of the build's sequences. ``starts``: first step of each phase
    (default: the run is one phase)."""
    flat = [s for st in packed for s in st.seqs]
    shards = SimulatedShards(packed, batch, starts)
    planner = StepPlanner(
        shards,  # type: ignore[arg-type]  # the metadata a ShardSet gives the planner
        window=window, period=period, slack=slack, edge_windows=edge_windows, layout=layout,
    )  # fmt: skip
    return [[flat[i] for i in planner.step_sequences(t)] for t in range(len(packed))]


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
    regrouped = regrouped_steps(packed, batch, window, period, slack)
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
            for c, t in zip(per_step_costs, ([sum(x for _, x in s) for s in st] for st in regrouped), strict=True)
        ]
        rows["unequal1.5x"] = (float(np.mean(capped)), float(np.percentile(capped, 95)))
        others["unequal1.5x"] = regrouped
    if batch == dp:
        for w, p, x in ((8, 0, 0.0), (16, 0, 0.0), (window, period, 0.0), (10, period, slack), (window, period, 1.3)):
            if (w, p, x) != (window, period, slack):
                name = f"w{w}p{p}" + (f"s{x:g}" if x else "")
                others[name] = regrouped_steps(packed, batch, w, p, x)
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


def real_lengths() -> dict[str, np.ndarray]:
    """The sources' document lengths (:func:`lengths`), after printing the load average and one line per
    source; exits when neither ``../shared/data`` nor the cached lengths are here."""
    cached = ROOT / "build" / "bench" / "lengths-o200k.npz"  # lengths() needs the data only to fill it
    if SHARED is None and not cached.exists():
        sys.exit("../shared/data is not here: this benchmark needs the real datasets")
    lens = lengths((SHARED or ROOT) / "data")
    print("load average {:.2f} {:.2f} {:.2f} (balance figures do not depend on it)".format(*os.getloadavg()))
    for n, v in lens.items():
        print(f"{n:13} {len(v):6} docs, {int(v.sum()):>10,} tokens, median {int(np.median(v))}, max {int(v.max())}")
    return lens


def run_arguments(description: str) -> argparse.ArgumentParser:
    """The options of a simulated run: its steps, weir's regrouping at one sequence per rank, the seed."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--steps", type=int, default=200, help="steps of each simulated run")
    ap.add_argument("--window", type=int, default=20, help="weir's regrouping window at one sequence per rank")
    ap.add_argument("--period", type=int, default=10, help="weir's regrouping template period (0: none)")
    ap.add_argument("--slack", type=float, default=SLACK, help="weir's refinement balance bound (0: no refinement)")
    ap.add_argument("--seed", type=int, default=0)
    return ap


def main() -> None:
    args = run_arguments(__doc__.split("\n\n")[0]).parse_args()
    lens = real_lengths()
    regime(lens, 8192, 64, 8, 2, args.steps, 1, args.seed)  # 8 sequences per rank: LPT+swaps suffice
    regime(lens, 32768, 16, 16, 4, args.steps, args.window, args.seed, args.period, args.slack)
    regime(lens, 131072, 16, 16, 8, args.steps, args.window, args.seed, args.period, args.slack)
    regime(lens, 131072, 64, 16, 8, args.steps, 1, args.seed)  # 4 sequences per rank: unequal counts


if __name__ == "__main__":
    main()
