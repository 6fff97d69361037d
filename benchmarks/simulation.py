"""A simulated run on real document lengths, for the balance benchmarks (``benchmarks/balance.py``,
``benchmarks/curriculum.py``): sources, draw, packing, cost, and the loader's planner over the simulated steps.

Documents come from ``../shared/data`` (books = gutenberg_books_subset, one document per book; math =
gsm8k question + answer; chat = hh_rlhf_harmless_base_test ``chosen``; multilingual = udhr2, one per
language; drama = tinyshakespeare, one per speech), tokenized with tiktoken ``o200k_base`` (lengths cached
under ``build/bench``). Each step draws documents per source to the mixture's token quota, cuts those
longer than S into S-sized pieces; ``concat_chunk`` (B0) and ``bfd`` (best-fit decreasing) pack them.
The planner (:class:`loaders.planner.StepPlanner`) reads a build's metadata only, never its tokens:
:class:`SimulatedShards` gives it the simulated steps' metadata, so the figures are the loader's own.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import os
import sys
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from contract.cost import CostModel
from contract.record import PhaseSpan
from contract.shards import SequenceSpan
from loaders.planner import EDGE_WINDOWS, LAYOUT, StepPlanner
from loaders.refinement import SLACK

ROOT = Path(__file__).resolve().parent.parent
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
    np.savez(cache, allow_pickle=True, **out)  # its default, named: else mypy reads **out as filling it
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
    steps: list[Step] = []
    carry: list[tuple[int, int]] = []
    for units in units_per_step:
        stream = deque(carry + list(units))
        seqs: list[list[tuple[int, int]]] = []
        cur: list[tuple[int, int]] = []
        room = seq_len
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
    steps: list[Step] = []
    carry: list[tuple[int, int]] = []
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


def source_tokens(seq: list[tuple[int, int]]) -> np.ndarray:
    v = np.zeros(len(MIXTURE))
    for k, length in seq:
        v[k] += length
    return v


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
    length). So the benchmarks plan with the loader's own planner, not a copy of it. ``starts``: the first
    step of each phase (default: one phase)."""

    url = "simulated build"

    def __init__(self, packed: list[Step], batch: int, starts: list[int] | None = None) -> None:
        self.flat = flat = [s for st in packed for s in st.seqs]  # the sequences, in the build's order
        self.n_steps = len(packed)
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
    run: SimulatedShards,
    window: int,
    period: int,
    slack: float = 0.0,
    edge_windows: int = EDGE_WINDOWS,
    layout: int = LAYOUT,
) -> list[list[list[tuple[int, int]]]]:
    """The training steps of ``run`` as :class:`loaders.planner.StepPlanner` lays them out (regroup windows of
    ``window`` steps, template ``period``, refinement bound ``slack``, 0 = off; ``edge_windows`` and ``layout``
    as its own), each a list of the run's sequences."""
    planner = StepPlanner(
        run,  # type: ignore[arg-type]  # the metadata a ShardSet gives the planner
        window=window, period=period, slack=slack, edge_windows=edge_windows, layout=layout,
    )  # fmt: skip
    return [[run.flat[i] for i in planner.step_sequences(t)] for t in range(run.n_steps)]


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
