"""Run by ``torchrun --nproc-per-node 4`` from test_hybrid_steps.py: the hybrid layout trained for real, on gloo.

Four ranks (dp 2 × cp 2, 24 tokens per rank and micro-batch, so that the tiny build's documents are dealt
whole, over blocks of 2 and over all 4, some of a rank's micro-batches holding blocks of two sizes) each read
their micro-batches from :class:`loaders.hybrid_steps.HybridStepLoader` and train a tiny causal transformer
(two layers, float32, attention restricted to each document) for three steps: per block of a micro-batch, its
ranks all-gather K and V in the block's process group and mask by document and position; each rank's summed
loss is divided by the step's targets, and gradients and losses are summed over all ranks. Every rank also
computes the same step in one process (the same model, all the step's documents whole, one attention mask)
and compares: the loss and every gradient must agree to float32 reduction order (relative 1e-5). Rank 0
checks that the ranks' slots hold every token of the step once, writes the largest differences to
``argv[2]`` + ``.diff``, and "ok" or the first problems to ``argv[2]``.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from contract.cost import CostModel
from loaders.context_parallel import thd_slots
from loaders.hybrid import HybridWorld
from loaders.hybrid_steps import HybridBlock, HybridStepLoader

WORLD = HybridWorld(dp=2, cp=2, capacity=24, gpus_per_node=2)
COST = CostModel()  # attention alone: documents split only where capacity needs it
STEPS = 3
TOLERANCE = 1e-5  # relative: float32 sums taken in another order (per rank, then all-reduced)


class _Gather(torch.autograd.Function):
    """All-gather along a new first dimension; the backward pass sums every rank's gradient (all-reduce) and
    keeps this rank's part."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, rank: int, size: int) -> torch.Tensor:
        ctx.group, ctx.rank = group, rank
        out = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(out, x.contiguous(), group=group)
        return torch.stack(out)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad[ctx.rank], None, None, None


def slot_keys(block: HybridBlock, cp_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per slot of ``cp_rank`` in ``block``: its document among the block's and its position in it (THD)."""
    lengths = np.diff(block.cu_seqlens.numpy().astype(np.int64))
    s = thd_slots(lengths, block.local_cp_size, cp_rank)
    doc = np.searchsorted(s.cu_seqlens_padded[1:], s.padded, side="right")
    return torch.from_numpy(doc), torch.from_numpy(s.position_ids)


class TinyLM(nn.Module):
    """Two pre-norm layers, learned positions, causal attention inside each document of each block."""

    def __init__(self, vocab: int, positions: int, dim: int = 32, heads: int = 2, layers: int = 2) -> None:
        super().__init__()
        self.heads, self.dim = heads, dim
        self.embed, self.pos = nn.Embedding(vocab, dim), nn.Embedding(positions, dim)
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(2 * layers + 1))
        self.qkv = nn.ModuleList(nn.Linear(dim, 3 * dim) for _ in range(layers))
        self.proj = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))
        self.mlp = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim)) for _ in range(layers)
        )
        self.head = nn.Linear(dim, vocab)

    def forward(self, mb: dict[str, Any], groups: dict[tuple[int, ...], Any]) -> torch.Tensor:
        """Logits [n, vocab] of the micro-batch's slots; ``groups``: each block's process group."""
        x = self.embed(mb["input_ids"][0]) + self.pos(mb["position_ids"][0])
        for layer in range(len(self.qkv)):
            x = x + self.attend(layer, self.norms[2 * layer](x), mb["blocks"], groups)
            x = x + self.mlp[layer](self.norms[2 * layer + 1](x))
        return self.head(self.norms[-1](x))

    def attend(self, layer: int, h: torch.Tensor, blocks: tuple[HybridBlock, ...], groups: dict) -> torch.Tensor:
        n, dh = len(h), self.dim // self.heads
        q, k, v = self.qkv[layer](h).view(n, 3, self.heads, dh).unbind(1)
        outs: list[torch.Tensor] = []
        for b in blocks:
            a, z = b.slots
            kv = torch.stack([k[a:z], v[a:z]])  # one collective per block and layer: [2, slots, heads, dh]
            if outs:
                # the backward pass's all-reduces must run in one order on every rank of every block: chained so,
                # this block's runs before the previous block's (each rank's blocks come in degree order)
                kv = kv + 0.0 * outs[-1].sum()
            doc_q, pos_q = slot_keys(b, b.local_cp_rank)
            if b.local_cp_size > 1:
                kv_all = _Gather.apply(kv, groups[b.ranks], b.local_cp_rank, b.local_cp_size)
                keys = [slot_keys(b, r) for r in range(b.local_cp_size)]
                doc_k, pos_k = torch.cat([d for d, _ in keys]), torch.cat([p for _, p in keys])
                k_all, v_all = kv_all.transpose(0, 1).flatten(1, 2).unbind(0)  # [d·slots, heads, dh] each
            else:
                doc_k, pos_k, k_all, v_all = doc_q, pos_q, kv[0], kv[1]
            allowed = (doc_q[:, None] == doc_k[None, :]) & (pos_k[None, :] <= pos_q[:, None])
            scores = torch.einsum("qhd,khd->hqk", q[a:z], k_all) / math.sqrt(dh)
            scores = scores.masked_fill(~allowed, float("-inf"))
            outs.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), v_all).reshape(z - a, self.dim))
        return self.proj[layer](torch.cat(outs) if outs else h.new_zeros(0, self.dim))


def reference_step(model: TinyLM, loader: HybridStepLoader, step: int) -> torch.Tensor:
    """The step in one process: all its documents whole, one block of degree 1; its loss (backward done)."""
    docs = loader.documents(step)
    T = int(docs.cu[-1])
    cu = torch.from_numpy(docs.cu.astype(np.int32))
    whole = HybridBlock((0,), 1, 0, (0, len(docs.cu) - 1), (0, T), cu, cu, int(docs.lengths.max()))
    _, pos = slot_keys(whole, 0)
    mb = {"input_ids": docs.input_ids.unsqueeze(0), "position_ids": pos.unsqueeze(0), "blocks": (whole,)}
    logits = model(mb, {})
    loss = F.cross_entropy(logits, docs.labels, reduction="sum", ignore_index=-100) / docs.num_targets
    loss.backward()
    return loss.detach()


def main(build: str, out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    assert dist.get_world_size() == WORLD.size
    loader = HybridStepLoader(build, WORLD, rank, cost=COST)
    # every block's process group, created by every rank in one order (new_group is collective)
    groups: dict[tuple[int, ...], Any] = {}
    size = 2
    while size <= WORLD.size:
        for first in range(0, WORLD.size, size):
            ranks = tuple(range(first, first + size))
            groups[ranks] = dist.new_group(list(ranks))
        size *= 2
    torch.manual_seed(0)
    vocab = int(loader.facts.vocab_size or 512)
    model = TinyLM(vocab, positions=loader.facts.seq_len + 2 * WORLD.size)
    reference = TinyLM(vocab, positions=loader.facts.seq_len + 2 * WORLD.size)
    reference.load_state_dict(model.state_dict())
    problems: list[str] = []
    lines: list[str] = []
    worst_loss = worst_grad = 0.0
    seen: list[tuple[int, int, int, int]] = []  # (step, document, position, token) of every real slot
    for step in loader:
        if step.step >= STEPS:
            break
        model.zero_grad()
        local = torch.zeros(())
        for mb in step.micro_batches:
            if not mb["blocks"]:
                continue  # an empty micro-batch: this rank is in no block of it, so no collective waits for it
            logits = model(mb, groups)
            loss = F.cross_entropy(logits, mb["labels"][0], reduction="sum", ignore_index=-100) / step.num_targets
            loss.backward()
            local += loss.detach()
            idx, cu = mb["indices"][0].numpy(), mb["cu_seqlens"].numpy()
            docs = mb["documents"].numpy()
            for slot in np.flatnonzero(idx >= 0).tolist():
                j = int(np.searchsorted(cu[1:], idx[slot], side="right"))
                seen.append((step.step, int(docs[j]), int(idx[slot] - cu[j]), int(mb["input_ids"][0, slot])))
        params = list(model.parameters())
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in params])
        flat = torch.cat([flat, local.view(1)])
        dist.all_reduce(flat)  # SUM over all ranks: each rank's loss was over the whole step's targets
        dist_loss = flat[-1]
        reference.zero_grad()
        ref_loss = reference_step(reference, loader, step.step)
        d_loss = abs(float(dist_loss - ref_loss)) / abs(float(ref_loss))
        d_grad = 0.0
        offset = 0
        for p, r in zip(params, reference.parameters(), strict=True):
            g, want = flat[offset : offset + p.numel()], r.grad.flatten() if r.grad is not None else None
            offset += p.numel()
            scale = float(want.abs().max()) if want is not None else 0.0
            diff = float((g - want).abs().max()) if want is not None else float(g.abs().max())
            d_grad = max(d_grad, diff / scale if scale > 0 else diff)
        worst_loss, worst_grad = max(worst_loss, d_loss), max(worst_grad, d_grad)
        lines.append(
            f"step {step.step}: loss {float(dist_loss):.6f} (one process {float(ref_loss):.6f}), relative difference "
            f"{d_loss:.2e}; largest gradient difference {d_grad:.2e} of the parameter's largest gradient; "
            f"{step.deal.micro_batches} micro-batches, degrees {sorted(set(step.deal.degree.tolist()))}"
        )
        if d_loss > TOLERANCE or d_grad > TOLERANCE:
            problems.append(f"rank {rank} step {step.step}: loss differs by {d_loss:.2e}, a gradient by {d_grad:.2e}")
        with torch.no_grad():  # the same SGD step on both, each with its own gradients
            offset = 0
            for p, r in zip(params, reference.parameters(), strict=True):
                p.sub_(0.5 * flat[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
                if r.grad is not None:
                    r.sub_(0.5 * r.grad)
    gathered: list[Any] = [None] * WORLD.size
    dist.all_gather_object(gathered, (problems, seen))
    if rank == 0:
        problems = [p for ps, _ in gathered for p in ps]
        slots = sorted(s for _, ss in gathered for s in ss)
        tokens: list[tuple[int, int, int, int]] = []  # (step, document, position, token) of every step's token
        for t in range(STEPS):
            docs = loader.documents(t)
            ids = docs.input_ids.tolist()
            for j in range(len(docs.cu) - 1):
                tokens += [(t, j, p, ids[int(docs.cu[j]) + p]) for p in range(int(docs.lengths[j]))]
        if slots != sorted(tokens):
            problems.append(
                f"the ranks' real slots ({len(slots)}) are not the steps' tokens ({len(tokens)}), each once"
            )
        degrees = {d for line in lines for d in line.split("degrees ")[1].strip("[]").split(", ")}
        if not {"1", "2", "4"} <= degrees:
            problems.append(f"the steps split documents over {sorted(degrees)} ranks only; expected 1, 2 and 4")
        lines.append(f"largest relative loss difference {worst_loss:.2e}, largest gradient difference {worst_grad:.2e}")
        Path(out + ".diff").write_text("\n".join(lines) + "\n")
        Path(out).write_text("ok" if not problems else "; ".join(problems[:5]))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
