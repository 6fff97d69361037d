"""``PackedLoader``: a torch ``DataLoader`` over a :class:`PackedDataset` whose state is what the consumer got.

With ``num_workers > 0`` each worker process holds its own copy of the dataset and reads every
``num_workers``-th item of the rank's stream; the DataLoader hands them back in stream order (``in_order``),
so the consumer sees exactly the ``num_workers=0`` stream. Prefetched items the consumer never received
must not count as read, so the state is computed here, from the ``(step, slot)`` of the last item handed
out, not by the workers. A refined planner (``loaders.refinement``) chains its windows; the workers pass
each window's context along with their items, so that saving a state here never refines a window itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader

from contract.errors import WeirError
from loaders.dataset import SHARED_CONTEXTS, PackedDataset

__all__ = ["PackedLoader"]


class PackedLoader(DataLoader):
    """``DataLoader(dataset, batch_size=None, ...)`` with exact ``state_dict()``/``load_state_dict()``.

    Items are single sequences (``batch_size=None``: varlen sequences are not stacked); other keyword
    arguments (``num_workers``, ``pin_memory``, ``prefetch_factor`` …) pass through. For one optimizer step
    at a time (stacked or variable-length), wrap it in :class:`loaders.steps.StepLoader`.

    A new ``iter`` continues where the consumer stopped; once the whole build was read it raises
    :class:`loaders.dataset.ExhaustedError` (call :meth:`rewind` for another pass).
    """

    def __init__(self, dataset: PackedDataset, **kwargs: Any) -> None:
        if kwargs.pop("batch_size", None) is not None:
            raise ValueError(
                "PackedLoader yields one packed sequence per item; batch_size must stay None (for a step's "
                "sequences stacked [B, S] or as one varlen micro-batch, iterate loaders.StepLoader(loader))"
            )
        if kwargs.get("persistent_workers"):
            # persistent workers keep their own copy of the position, so a resumed pass would not reach them
            raise ValueError("PackedLoader does not support persistent_workers=True (its state lives in the workers)")
        super().__init__(dataset, batch_size=None, in_order=True, **kwargs)
        self._last: tuple[int, int] | None = None

    def __iter__(self) -> Iterator[dict[str, Any]]:  # type: ignore[override]
        if self._last is not None:  # a new pass continues where the consumer stopped, with workers or without
            self.dataset.load_state_dict(self.state_dict())  # type: ignore[attr-defined]
            self._last = None
        self.dataset.check_not_exhausted()  # type: ignore[attr-defined]
        planner = self.dataset.planner  # type: ignore[attr-defined]
        try:
            for item in super().__iter__():
                for first_step, context in item.pop(SHARED_CONTEXTS, {}).items():
                    planner.seed_context(first_step, context)  # so that state_dict() refines nothing here
                self._last = (int(item["step"]), int(item["slot"]))
                yield item
        except WeirError as e:
            raise _one_line(e) from None

    def state_dict(self) -> dict[str, Any]:
        """Position just after the last item this loader handed to its consumer."""
        ds: PackedDataset = self.dataset  # type: ignore[assignment]
        return ds.state_dict() if self._last is None else ds.state_at(*self._last)

    def rewind(self) -> None:
        """Start another pass over the whole build, from step 0 (see :meth:`PackedDataset.rewind`)."""
        self.dataset.rewind()  # type: ignore[attr-defined]
        self._last = None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at ``state`` (see :meth:`PackedDataset.load_state_dict`); takes effect at the next ``iter``."""
        self.dataset.load_state_dict(state)  # type: ignore[attr-defined]
        self._last = None


def _one_line(e: WeirError) -> WeirError:
    """``e`` as its own one-line message: a worker's error comes back as the text of its whole traceback,
    whose last line is ``module.Class: message``."""
    text = str(e).rstrip()
    if "Original Traceback" not in text:
        return e
    last = text.splitlines()[-1]
    name = f"{type(e).__module__}.{type(e).__qualname__}: "
    try:
        return type(e)(last.removeprefix(name))
    except Exception:
        return e
