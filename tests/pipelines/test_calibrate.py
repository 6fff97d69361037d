"""``pipelines/calibrate.py`` and ``weir calibrate``: the fit recovers known coefficients, a real (CPU) measurement
gives a cost model the mix file accepts, and without a GPU the command says so in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from mixing.mixfile.balance import Cost
from pipelines.calibrate import PACKED, PACKED_TOKENS, AttentionLayer, fit, measure

ROOT = Path(__file__).resolve().parents[2]


def test_the_fit_recovers_its_coefficients_and_never_goes_negative() -> None:
    l = np.concatenate([2.0 ** np.arange(10, 18), [128, 512, 2048]])  # noqa: E741
    m = np.concatenate([np.ones(8), [64, 16, 4]])  # single documents, then packed micro-batches of 8192 tokens
    features = np.stack([m * l * l, m * l, m, np.ones_like(l)], axis=1)
    truth = np.array([3e-12, 2e-8, 4e-6, 5e-4])
    coef, worst = fit(features, features @ truth)
    assert coef == pytest.approx(truth, rel=1e-6) and worst < 1e-9
    coef, _ = fit(features, features @ np.array([3e-12, -1e-9, 4e-6, 5e-4]))  # a negative term is dropped
    assert coef.min() >= 0 and coef[1] == 0


def test_a_cpu_measurement_gives_a_cost_the_mix_file_accepts() -> None:
    cal = measure("cpu", min_len=64, max_len=512, heads=2, head_dim=16, repeats=2)
    assert list(zip(cal.documents.tolist(), cal.lengths.tolist(), strict=True)) == [
        *((1, n) for n in (64, 128, 256, 512)),
        *((m, 64 * k // m) for k in PACKED_TOKENS for m in PACKED),  # two sizes of packed micro-batch
    ]
    assert (cal.seconds > 0).all() and cal.attention == "sdpa-per-piece"
    cost = yaml.safe_load(cal.mix_yaml())["balance"]["cost"]
    model = Cost(**cost).model()
    unit = cal.alpha or cal.beta or cal.delta or cal.gamma or 1.0
    assert model.unit_seconds == pytest.approx(unit, rel=1e-5)
    assert model.comm_bytes == 2 * 2 * 2 * 16 * 4  # one layer's K and V in and out, float32 on the CPU
    for term, seconds in zip(
        ("attention", "linear", "per_document", "per_micro_batch"),
        (cal.alpha, cal.beta, cal.delta, cal.gamma),
        strict=True,
    ):
        assert getattr(model, term) * unit == pytest.approx(seconds, rel=1e-4, abs=1e-15), term


def test_the_layer_runs_split_pieces_bottom_right_causal() -> None:
    """A chunk of a split document attends to the keys up to its end: its output equals the same rows of the
    whole document's causal attention (the reference, unsplit)."""
    torch.manual_seed(0)
    layer = AttentionLayer("cpu", heads=2, head_dim=8)
    q, k, v = (torch.randn(1, 2, 24, 8) for _ in range(3))
    full = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    from torch.nn.attention.bias import causal_lower_right

    chunk = torch.nn.functional.scaled_dot_product_attention(
        q[:, :, 8:16], k[:, :, :16], v[:, :, :16], attn_mask=causal_lower_right(8, 16)
    )
    assert torch.allclose(chunk, full[:, :, 8:16], atol=1e-6)
    layer.run(np.array([24, 8, 8]), np.array([24, 16, 32]), 24)  # one whole document, two chunks of a split one


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_without_a_gpu_it_says_so_in_one_line() -> None:
    r = subprocess.run([sys.executable, "-m", "pipelines.cli", "calibrate"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "no GPU here" in r.stderr and len(r.stderr.strip().splitlines()) == 1
