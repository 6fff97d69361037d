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

from mixing.mixfile.parts import Cost
from pipelines.calibrate import fit, measure

ROOT = Path(__file__).resolve().parents[2]


def test_the_fit_recovers_its_coefficients_and_never_goes_negative() -> None:
    l = 2.0 ** np.arange(10, 18)  # noqa: E741
    t = 3e-12 * l * l + 2e-8 * l + 5e-4
    a, b, c, worst = fit(l, t)
    assert a == pytest.approx(3e-12, rel=1e-6) and b == pytest.approx(2e-8, rel=1e-6) and c == pytest.approx(5e-4)
    assert worst < 1e-9
    a, b, c, _ = fit(l, 3e-12 * l * l - 1e-9 * l + 5e-4)  # a negative term is dropped, not kept
    assert min(a, b, c) >= 0 and b == 0


def test_a_cpu_measurement_gives_a_cost_the_mix_file_accepts() -> None:
    cal = measure("cpu", min_len=64, max_len=512, heads=2, head_dim=16, repeats=2)
    assert list(cal.lengths) == [64, 128, 256, 512] and (cal.seconds > 0).all()
    cost = yaml.safe_load(cal.mix_yaml())["balance"]["cost"]
    model = Cost(**cost).model()
    unit = cal.alpha or cal.beta
    assert model.unit_seconds == pytest.approx(unit, rel=1e-5)
    assert model.attention * unit == pytest.approx(cal.alpha, rel=1e-4, abs=1e-18)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_without_a_gpu_it_says_so_in_one_line() -> None:
    r = subprocess.run([sys.executable, "-m", "pipelines.cli", "calibrate"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "no GPU here" in r.stderr and len(r.stderr.strip().splitlines()) == 1
