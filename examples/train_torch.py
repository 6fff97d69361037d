"""A tiny causal LM trained on a weir build with plain PyTorch: DDP under ``torchrun``, exact checkpoints.

    torchrun --nproc-per-node 2 examples/train_torch.py build/demo runs/a --save-every 50  # train, checkpoints
    torchrun --nproc-per-node 2 examples/train_torch.py build/demo runs/a --resume         # after a kill: the latest
    torchrun --nproc-per-node 1 examples/train_torch.py build/demo runs/b --resume runs/a/checkpoints/step-50.pt

What it shows, each in a few lines below:

- the run's facts from the dataset (``ds.facts``): vocabulary, sequence length, total steps for the LR
  schedule; nothing read from ``manifest.json`` by hand;
- one optimizer step at a time (:class:`loaders.StepLoader`): this rank's sequences stacked ``[B, S]`` (or
  one variable-length micro-batch), with ``cu_seqlens``, turned here into a document mask (a token attends
  only to earlier tokens of its own document; flash-attention's ``flash_attn_varlen_func`` takes
  ``cu_seqlens``/``max_seqlen`` directly);
- the loss as a mean over the *global* batch's targets (each rank's sum, divided by the count all-reduced
  over ranks, times the DP size because DDP averages gradients), so that any world trains the same model;
- a checkpoint holding the model, optimizer, LR schedule and every rank's loader state, written at a step
  boundary: a resume continues with the next step, on the same world or another one (elastic);
- the loss per source: the items carry ``source_ids``, each micro-batch's per-token losses are summed by
  source (:mod:`loaders.provenance`), all-reduced over the ranks at every step and logged by rank 0
  (``source_log.py``: the log's format), and plotted at the end.

The last command resumes on one process what two trained (elastic: the steps stay the build's, whatever
the world). Gloo on CPU here (``--backend nccl`` and ``.cuda()`` on GPUs). Checkpoints go to
``RUN/checkpoints/step-N.pt`` (N steps done); ``RUN/losses.jsonl`` gets one line per step (rank 0):
``{"step", "loss", "sequences"}``; ``RUN/loss_per_source.csv`` one row per step and source (rank 0; columns
``step,source,loss_sum,tokens``, see ``source_log.py``) and ``RUN/loss_per_source.png`` its plot at the end
(``--no-plot``: none); the test (tests/examples) reads them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from source_log import LOG_NAME, PLOT_NAME, SourceLossLog, plot_source_losses
from torch import nn

from loaders import IGNORE_INDEX, PackedDataset, PackedLoader, Payload, StepLoader

# what the model and the loss read, and each token's source for the loss per source (opt-in: loaders.fields)
FIELDS = ("input_ids", "labels", "position_ids", "cu_seqlens", "source_ids")


class TinyLM(nn.Module):
    """Embedding, one pre-norm transformer block with a document mask, tied output head."""

    def __init__(self, vocab: int, seq_len: int, dim: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq_len, dim)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        for table in (self.embed, self.pos):
            nn.init.normal_(table.weight, std=0.02)  # small logits at first: the loss starts near ln(vocab)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        """Logits [N, vocab] of the N = B·S (or T) flattened slots; ``cu_seqlens`` bounds their documents."""
        x = self.embed(input_ids.reshape(-1)) + self.pos(position_ids.reshape(-1))
        n, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(n, 3, self.heads, dim // self.heads).permute(1, 2, 0, 3)
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=document_mask(cu_seqlens, n))
        x = x + self.out(attn.transpose(0, 1).reshape(n, dim))
        x = x + self.mlp(self.norm2(x))
        return self.norm3(x) @ self.embed.weight.T


def document_mask(cu_seqlens: torch.Tensor, n: int) -> torch.Tensor:
    """Bool [n, n]: slot i may attend to slot j iff j ≤ i in the same segment of ``cu_seqlens``."""
    doc = torch.searchsorted(cu_seqlens[1:].to(torch.int64), torch.arange(n), right=True)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    return causal & (doc[:, None] == doc[None, :])


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside DDP's wrapper (what a checkpoint holds, so that any world loads it)."""
    inner = getattr(model, "module", model)
    assert isinstance(inner, nn.Module)
    return inner


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("build", help="a weir build folder (or its shards folder, or an s3:// URI)")
    p.add_argument("run", help="folder for checkpoints/ and losses.jsonl")
    p.add_argument("--stop", type=int, default=None, help="stop after this many steps (checkpointed)")
    p.add_argument("--save-every", type=int, default=0, help="also checkpoint every N steps")
    p.add_argument("--resume", nargs="?", const="latest", help="continue from a checkpoint (default: RUN's latest)")
    p.add_argument("--layout", choices=["stacked", "varlen"], default=None)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--backend", default="gloo")
    p.add_argument("--no-plot", action="store_true", help="no loss_per_source.png at the end (the log is written)")
    args = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)  # bit-identical runs on CPU
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group(args.backend)
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    run = Path(args.run)
    run.mkdir(parents=True, exist_ok=True)

    ds = PackedDataset(args.build, payload=Payload(fields=FIELDS))  # world from torch.distributed; mix file's seed
    facts = ds.facts  # what the run needs to know, typed
    steps = StepLoader(PackedLoader(ds), layout=args.layout)
    assert facts.vocab_size is not None, "a weir build records its vocab_size"
    model: nn.Module = TinyLM(facts.vocab_size, facts.seq_len)
    if distributed:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    warmup = max(1, facts.steps // 10)  # linear warmup, cosine decay over the whole run: facts.steps

    def lr_at(t: int) -> float:
        return min(1.0, (t + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(t, facts.steps) / facts.steps))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    if args.resume:
        latest = max((run / "checkpoints").glob("step-*.pt"), key=lambda f: int(f.stem[5:]), default=None)
        path = latest if args.resume == "latest" else Path(args.resume)
        assert path is not None, f"no checkpoint in {run / 'checkpoints'}"
        ckpt = torch.load(path, weights_only=False)
        unwrap(model).load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        sched.load_state_dict(ckpt["scheduler"])
        # same world: this rank's own state; another world: any of them (all are step boundaries)
        states = ckpt["loader"]
        steps.load_state_dict(states[rank] if len(states) == world else states[0])

    log = (run / "losses.jsonl").open("a") if rank == 0 else None
    per_source = SourceLossLog(facts.sources, run / LOG_NAME if rank == 0 else None)
    for done, step in enumerate(steps, start=1):
        opt.zero_grad()
        targets = torch.tensor([step.num_targets], dtype=torch.float64)
        if distributed:
            dist.all_reduce(targets)  # the global batch's targets: every rank divides by the same count
        total = 0.0
        for mb in step.micro_batches:
            logits = model(mb["input_ids"], mb["position_ids"], mb["cu_seqlens"])
            labels = mb["labels"].reshape(-1)
            losses = F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="none")  # 0 where ignored
            loss_sum = losses.sum()
            (loss_sum * world / targets).backward()  # DDP averages gradients over ranks: × world undoes it
            total += float(loss_sum.detach())
            per_source.add(step.step, losses, labels, mb["source_ids"].reshape(-1))  # sums on the device
        opt.step()
        sched.step()
        per_source.end_step()  # every rank: all-reduced over the ranks; rank 0 appends the step's rows
        loss = torch.tensor([total], dtype=torch.float64)
        seqs: list[Any] = [list(step.sequences)]
        if distributed:
            dist.all_reduce(loss)
            gathered: list[Any] = [None] * world
            dist.all_gather_object(gathered, list(step.sequences))
            seqs = gathered
        if log is not None:
            record = {"step": step.step, "loss": float(loss / targets), "sequences": sorted(s for g in seqs for s in g)}
            log.write(json.dumps(record) + "\n")
            log.flush()
        if args.stop is not None and done >= args.stop:
            break
        if args.save_every and (step.step + 1) % args.save_every == 0 and step.step + 1 < facts.steps:
            save(run, model, opt, sched, steps, rank, world, distributed)  # a kill loses at most N steps
    save(run, model, opt, sched, steps, rank, world, distributed)
    if log is not None:
        log.close()
        if not args.no_plot:
            plot_source_losses(run / LOG_NAME, run / PLOT_NAME)
    if distributed:
        dist.destroy_process_group()


def save(
    run: Path, model: nn.Module, opt: Any, sched: Any, steps: StepLoader, rank: int, world: int, ddp: bool
) -> None:
    """Every rank's loader state (at a step boundary), with the model, optimizer and LR schedule (rank 0)."""
    states: list[Any] = [steps.state_dict()]
    if ddp:
        states = [None] * world
        dist.all_gather_object(states, steps.state_dict())
    if rank == 0:
        ckpt = {
            "model": unwrap(model).state_dict(),
            "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict(),
            "loader": states,
        }
        folder = run / "checkpoints"
        folder.mkdir(exist_ok=True)
        # steps done = the step the loader resumes at (a boundary); written whole, then renamed
        torch.save(ckpt, folder / "step.tmp")
        os.replace(folder / "step.tmp", folder / f"step-{states[0]['step']}.pt")
    if ddp:
        dist.barrier()


if __name__ == "__main__":
    main()
