"""``weir calibrate``: the cost model's compute terms fitted on this machine's accelerator.

Times the forward and backward pass of one causal attention layer (:class:`AttentionLayer`: the linear
projections of the micro-batch's tokens and one varlen attention call, flash, as a packed trainer runs it)
on two kinds of micro-batch: one document of ``l`` tokens for ``l`` from ``min_len`` to ``max_len`` (powers of
two), and ``min_len · 8`` tokens packed as ``m`` equal documents (64, 16, 4 of them). It fits

    seconds = α·Σ l² + β·Σ l + δ·documents + γ·micro-batches

by least squares weighted by ``1/seconds`` (relative error: short and long micro-batches count alike), every
coefficient ≥ 0. The packed points are what tell a document's fixed cost δ (microseconds in a varlen call) from
a call's γ: a fit on single documents alone puts both in one constant, which priced each document of a packed
step like a whole call. Each point is the mean of ``repeats`` runs back to back between two synchronizations, as
a trainer runs its micro-batches: a synchronization around every run adds a host round trip to γ that
back-to-back micro-batches do not pay (on an H200, 1.1–1.4 ms per call timed alone, against 3.6e-5 s per
micro-batch fitted on every rank's micro-batches of a real build run back to back: docs/benchmarks.md).

The fit is printed in the mix file's form, one cost unit being ``α`` seconds: ``balance.cost: {attention: 1.0,
linear: β/α, per_document: δ/α, per_micro_batch: γ/α, unit_seconds: α, comm_bytes: …}``
(:class:`contract.cost.CostModel`). ``comm_bytes`` is the same layer's: its keys and values received and their
gradients sent back, ``2 · 2 · width`` elements per token (32 KiB in bf16 at width 4096), so that compute and
communication are priced for one and the same layer (the contract's default, 1 MiB, is a whole 7B model's;
against one layer's compute it would price a split 32 times too high). Both scale alike with the model's
layers, so the deal is the same for the whole model. The bandwidths are the interconnect's and are not measured
here. Without a GPU the command says
so in one line and exits 2; ``--device cpu`` runs the same measurement on the CPU (one attention call per
document there: for trying the command, not for a training cluster's figures).
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["PACKED", "PACKED_TOKENS", "AttentionLayer", "Calibration", "fit", "measure"]

PACKED = (64, 16, 4)  # documents per packed micro-batch timed, of min_len · 8 and min_len · 32 tokens each
# two sizes of micro-batch, so that the fit tells a token's cost (β) from a call's (γ) where the GPU is busy: single
# short documents alone are launch-bound and would put their floor into γ
PACKED_TOKENS = (8, 32)
TERMS = ("attention", "linear", "per_document", "per_micro_batch")


class AttentionLayer:
    """One causal attention layer of ``heads × head_dim`` on ``device``: bf16 and flash varlen attention
    (``torch.nn.attention.varlen``) on a GPU, float32 and one ``scaled_dot_product_attention`` per piece on
    the CPU or where varlen attention is missing. :attr:`attention` says which runs."""

    def __init__(self, device: str, heads: int = 32, head_dim: int = 128) -> None:
        import torch

        self.device, self.heads, self.head_dim = device, heads, head_dim
        self.dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
        self.width = heads * head_dim
        # q, k, v and the output projection in one matrix
        self.proj = torch.nn.Linear(self.width, 4 * self.width, bias=False, device=device, dtype=self.dtype)
        self.varlen: tuple[Any, dict[str, Any]] | None = None  # (varlen_attn, its causal argument)
        if device.startswith("cuda"):
            try:
                from torch.nn.attention.varlen import varlen_attn

                params = inspect.signature(varlen_attn).parameters
                # bottom-right causal where queries are fewer than keys (a split document's chunk)
                self.varlen = (varlen_attn, {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)})
                self.run(np.array([64, 32]), np.array([64, 96]), 64)
            except (ImportError, RuntimeError, TypeError, NotImplementedError):
                self.varlen = None

    @property
    def attention(self) -> str:
        """``varlen`` (one flash call per micro-batch) or ``sdpa-per-piece``."""
        return "varlen" if self.varlen is not None else "sdpa-per-piece"

    def run(self, q_len: np.ndarray, k_len: np.ndarray, whole: int) -> None:
        """Forward and backward of one micro-batch of pieces: piece ``i`` has ``q_len[i]`` queries attending
        (causal, bottom-right) to ``k_len[i]`` keys. The first pieces, ``whole`` tokens, are documents on this
        rank alone (keys = queries); the rest are chunks of split documents, whose other keys and values stand
        in for what the block's all-gather brings (gradients flow to them, as the reduce-scatter's would)."""
        import torch
        import torch.nn.functional as F

        n = int(np.sum(q_len))
        if n == 0:
            return
        x = torch.randn(n, self.width, device=self.device, dtype=self.dtype, requires_grad=True)
        q, k, v, _o = self.proj(x).split(self.width, dim=-1)
        shape = (-1, self.heads, self.head_dim)
        q, k, v = (y.reshape(shape) for y in (q, k, v))
        extra = int(np.sum(k_len)) - whole
        if extra:
            kv = torch.randn(2, extra, self.heads, self.head_dim, device=self.device, dtype=self.dtype)
            kv.requires_grad_(True)
            k, v = torch.cat([k[:whole], kv[0]]), torch.cat([v[:whole], kv[1]])
        if self.varlen is not None:
            fn, causal = self.varlen
            cq, ck = (
                torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32, device=self.device)
                for lens in (q_len, k_len)
            )
            out: torch.Tensor = fn(q, k, v, cq, ck, int(np.max(q_len)), int(np.max(k_len)), **causal)
        else:
            from torch.nn.attention.bias import causal_lower_right

            outs, a, b = [], 0, 0
            for lq, lk in zip(np.asarray(q_len).tolist(), np.asarray(k_len).tolist(), strict=True):
                qi, ki, vi = (t.transpose(0, 1)[None] for t in (q[a : a + lq], k[b : b + lk], v[b : b + lk]))
                outs.append(F.scaled_dot_product_attention(qi, ki, vi, attn_mask=causal_lower_right(lq, lk))[0])
                a, b = a + lq, b + lk
            out = torch.cat(outs, dim=1)
        out.float().sum().backward()

    def timed(self, micro_batches: list[tuple[np.ndarray, np.ndarray, int]], repeats: int) -> float:
        """Seconds (median of ``repeats``) to run ``micro_batches`` (``run``'s arguments) one after another."""
        runs = []
        for _ in range(repeats):
            self._sync()
            t = time.perf_counter()
            for mb in micro_batches:
                self.run(*mb)
            self._sync()
            runs.append(time.perf_counter() - t)
        return float(np.median(runs))

    def _sync(self) -> None:
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize()


@dataclass(frozen=True)
class Calibration:
    """The points measured and their fit. ``documents`` / ``lengths`` int [n]: each point's documents and tokens
    per document; ``seconds`` float [n]: its time (forward + backward, the mean of the repeats run back to
    back); ``alpha``, ``beta``, ``delta``, ``gamma``: seconds per l², per token, per document, per micro-batch;
    ``worst``: the fit's largest relative error over the points; ``attention``:
    :attr:`AttentionLayer.attention`; ``comm_bytes``: the layer's bytes per token a split document's rank
    receives and sends back."""

    device: str
    attention: str
    documents: np.ndarray
    lengths: np.ndarray
    seconds: np.ndarray
    alpha: float
    beta: float
    delta: float
    gamma: float
    worst: float
    comm_bytes: float

    def cost(self) -> dict[str, float]:
        """The fit as the mix file's ``balance.cost`` fields: one cost unit is ``alpha`` seconds, or where the
        quadratic term did not show (short documents on a slow device) ``beta``."""
        unit = self.alpha or self.beta or self.delta or self.gamma or 1.0
        terms = (self.alpha, self.beta, self.delta, self.gamma)
        return {
            **{k: v / unit for k, v in zip(TERMS, terms, strict=True)},
            "unit_seconds": unit,
            "comm_bytes": self.comm_bytes,
        }

    def mix_yaml(self) -> str:
        """:meth:`cost` as a mix file's ``balance:`` block, naming the device it was fitted on."""
        body = ", ".join(f"{k}: {v:.6g}" for k, v in self.cost().items())
        return f"balance:\n  cost: {{{body}}}   # fitted on {self.device}"


def fit(features: np.ndarray, seconds: np.ndarray) -> tuple[np.ndarray, float]:
    """(coefficients float64 [k], worst relative error) of ``seconds ≈ features @ coefficients`` (``features``
    [n, k]), least squares weighted by 1/seconds, each coefficient ≥ 0 (a negative one is dropped and the
    rest refitted)."""
    a0 = np.asarray(features, np.float64)
    t = np.asarray(seconds, np.float64)
    keep = list(range(a0.shape[1]))
    while True:
        coef, *_ = np.linalg.lstsq(a0[:, keep] / t[:, None], np.ones_like(t), rcond=None)
        if (coef >= 0).all() or len(keep) == 1:
            break
        keep.pop(int(np.argmin(coef)))
    full = np.zeros(a0.shape[1])
    full[keep] = np.maximum(coef, 0.0)
    return full, float(np.max(np.abs(a0 @ full - t) / t))


def measure(
    device: str, min_len: int = 1024, max_len: int = 131072, heads: int = 32, head_dim: int = 128, repeats: int = 5
) -> Calibration:
    """Time :class:`AttentionLayer`'s forward + backward (the mean of ``repeats`` runs back to back) on ``device``
    (``cuda`` or ``cpu``) over single
    documents of ``min_len`` … ``max_len`` tokens (powers of two) and ``min_len`` · :data:`PACKED_TOKENS` tokens
    packed as :data:`PACKED` documents; fit :func:`fit`. Lengths that do not fit the device's memory end the sweep
    (at least three are needed)."""
    import torch

    layer = AttentionLayer(device, heads, head_dim)
    singles = [(1, min_len << k) for k in range(max(0, max_len // min_len).bit_length())]
    points = singles + [(m, min_len * k // m) for k in PACKED_TOKENS for m in PACKED if min_len * k // m >= 1]
    measured: list[tuple[int, int, float]] = []
    for m, n in points:
        pieces = np.full(m, n, np.int64)
        mb = [(pieces, pieces, m * n)]
        try:
            layer.timed(mb, 1)  # warms the kernels up for this shape
            # back to back, as a trainer runs its micro-batches: one synchronization per `repeats` runs, so that
            # a host round trip per call is not counted as the call's cost
            t = layer.timed(mb * repeats, 1) / repeats
        except torch.OutOfMemoryError:
            if m == 1:
                continue
            raise
        measured.append((m, n, t))
    if sum(1 for m, _, _ in measured if m == 1) < 3:
        raise ValueError(f"only {len(measured)} lengths fit on {device}; lower --max-len or --heads")
    docs, lens, secs = (np.array(x) for x in zip(*measured, strict=True))
    features = np.stack([docs * lens * lens, docs * lens, docs, np.ones(len(docs))], axis=1).astype(np.float64)
    (a, b, d, g), worst = fit(features, secs)
    comm = 2 * 2 * layer.width * layer.proj.weight.element_size()  # K and V in, their gradients out
    return Calibration(device, layer.attention, docs, lens, secs, a, b, d, g, worst, float(comm))
