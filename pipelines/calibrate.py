"""``weir calibrate``: the cost model's compute terms fitted on this machine's accelerator.

Times the forward and backward pass of one causal attention layer (PyTorch's
``scaled_dot_product_attention``, flash or memory-efficient kernel where the card has one) plus the layer's
linear projections, on one document of ``l`` tokens for ``l`` from ``min_len`` to ``max_len`` (powers of two),
and fits ``seconds(l) = α·l² + β·l + γ`` by least squares weighted by ``1/seconds`` (relative error: short and
long documents count alike). The fit is printed in the mix file's form: one cost unit is ``α`` seconds, so
``balance.cost: {attention: 1.0, linear: β/α, per_document: γ/α, unit_seconds: α}`` (:class:`contract.cost.
CostModel`); the communication terms (``comm_bytes``, bandwidths) are the interconnect's and are not measured
here. Without a GPU it says so in one line and exits 2; ``--device cpu`` runs the same measurement on the CPU
(for trying the command, not for a training cluster's figures).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

__all__ = ["Calibration", "fit", "measure"]


@dataclass(frozen=True)
class Calibration:
    """``lengths`` int [n] and ``seconds`` float [n] measured (median of the repeats, forward + backward), and the
    fit ``seconds ≈ alpha·l² + beta·l + gamma`` (seconds, seconds per token, seconds per document) with its
    largest relative error over the points."""

    device: str
    lengths: np.ndarray
    seconds: np.ndarray
    alpha: float
    beta: float
    gamma: float
    worst: float

    def mix_yaml(self) -> str:
        """The fit as the mix file's ``balance.cost``: one cost unit is ``alpha`` seconds (``attention: 1``), or
        where the quadratic term did not show (short documents on a slow device) ``beta`` (``linear: 1``)."""
        unit = self.alpha or self.beta or self.gamma or 1.0
        return (
            f"balance:\n  cost: {{attention: {self.alpha / unit:.6g}, linear: {self.beta / unit:.6g}, per_document: "
            f"{self.gamma / unit:.6g}, unit_seconds: {unit:.6g}}}   # fitted on {self.device}"
        )


def fit(lengths: np.ndarray, seconds: np.ndarray) -> tuple[float, float, float, float]:
    """(α, β, γ, worst relative error) of ``seconds ≈ α·l² + β·l + γ``, least squares weighted by 1/seconds, each
    coefficient ≥ 0 (a negative one is dropped and the rest refitted)."""
    l = np.asarray(lengths, np.float64)  # noqa: E741
    t = np.asarray(seconds, np.float64)
    cols = [l * l, l, np.ones_like(l)]
    keep = [0, 1, 2]
    while True:
        a = np.stack([cols[i] for i in keep], axis=1) / t[:, None]
        coef, *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
        if (coef >= 0).all() or len(keep) == 1:
            break
        keep.pop(int(np.argmin(coef)))
    full = np.zeros(3)
    full[keep] = np.maximum(coef, 0.0)
    pred = full[0] * l * l + full[1] * l + full[2]
    return float(full[0]), float(full[1]), float(full[2]), float(np.max(np.abs(pred - t) / t))


def measure(
    device: str, min_len: int = 1024, max_len: int = 131072, heads: int = 32, head_dim: int = 128, repeats: int = 5
) -> Calibration:
    """Time one attention layer's forward + backward over lengths ``min_len`` … ``max_len`` (powers of two) on
    ``device`` (``cuda`` or ``cpu``), bf16 on a GPU, float32 on the CPU; fit :func:`fit`. Lengths that do not fit
    the device's memory end the sweep (at least three are needed)."""
    import torch
    import torch.nn.functional as F

    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    width = heads * head_dim
    proj = torch.nn.Linear(width, 4 * width, bias=False, device=device, dtype=dtype)  # q, k, v and the output
    lengths, seconds = [], []
    length = min_len
    while length <= max_len:
        try:
            x = torch.randn(1, length, width, device=device, dtype=dtype, requires_grad=True)
            runs = []
            for _ in range(repeats + 1):  # the first run warms the kernels up
                _sync(device)
                t = time.perf_counter()
                q, k, v, _o = proj(x).split(width, dim=-1)
                shape = (1, length, heads, head_dim)
                q, k, v = (y.reshape(shape).transpose(1, 2) for y in (q, k, v))
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                out.float().sum().backward()
                _sync(device)
                runs.append(time.perf_counter() - t)
            lengths.append(length)
            seconds.append(float(np.median(runs[1:])))
        except torch.OutOfMemoryError:
            break
        length *= 2
    if len(lengths) < 3:
        raise ValueError(f"only {len(lengths)} lengths fit on {device}; lower --max-len or --heads")
    a, b, c, worst = fit(np.array(lengths), np.array(seconds))
    return Calibration(device, np.array(lengths), np.array(seconds), a, b, c, worst)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()
