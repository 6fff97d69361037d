"""Labels and positions rebuilt on the trainer's device from a lean item (``fields=("input_ids", "cu_seqlens")``).

The loader then ships 8 bytes per token instead of 24; these functions give exactly what the loader would
have given (:class:`loaders.PackedDataset`'s ``labels`` and ``position_ids``), with torch ops only on the
tensors' device and no host synchronisation (``num_tokens`` is the item's Python int).
"""

from __future__ import annotations

import torch

from loaders.fields import IGNORE_INDEX

__all__ = ["cp_position_ids", "labels", "position_ids"]


def labels(input_ids: torch.Tensor, cu_seqlens: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Next-token targets of one whole packed sequence (``cp_size == 1``): int64 [S] on ``input_ids``' device.

    ``input_ids`` [S] (any integer dtype), ``cu_seqlens`` int [k+1] (the item's, on any device),
    ``num_tokens`` the item's real-token count: ``labels[p] = input_ids[p + 1]`` inside a segment,
    ``IGNORE_INDEX`` (-100) at each segment's last token and from ``num_tokens`` on (padding).
    """
    S = input_ids.shape[-1]
    out = torch.empty(S, dtype=torch.int64, device=input_ids.device)
    out[:-1] = input_ids[1:]
    out[-1:] = IGNORE_INDEX
    out[cu_seqlens[1:].to(device=out.device, dtype=torch.int64) - 1] = IGNORE_INDEX
    out[num_tokens:] = IGNORE_INDEX
    return out


def position_ids(cu_seqlens: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Position of each slot of one whole packed sequence inside its segment (0-based; trailing padding is a
    segment too), int64 [seq_len] on ``cu_seqlens``' device; ``seq_len`` = ``cu_seqlens[-1]`` (the item's S,
    passed so that no device value is read back)."""
    cu = cu_seqlens.to(dtype=torch.int64)
    starts = torch.repeat_interleave(cu[:-1], cu[1:] - cu[:-1], output_size=seq_len)
    return torch.arange(seq_len, device=cu.device) - starts


def cp_position_ids(indices: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """The positions of a ``cp_size > 1`` item's slots (its ``indices``, int64 [n], -1 for CP padding) inside
    their segments, 0 for padding: int64 [n] on ``indices``' device, equal to the item's ``position_ids``."""
    cu = cu_seqlens.to(device=indices.device, dtype=torch.int64)
    real = indices.clamp(min=0)
    start = cu[torch.searchsorted(cu, real, right=True) - 1]
    return torch.where(indices >= 0, real - start, torch.zeros_like(real))
