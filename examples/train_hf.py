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

from loaders import IGNORE_INDEX, PackedDataset, PackedLoader, StepLoader

STATE_FILE = "weir_loader_rank{rank}.json"


def hf_labels(labels: torch.Tensor) -> torch.Tensor:
    """weir's next-token ``labels`` [B, S] as Hugging Face's unshifted ones: the model shifts them back."""
    pad = torch.full_like(labels[:, :1], IGNORE_INDEX)
    return torch.cat([pad, labels[:, :-1]], dim=1)


class HFBatches:
    """The ``Trainer``'s train dataloader: model inputs of each micro-batch of each remaining weir step."""

    def __init__(self, steps: StepLoader) -> None:
        self.steps = steps

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        for step in self.steps:
            for mb in step.micro_batches:
                yield {
                    "input_ids": mb["input_ids"],
                    "labels": hf_labels(mb["labels"]),
                    "position_ids": mb["position_ids"],
                }


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
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("build", help="a weir build folder")
    p.add_argument("out", help="the Trainer's output_dir (checkpoint-N folders, losses.jsonl)")
    p.add_argument("--save-steps", type=int, default=50)
    p.add_argument("--resume", default=None, help="a checkpoint-N folder to resume from")
    p.add_argument("--lr", type=float, default=3e-3)
    args = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)

    ds = PackedDataset(args.build)  # world from RANK / WORLD_SIZE (torchrun) or torch.distributed
    facts = ds.facts
    steps = StepLoader(PackedLoader(ds))
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
        gradient_accumulation_steps=1,  # one micro-batch per weir step (StepLoader's default)
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

    class LossLog(TrainerCallback):  # type: ignore[misc]
        def on_log(self, a: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any) -> None:
            if logs and "loss" in logs and state.is_world_process_zero:
                with (out / "losses.jsonl").open("a") as f:
                    f.write(json.dumps({"step": state.global_step, "loss": logs["loss"]}) + "\n")

    class WeirTrainer(Trainer):  # type: ignore[misc]
        def get_train_dataloader(self) -> Any:
            return HFBatches(steps)

    trainer = WeirTrainer(model=model, args=targs, callbacks=[loader_callback(steps, args.resume), LossLog()])
    trainer.train(resume_from_checkpoint=args.resume)


if __name__ == "__main__":
    main()
