"""The planner: which sequences make each training step, and which DP rank reads which of them.

World-independent where it can be: with ``window == 1`` training step ``t`` is exactly the build's step
``t``; with ``window == W > 1`` the steps of each phase are cut into windows of ``W`` steps (the last one
of a phase may be shorter, and with ``period`` > 0 one shorter than ``period`` joins the window before it;
a window never crosses a phase: :func:`loaders.balance.regroup_bounds`) whose sequences are regrouped by
cost (:func:`loaders.balance.regroup_window`; ``period`` > 0 selects its per-block cost template, which
keeps ``mixture_error`` per window of ``period`` steps near the build's, tail included), which does not depend on the
world: training steps stay the same across an elastic resume. Within a step, sequences go to DP ranks by
:func:`loaders.balance.assign_ranks` (equal counts) or :func:`loaders.balance.assign_unequal`
(``micro_batches="unequal"``); the seed permutes which rank takes which bin and the order of a
rank's sequences. Deterministic for the same build, seed, window, period and world.

With ``layout`` 1 (:data:`LAYOUT`) each phase's template takes the order of its positions that
keeps the windows across the boundary before it nearest the build's (:func:`loaders.order.match_order`,
against the previous phase's last block as regrouped: a function of the build only, computed once per
phase). The order moves whole steps: DP balance is the same.

With ``edge_windows`` > 0 (a trainer's ``Balance(edges=N)``; default :data:`EDGE_WINDOWS`, 0: off), across a
phase boundary whose phases' templates do not line up (:meth:`StepPlanner.boundary_mixes`), the phase's last
window and the next phase's first ``edge_windows`` windows are refined as edges (:mod:`loaders.refinement`):
their steps may mix cost classes so that the windows across the boundary keep the plan. What each window
needs is a function of the build and the windows before it, as before, so a loader state still resumes
exactly.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from functools import lru_cache

import numpy as np

from contract.shards import ShardSet
from loaders.balance import assign_ranks, assign_unequal, regroup_bounds, regroup_window
from loaders.order import first_block, match_order
from loaders.refinement import EDGE_BOUNDARY, SLACK, boundary_error, refine_steps

__all__ = ["EDGE_WINDOWS", "LAYOUT", "LAYOUTS", "MICRO_BATCHES", "StepPlanner"]

MICRO_BATCHES = ("equal", "unequal")
# how regrouped windows are laid out: 1 each phase's template in the order matched to the steps
# before it (loaders.order); 0 heaviest class first (the layout of loader states that do not name one, which
# resume only on it)
LAYOUTS = (0, 1)
LAYOUT = 1
# windows after a boundary that needs edges that may mix cost classes: 0 (edges off) by default, since
# on real lengths edges keep the curriculum only by giving up most of the balance (benchmarks/curriculum.py)
EDGE_WINDOWS = 0


class StepPlanner:
    """Plans steps of a :class:`~contract.shards.ShardSet` lazily, one window at a time (cached)."""

    def __init__(
        self,
        shards: ShardSet,
        window: int = 1,
        seed: int = 0,
        period: int = 0,
        micro_batches: str = "equal",
        slack: float = SLACK,
        edge_windows: int = EDGE_WINDOWS,
        layout: int = LAYOUT,
    ) -> None:
        if micro_batches not in MICRO_BATCHES:
            raise ValueError(f"micro_batches must be one of {MICRO_BATCHES}, got {micro_batches!r}")
        self.micro_batches = micro_batches
        if window < 1:
            raise ValueError(f"window must be ≥ 1 step, got {window}")
        if period < 0:
            raise ValueError(f"period must be ≥ 0 steps, got {period}")
        self.period = period
        if edge_windows < 0:
            raise ValueError(f"edge_windows must be ≥ 0 windows, got {edge_windows}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout}")
        m = shards.manifest
        if m.global_batch is None:
            raise ValueError(f"{shards.url}: the manifest records no global_batch, which the loader needs")
        self.shards, self.window, self.seed = shards, window, seed
        self.global_batch = m.global_batch
        self.seq_len = m.seq_len
        # real tokens per rank and step (unequal only)
        self.max_tokens = m.max_tokens if micro_batches == "unequal" else None
        steps = shards.steps
        self.steps = int(steps.max()) + 1 if len(steps) else 0
        counts = np.bincount(steps, minlength=self.steps)
        if len(counts) and (counts != self.global_batch).any():
            bad = int(np.flatnonzero(counts != self.global_batch)[0])
            raise ValueError(f"build step {bad} has {counts[bad]} sequences, expected global_batch {self.global_batch}")
        self.first = np.concatenate([[0], np.cumsum(counts)])  # sequences of build step t: first[t]:first[t+1]
        starts = sorted({0, *(p.first_step for p in m.phases or ())} | {self.steps})
        bounds: list[int] = []
        tails: list[int] = []  # per window, its phase's steps mod period: fixes the phase's cost template
        for a, b in itertools.pairwise(starts):
            cut = regroup_bounds(a, b, window, period)
            bounds += cut
            tails += [(b - a) % period if period else 0] * len(cut)
        self.window_starts = np.array([*bounds, self.steps], dtype=np.int64)
        self.window_tail = np.array(tails, dtype=np.int64)
        # the windows just before and after a boundary between phases (see boundary_mixes)
        self.inner = {int(x) for x in starts[1:-1]}
        # see LAYOUT; the layouts are alike without a template or a boundary (old states resume there too)
        self.layout = layout if period > 0 and window > 1 and self.inner else 0
        # per window, the first and last window of its phase
        first_of = np.searchsorted(self.window_starts, np.array(starts[:-1]))
        phase_of = np.searchsorted(np.array(starts[:-1]), self.window_starts[:-1], side="right") - 1
        self.phase_windows = np.stack([first_of[phase_of], np.r_[first_of[1:], len(bounds)][phase_of] - 1], axis=1)
        # refinement (loaders.refinement) chains windows: each one's layout depends on the steps before it
        self.slack = float(slack) if period > 0 and window > 1 else 0.0
        # see EDGE_WINDOWS; > 0 also turns on a phase's last edge window. 0 where they change nothing (no
        # refinement or no boundary): a loader state records it, and such states resume alike
        self.edge_windows = edge_windows if self.slack and self.inner else 0
        self.n_sources = len(m.sources or ()) or 1
        self._arranged: OrderedDict[int, np.ndarray] = OrderedDict()  # window → its steps' sequences (bounded)
        self._comps: dict[int, np.ndarray] = {}  # window → tokens per source of each of its training steps
        self._seeds: dict[int, np.ndarray] = {}  # window → context given by a loader state

    def window_of(self, step: int) -> int:
        """Index of the window holding training step ``step``."""
        return int(np.searchsorted(self.window_starts, step, side="right") - 1)

    @lru_cache(maxsize=8)  # noqa: B019 -- one StepPlanner per dataset; a handful of windows in flight
    def _facts(self, w: int) -> tuple[int, np.ndarray, np.ndarray]:
        """Window ``w``'s first sequence, cost of each of its sequences (float64 [n], as the build stored
        them) and tokens per source (float64 [n, sources])."""
        a, b = int(self.window_starts[w]), int(self.window_starts[w + 1])
        lo, hi = int(self.first[a]), int(self.first[b])
        span = self.shards.span(lo, hi)
        src = np.zeros((hi - lo, self.n_sources))
        owner = np.repeat(np.arange(hi - lo), np.diff(span.seg_offsets))
        np.add.at(src, (owner, span.segments[:, 0]), span.segments[:, 3])
        return lo, np.array(span.seq_cost, dtype=np.float64), src

    def _window(self, w: int) -> np.ndarray:
        """Sequence indices of window ``w``'s steps, int64 [steps, global_batch], each row sorted."""
        if w in self._arranged:
            self._arranged.move_to_end(w)
            return self._arranged[w]
        first = w
        while self.slack and self._context(first) is None:  # ends: window 0 has no steps before it
            first -= 1
        for v in range(first, w + 1):
            self._arranged[v] = self._arrange(v)
            while len(self._arranged) > 16:
                self._arranged.popitem(last=False)
        return self._arranged[w]

    def _arrange(self, w: int) -> np.ndarray:
        """Window ``w``'s layout (see :meth:`_window`), its context known when refining; records its steps'
        compositions."""
        a, b = int(self.window_starts[w]), int(self.window_starts[w + 1])
        lo, hi = int(self.first[a]), int(self.first[b])
        seqs = np.arange(lo, hi, dtype=np.int64)
        _, costs, src = self._facts(w)
        new_step = self._regroup(w)
        if self.slack:
            context = self._context(w)
            assert context is not None
            # every window may mix cost classes where its windows need it (edge); a phase's last one, at a
            # boundary whose regrouped steps do not line up, keeps the next phase's first windows (taken on
            # the build's mixture) in view
            at_end = self.edge_windows > 0 and b in self.inner and self.boundary_mixes(w)
            ahead = min(self.period - 1, self.steps - b) if at_end else 0
            edge = bool(ahead) or self._after_edge(w)
            target = np.concatenate(
                [
                    self._build_comps(a - len(context), a),
                    src.reshape(b - a, -1, src.shape[1]).sum(1),
                    self._build_comps(b, b + ahead),
                ]
            )
            new_step = refine_steps(costs, src, new_step, context, target, self.period, self.slack, edge=edge)
            comps = np.zeros((b - a, src.shape[1]), dtype=np.int64)
            np.add.at(comps, new_step, src.astype(np.int64))
            self._comps[w] = comps
        order = np.lexsort((seqs, new_step))
        return seqs[order].reshape(b - a, self.global_batch)

    def _after_edge(self, w: int) -> bool:
        """Whether window ``w`` is one of the first :data:`EDGE_WINDOWS` of a phase after a boundary that
        needs edges (where its steps hand over from mixed cost classes to the template)."""
        first = int(self.phase_windows[w, 0])
        start = int(self.window_starts[first])
        return w - first < self.edge_windows and start in self.inner and self.boundary_mixes(first - 1)

    @lru_cache(maxsize=16)  # noqa: B019
    def boundary_mixes(self, w: int) -> bool:
        """Whether the boundary after window ``w`` (a phase's last) needs edges: the phases' regrouped steps,
        before refinement, put a window across it off the build's mixture by more than ``EDGE_BOUNDARY``.
        A function of the two windows' own sequences: no chain, the same on a resume."""
        k = self.period - 1
        before, after = self._regrouped_comps(w), self._regrouped_comps(w + 1)
        b = int(self.window_starts[w + 1])
        k = min(k, len(before), len(after))
        target = self._build_comps(b - k, b + k)
        return boundary_error(before[len(before) - k :], after[:k], target, self.period) > EDGE_BOUNDARY

    def _regrouped_comps(self, w: int) -> np.ndarray:
        """Tokens per source of window ``w``'s steps as regrouped, before refinement (float64 [steps, sources]):
        what a phase's last window expects of the next phase's first steps."""
        a, b = int(self.window_starts[w]), int(self.window_starts[w + 1])
        _, _, src = self._facts(w)
        out = np.zeros((b - a, src.shape[1]))
        np.add.at(out, self._regroup(w), src)
        return out

    def _regroup(self, w: int) -> np.ndarray:
        """Window ``w``'s regrouped step (0-based) of each of its sequences, before refinement (int64 [n]),
        under its phase's template order."""
        a, b = int(self.window_starts[w]), int(self.window_starts[w + 1])
        _, costs, src = self._facts(w)
        if b - a < 2 or self.window < 2:
            return np.repeat(np.arange(b - a), self.global_batch)
        order = self._template_order(int(self.phase_windows[w, 0]))
        return regroup_window(costs, src, b - a, period=self.period, tail=int(self.window_tail[w]), order=order)

    @lru_cache(maxsize=64)  # noqa: B019 -- one entry per phase
    def _template_order(self, first: int) -> np.ndarray | None:
        """The template order (:mod:`loaders.order`) of the phase whose first window is ``first``: matched to
        the steps before it as the previous phase lays them out (its own order, unrefined: a function of the
        build, no chain; the run's first phase keeps each prefix of a block nearest the build's, so that the
        next can match it); None (heaviest first) with layout 0 (also a run of one phase: no boundary, its
        layout stays the heaviest-first one, layout 0) or when the phase's first window has no whole block."""
        a, b = int(self.window_starts[first]), int(self.window_starts[first + 1])
        if not self.layout or b - a < self.period:
            return None
        _, costs, src = self._facts(first)
        r = (b - a) % self.period or int(self.window_tail[first]) % self.period
        classes = first_block(costs, src, b - a, self.period, int(self.window_tail[first]))
        before = self._regrouped_comps(first - 1)[-self.period :] if first else np.zeros((0, self.n_sources))
        built = self._build_comps(a - len(before), a + self.period)
        return match_order(classes, built[len(before) :], before, built[: len(before)], r)

    def _context(self, w: int) -> np.ndarray | None:
        """Tokens per source (int64 [k, sources]) of the ``k = min(period − 1, start)`` training steps before
        window ``w``, or None while a window they lie in is not arranged yet. Steps before a window a loader
        state seeded come from that seed (a resume arranges no window before it, and a window shorter than
        ``period − 1`` steps reaches back past it)."""
        if w in self._seeds:
            return self._seeds[w]
        need, v = min(self.period - 1, int(self.window_starts[w])), w - 1
        parts: list[np.ndarray] = []
        while need > 0:
            if v not in self._comps:  # a resume's seed of the window after v holds the steps before that window
                seed = self._seeds.get(v + 1)
                if seed is None:
                    return None
                parts.insert(0, seed[len(seed) - need :])
                break
            take = min(need, len(self._comps[v]))
            parts.insert(0, self._comps[v][len(self._comps[v]) - take :])
            need, v = need - take, v - 1
        return np.concatenate(parts) if parts else np.zeros((0, self.n_sources), dtype=np.int64)

    def _build_comps(self, t0: int, t1: int) -> np.ndarray:
        """Tokens per source of the *build's* steps ``t0``…``t1 − 1`` (float64 [t1 − t0, sources])."""
        out = np.zeros((t1 - t0, self.n_sources))
        for t in range(t0, t1):
            lo, _, src = self._facts(self.window_of(t))
            out[t - t0] = src[self.first[t] - lo : self.first[t + 1] - lo].sum(axis=0)
        return out

    def context_at(self, step: int) -> list[list[int]] | None:
        """The context of the window holding ``step`` (what a loader state carries so that a resume needs no
        window before it), or None when nothing is refined."""
        if not self.slack or step >= self.steps:
            return None
        w = self.window_of(step)
        if w not in self._seeds:  # a loader's main process has them from its workers (shared_contexts)
            self._window(w)
        context = self._context(w)
        assert context is not None
        return context.tolist()

    def shared_contexts(self, step: int) -> dict[int, list[list[int]]]:
        """The contexts of the windows holding ``step`` and ``step + 1`` (by their first step), for a DataLoader
        worker to pass along with an item: the main process then saves states without refining any window."""
        return {
            int(self.window_starts[self.window_of(t)]): self.context_at(t) or []
            for t in {step, step + 1}
            if self.slack and t < self.steps
        }

    def seed_context(self, step: int, context: list[list[int]] | None) -> None:
        """Take ``context`` (from :meth:`context_at`, via a loader state) for the window holding ``step``.

        Raises ``ValueError`` when its shape does not fit, or when this planner already knows that window's
        context and it differs (a state that does not belong to this planner).
        """
        if not self.slack or context is None or step >= self.steps:
            return
        w = self.window_of(step)
        given = np.asarray(context, dtype=np.int64).reshape(-1, self.n_sources) if context else None
        k = min(self.period - 1, int(self.window_starts[w]))
        given = np.zeros((0, self.n_sources), dtype=np.int64) if given is None else given
        if given.shape != (k, self.n_sources):
            raise ValueError(f"context of shape {given.shape} for step {step}; expected {(k, self.n_sources)}")
        known = self._context(w)
        if known is not None and not np.array_equal(known, given):
            raise ValueError(f"context for step {step} differs from this planner's own")
        self._seeds[w] = given

    def step_sequences(self, step: int) -> np.ndarray:
        """The ``global_batch`` sequences (sorted) of training ``step``."""
        w = self.window_of(step)
        return self._window(w)[step - int(self.window_starts[w])]

    def check_world(self, dp_size: int) -> None:
        """Raise ``ValueError`` unless every step can be dealt to ``dp_size`` ranks."""
        if self.micro_batches == "equal" and self.global_batch % dp_size:
            raise ValueError(f"global_batch {self.global_batch} is not divisible by dp_size {dp_size}")
        if self.global_batch < dp_size:
            raise ValueError(f"global_batch {self.global_batch} gives no sequence to some of dp_size {dp_size} ranks")
        share = -(-self.global_batch // dp_size)  # sequences of an equal split, rounded up
        if self.max_tokens is not None and self.max_tokens < share * self.seq_len:
            raise ValueError(
                f"max_tokens {self.max_tokens} cannot hold an equal share of a step ({share} sequences of "
                f"{self.seq_len} tokens) on dp_size {dp_size}; expected at least {share * self.seq_len}"
            )

    def count(self, step: int, dp_size: int, dp_rank: int) -> int:
        """How many sequences of training ``step`` DP rank ``dp_rank`` reads."""
        if self.micro_batches == "equal":
            return self.global_batch // dp_size
        return len(self.assignment(step, dp_size)[dp_rank])

    @lru_cache(maxsize=64)  # noqa: B019
    def assignment(self, step: int, dp_size: int) -> tuple[np.ndarray, ...]:
        """Per DP rank, its sequences of training ``step`` in reading order (int64 arrays; of equal length
        unless ``micro_batches == "unequal"``, where each has at least one)."""
        self.check_world(dp_size)
        seqs = self.step_sequences(step)
        lo, costs, _ = self._facts(self.window_of(step))
        if self.micro_batches == "equal":
            bins = assign_ranks(costs[seqs - lo], dp_size)
        else:
            tokens = self.shards.seq_tokens[seqs] if self.max_tokens else None
            bins = assign_unequal(costs[seqs - lo], dp_size, tokens=tokens, max_tokens=self.max_tokens)
        rng = np.random.default_rng([self.seed & 0xFFFFFFFF, step])
        to_rank = rng.permutation(dp_size)
        out = []
        for r in range(dp_size):
            mine = seqs[bins == int(np.flatnonzero(to_rank == r)[0])]
            out.append(rng.permutation(mine))
        return tuple(out)
