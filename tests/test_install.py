"""A training node's install: a fresh virtual environment that has only torch (and what torch needs) takes
``pip install <the repository>`` with no extras, imports ``loaders`` without any of the factory's
dependencies, and trains a step from a build through ``PackedDataset``.

The fresh environment sees the development environment's torch through a ``.pth`` file naming a folder that
holds torch and its own requirements only (as on a GPU node, where torch is there first); everything else
comes from ``pip install``, from the package registry as a user's would.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import venv
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.test_layers import BUILD_ONLY

ROOT = Path(__file__).resolve().parent.parent
# what `pip install weir` may add beside torch's own set: the core requirements and theirs
CORE = {"weir", "numpy", "pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions"}

TRAIN_ONE_STEP = """
import json, sys
import torch
from loaders import PackedDataset, PackedLoader, StepLoader

ds = PackedDataset(sys.argv[1])
facts = ds.facts
steps = StepLoader(PackedLoader(ds, num_workers=0), micro_batch=4)  # as the README's loop
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Embedding(facts.vocab_size, 16), torch.nn.Linear(16, facts.vocab_size))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
step = next(iter(steps))
tokens = 0
for mb in step.micro_batches:
    logits = model(mb["input_ids"])
    loss = torch.nn.functional.cross_entropy(
        logits.flatten(0, 1), mb["labels"].flatten(), ignore_index=-100, reduction="sum"
    )
    (loss / step.num_targets).backward()
    tokens += int((mb["labels"] != -100).sum())
opt.step()
print(json.dumps({
    "loaded": sorted(m for m in sys.modules if "." not in m),
    "loader": __import__("loaders").__file__,
    "targets": int(step.num_targets),
    "tokens": tokens,
    "loss": float(loss),
}))
"""


def torch_closure() -> list[metadata.Distribution]:
    """torch and, recursively, the distributions its requirements (markers evaluated here) name."""
    seen: dict[str, metadata.Distribution] = {}
    todo = ["torch"]
    while todo:
        name = todo.pop()
        key = name.lower().replace("_", "-")
        if key in seen:
            continue
        dist = metadata.distribution(name)
        seen[key] = dist
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(seen.values())


def torch_site(folder: Path) -> set[str]:
    """``folder`` made to hold links to torch's installed files and its requirements'; their names."""
    folder.mkdir()
    names = set()
    for dist in torch_closure():
        site = Path(str(dist.locate_file("")))
        for top in {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}:
            if not (folder / top).exists():
                (folder / top).symlink_to(site / top)
        names.add(dist.metadata["Name"].lower().replace("_", "-"))
    return names


def source_copy(dest: Path) -> Path:
    """The package's sources, copied (pip builds in the tree it is given: not in the checkout)."""
    for name in ("pyproject.toml", "README.md", "MANIFEST.in"):
        shutil.copy2(ROOT / name, dest / name)
    for pkg in ("requirements", "contract", "mixing", "loaders", "assets", "pipelines"):
        shutil.copytree(ROOT / pkg, dest / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


@pytest.mark.slow
def test_a_training_node_installs_the_loader_alone_and_trains_a_step(demo_build: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "node"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    site = Path(
        subprocess.run(
            [python, "-c", "import site; print(site.getsitepackages()[0])"], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    torch_names = torch_site(tmp_path / "torch-site")
    (site / "torch-site.pth").write_text(str(tmp_path / "torch-site") + "\n")
    src = tmp_path / "src"
    src.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    pip = subprocess.run(
        [python, "-m", "pip", "install", "-q", str(source_copy(src))],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert pip.returncode == 0, pip.stderr[-3000:]

    listed = subprocess.run(
        [python, "-m", "pip", "list", "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=tmp_path,
    ).stdout
    installed = {d["name"].lower().replace("_", "-") for d in json.loads(listed)}
    added = installed - torch_names - {"pip", "setuptools", "wheel"}
    assert "weir" in added
    assert added <= CORE, f"pip install weir brought more than the loader needs: {sorted(added - CORE)}"
    assert not {n.replace("_", "-") for n in BUILD_ONLY} & installed

    run = subprocess.run(
        [python, "-c", TRAIN_ONE_STEP, str(demo_build)], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout)
    assert Path(out["loader"]).is_relative_to(site), f"imported loaders from {out['loader']}, not the install"
    assert not set(out["loaded"]) & (BUILD_ONLY | {"mixing", "assets", "pipelines"}), out["loaded"]
    assert out["targets"] > 0 and out["tokens"] == out["targets"]
    assert out["loss"] == out["loss"] and out["loss"] > 0  # a number, not NaN

    weir = subprocess.run([env_dir / "bin" / "weir", "--help"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert weir.returncode == 2 and "pip install 'weir[build]'" in weir.stderr, weir.stderr
    assert len(weir.stderr.strip().splitlines()) == 1, weir.stderr
