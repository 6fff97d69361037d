"""A weir build in a Hugging Face ``Trainer``: the dataloader override and a callback for the loader's state.

    torchrun --nproc-per-node 2 examples/train_hf.py build/demo runs/hf --save-steps 50
    torchrun --nproc-per-node 2 examples/train_hf.py build/demo runs/hf-b --resume runs/hf/checkpoint-50

Needs ``transformers`` (and ``accelerate``, which its ``Trainer`` uses); the model is a tiny Llama made from
a config, nothing downloaded. Three things differ from a map-style dataset:

- ``get_train_dataloader`` returns :class:`HFBatches`: one dict per micro-batch of each weir step
  (:class:`loaders.StepLoader`), with no ``len`` (``max_steps`` = ``ds.facts.steps``) and nothing for
  ``accelerate`` to shard (weir already gave each rank its share). Set ``gradient_accumulation_steps`` to
  the step's micro-batch count (1 by default).
- Hugging Face causal LMs shift ``labels`` themselves; weir's ``labels`` are already the next token, so
  :func:`hf_labels` shifts them back (``-100`` first): position p still predicts weir's ``labels[p]``.
- The ``Trainer``'s own resume would skip the batches already trained by reading them again
  (``ignore_data_skip=False``); the callback instead saves the loader state of every rank with each
  checkpoint and restores it at ``on_train_begin``, so ``ignore_data_skip=True``. The state saved is the
  one at the start of the next step (:meth:`loaders.StepLoader.state_at`), not the loader's position,
  which may run ahead of training when a framework prefetches.

The loss per source: with ``source_ids`` in the items, :class:`HFBatches` passes them (and the weir step)
along; ``WeirTrainer.compute_loss`` takes them out of the model's inputs, lets the ``Trainer`` compute its
loss as usual and sums the per-token losses of its logits by source (:mod:`loaders.provenance`); a callback
all-reduces the sums over the ranks at each step's end, rank 0 logs them to ``OUT/loss_per_source.csv``
(``source_log.py``: the format) and plots them at the end (``OUT/loss_per_source.png``; ``--no-plot``: none).

Document masking: with ``attn_implementation="flash_attention_2"`` and ``layout="varlen"`` (one [1, T]
micro-batch per step, ``position_ids`` restarting at each document) Transformers' padding-free path keeps
attention inside each document; the ``eager``/``sdpa`` attention used on CPU here attends across the
documents of a packed row (causally), as plain packing does.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from loaders import IGNORE_INDEX, PackedDataset, PackedLoader, Payload, StepLoader

STATE_FILE = "weir_loader_rank{rank}.json"
# what the model reads (labels: shifted by hf_labels), and each token's source for the loss per source
FIELDS = ("input_ids", "labels", "position_ids", "cu_seqlens", "source_ids")
PROVENANCE = ("source_ids", "weir_step")  # HFBatches' keys that are not model inputs


def hf_labels(labels: torch.Tensor) -> torch.Tensor:
    """weir's next-token ``labels`` [B, S] as Hugging Face's unshifted ones: the model shifts them back."""
    pad = torch.full_like(labels[:, :1], IGNORE_INDEX)
    return torch.cat([pad, labels[:, :-1]], dim=1)


def weir_labels(labels: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`hf_labels`: weir's next-token ``labels`` [B, S] (-100 last, where weir's always is)."""
    pad = torch.full_like(labels[:, :1], IGNORE_INDEX)
    return torch.cat([labels[:, 1:], pad], dim=1)


def source_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-token cross-entropy [B, S] of a causal LM's ``logits`` [B, S, V] against Hugging Face's unshifted
    ``labels`` [B, S] (:func:`hf_labels`): position p's loss is that of its prediction of weir's
    ``labels[:, p]`` (the token after p), aligned with the items' ``source_ids``; 0 where the label is -100
    and at the last position (whose weir label is always -100)."""
    b, s, v = logits.shape
    losses = torch.zeros(b, s, dtype=torch.float32, device=logits.device)
    shifted = F.cross_entropy(
        logits[:, :-1].reshape(-1, v).float(), labels[:, 1:].reshape(-1), ignore_index=IGNORE_INDEX, reduction="none"
    )
    losses[:, :-1] = shifted.view(b, s - 1)
    return losses


class HFBatches:
    """The ``Trainer``'s train dataloader: model inputs of each micro-batch of each remaining weir step, and,
    when the items carry ``source_ids``, those (int32 [B, S]) and ``weir_step`` (int) for the loss per source
    (:data:`PROVENANCE`: not model inputs; ``WeirTrainer.compute_loss`` takes them out)."""

    def __init__(self, steps: StepLoader) -> None:
        self.steps = steps

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for step in self.steps:
            for mb in step.micro_batches:
                batch: dict[str, Any] = {
                    "input_ids": mb["input_ids"],
                    "labels": hf_labels(mb["labels"]),
                    "position_ids": mb["position_ids"],
                }
                if "source_ids" in mb:
                    batch.update(source_ids=mb["source_ids"], weir_step=step.step)
                yield batch


def rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else int(os.environ.get("RANK", "0"))


def loader_callback(steps: StepLoader, resume_from: str | None = None, first_step: int = 0) -> Any:
    """A ``TrainerCallback`` that writes every rank's loader state into each checkpoint folder and restores it
    when training resumes (``first_step``: the weir step the Trainer's step 0 is; 0 for a whole run)."""
    from transformers import TrainerCallback

    class WeirLoaderCallback(TrainerCallback):  # type: ignore[misc]
        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            folder.mkdir(parents=True, exist_ok=True)
            saved = steps.state_at(first_step + state.global_step)  # the next step's start, read-ahead or not
            (folder / STATE_FILE.format(rank=rank())).write_text(json.dumps(saved))

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 0:
                return
            folder = Path(resume_from or Path(args.output_dir) / f"checkpoint-{state.global_step}")
            mine, first = folder / STATE_FILE.format(rank=rank()), folder / STATE_FILE.format(rank=0)
            found = mine if mine.exists() else first  # another world: any rank's (a step boundary) will do
            saved = json.loads(found.read_text()) if found.exists() else steps.state_at(first_step + state.global_step)
            steps.load_state_dict(saved)  # checks the build; takes effect when the Trainer iterates

    return WeirLoaderCallback()


def main() -> None:
    from source_log import LOG_NAME, PLOT_NAME, SourceLossLog, plot_source_losses  # a sibling: run as a script
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("build", help="a weir build folder")
    p.add_argument("out", help="the Trainer's output_dir (checkpoint-N folders, losses.jsonl)")
    p.add_argument("--save-steps", type=int, default=50)
    p.add_argument("--resume", default=None, help="a checkpoint-N folder to resume from")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--no-plot", action="store_true", help="no loss_per_source.png at the end (the log is written)")
    args = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)

    ds = PackedDataset(args.build, payload=Payload(fields=FIELDS))  # world: RANK / WORLD_SIZE or torch.distributed
    facts = ds.facts
    steps = StepLoader(PackedLoader(ds), micro_batch_tokens=None)  # one micro-batch a step: the Trainer counts by them
    assert facts.vocab_size is not None, "a weir build records its vocab_size"
    config = LlamaConfig(
        vocab_size=facts.vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=facts.seq_len,
        pad_token_id=facts.pad_id,
        eos_token_id=facts.eos_id,
        bos_token_id=None,
    )
    model = LlamaForCausalLM(config)
    extra: dict[str, Any] = {}
    if "average_tokens_across_devices" in TrainingArguments.__dataclass_fields__:
        extra["average_tokens_across_devices"] = True  # the loss: a mean over the global batch's targets
    targs = TrainingArguments(
        output_dir=args.out,
        max_steps=facts.steps,  # the whole run: the LR schedule's length
        learning_rate=args.lr,
        lr_scheduler_type="cosine",
        warmup_steps=max(1, facts.steps // 10),
        gradient_accumulation_steps=1,  # one micro-batch per weir step (micro_batch_tokens=None above)
        save_steps=args.save_steps,
        logging_steps=1,
        ignore_data_skip=True,  # the callback restores the loader; the Trainer must not skip batches itself
        report_to=[],
        use_cpu=True,
        ddp_backend="gloo",
        seed=0,
        **extra,
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    per_source = SourceLossLog(facts.sources, out / LOG_NAME if rank() == 0 else None)

    class LossLog(TrainerCallback):  # type: ignore[misc]
        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any) -> None:
            if logs and "loss" in logs and state.is_world_process_zero:
                with (out / "losses.jsonl").open("a") as f:
                    f.write(json.dumps({"step": state.global_step, "loss": logs["loss"]}) + "\n")

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            per_source.end_step()  # every rank, once per optimizer step: all-reduced, rank 0 logs

    class WeirTrainer(Trainer):  # type: ignore[misc]
        def get_train_dataloader(self) -> Any:
            return HFBatches(steps)

        def compute_loss(
            self, model: Any, inputs: dict[str, Any], return_outputs: bool = False, num_items_in_batch: Any = None
        ) -> Any:
            """The Trainer's own loss, and the micro-batch's per-token losses by source into ``per_source``."""
            carried = {key: inputs.pop(key) for key in PROVENANCE if key in inputs}
            # num_items_in_batch exists since transformers 4.46 (the Trainer passes it only there)
            kw = {} if num_items_in_batch is None else {"num_items_in_batch": num_items_in_batch}
            loss, outputs = super().compute_loss(model, inputs, return_outputs=True, **kw)
            if carried:
                with torch.no_grad():
                    losses = source_losses(outputs.logits, inputs["labels"])
                per_source.add(carried["weir_step"], losses, weir_labels(inputs["labels"]), carried["source_ids"])
            return (loss, outputs) if return_outputs else loss

    trainer = WeirTrainer(model=model, args=targs, callbacks=[loader_callback(steps, args.resume), LossLog()])
    trainer.train(resume_from_checkpoint=args.resume)
    if rank() == 0 and not args.no_plot:
        plot_source_losses(out / LOG_NAME, out / PLOT_NAME)


if __name__ == "__main__":
    main()
