"""The loader's resumable position, in terms that survive a change of world.

The position is the training step reached plus how many of that step's sequences this DP rank has
already delivered. Steps are fixed by the build and the regrouping window, whatever the world, so a
state saved at a step boundary resumes on any ``dp_size`` / ``cp_size``: the remaining steps are simply
re-assigned. Inside a step, only the same DP layout can resume (other ranks' progress inside the step is
not in this rank's state); a different ``cp_size`` is fine.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from numbers import Integral, Real
from typing import Any

from contract.errors import WeirError

__all__ = ["STATE_VERSION", "LoaderState", "StateError"]

# Raised whenever LoaderState's fields change (tests/loaders/test_state.py pins them), with what an older
# state means in :data:`_OLDER`.
STATE_VERSION = 3
# Versions still read, each with the fields it may lack and the value that reproduces what it did: version 2
# gained period, micro_batches, slack, context, layout and edges one by one while it shipped.
_OLDER: dict[int, dict[str, Any]] = {
    2: {"period": 0, "micro_batches": "equal", "slack": 0.0, "context": None, "layout": 0, "edges": 0},
}


class StateError(WeirError, ValueError):
    """A state that cannot be resumed here: another build, plan or world, or a malformed dict."""


# the whole-number fields and their least value
_WHOLE = {
    "seed": -(1 << 63),
    "window": 1,
    "step": 0,
    "consumed": 0,
    "dp_rank": 0,
    "dp_size": 1,
    "cp_size": 1,
    "version": 1,
}
_WHOLE |= {"period": 0, "layout": 0, "edges": 0}
_BUILD_ID = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class LoaderState:
    """``step``: first training step this rank has not finished; ``consumed``: its sequences of ``step``
    already delivered. ``dp_rank``/``dp_size``/``cp_size`` record where it was saved; ``seed``, ``window``,
    ``period``, ``slack``, ``layout`` and ``edges`` fix the training steps (``slack`` is 0 when nothing is refined);
    ``context`` is the refinement's input for the window holding ``step`` (tokens per source of the training
    steps just before it, :meth:`loaders.planner.StepPlanner.context_at`), so that a resume needs no
    earlier window."""

    build_id: str
    seed: int
    window: int
    step: int
    consumed: int
    dp_rank: int
    dp_size: int
    cp_size: int
    version: int = STATE_VERSION
    period: int = 0  # regrouping template (0: none); states saved before it existed had none
    micro_batches: str = "equal"  # sequences per DP rank within a step: "equal" or "unequal"
    slack: float = 0.0  # refinement's balance bound (0: none); states saved before it existed had none
    context: list[list[int]] | None = None
    layout: int = 0  # regrouped windows' layout (loaders.planner.LAYOUT); states saved before it had 0
    edges: int = 0  # windows after a boundary that may mix cost classes (loaders.planner); before it: 0

    def __post_init__(self) -> None:
        """Every field checked for its type and range (a state may be edited by hand, or come from elsewhere):
        one :class:`StateError` line naming the field, never a silent replay or skip later."""
        for k, low in _WHOLE.items():
            v = getattr(self, k)
            if not isinstance(v, Integral) or isinstance(v, bool) or v < low:
                raise StateError(f"loader state field {k!r} is {v!r}; expected a whole number ≥ {low}")
        if self.dp_rank >= self.dp_size:
            raise StateError(f"loader state field 'dp_rank' is {self.dp_rank}; expected < dp_size {self.dp_size}")
        if not isinstance(self.build_id, str) or not _BUILD_ID.fullmatch(self.build_id):
            raise StateError(f"loader state field 'build_id' is {self.build_id!r}; expected 64 hex digits")
        if self.micro_batches not in ("equal", "unequal"):
            raise StateError(f"loader state field 'micro_batches' is {self.micro_batches!r}; expected equal or unequal")
        if not isinstance(self.slack, Real) or isinstance(self.slack, bool) or not 0 <= self.slack < math.inf:
            raise StateError(f"loader state field 'slack' is {self.slack!r}; expected a finite number ≥ 0")
        c = self.context
        if c is not None and not (
            isinstance(c, list)
            and all(isinstance(row, list) and len(row) == len(c[0]) for row in c)
            and all(isinstance(x, Integral) and not isinstance(x, bool) and x >= 0 for row in c for x in row)
        ):
            raise StateError("loader state field 'context' is not a list of equal rows of token counts ≥ 0")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able values, ``version`` among them (:data:`STATE_VERSION`)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> LoaderState:
        """The state :meth:`to_dict` gave, of this version or an older one still read (its absent fields take
        the values that reproduce what that loader did; it resumes as this version). Anything else is one
        :class:`StateError` line."""
        version = state.get("version") if isinstance(state, dict) else type(state).__name__
        if version != STATE_VERSION and version not in _OLDER:
            known = ", ".join(str(v) for v in sorted({*_OLDER, STATE_VERSION}))
            raise StateError(f"loader state version {version!r}; this loader reads versions {known}")
        defaults = _OLDER.get(version, {})
        unknown = sorted(set(state) - set(cls.__dataclass_fields__))
        if unknown:
            raise StateError(f"loader state version {version} has fields this loader does not know: {unknown}")
        try:
            values = {k: state[k] if k in state else defaults[k] for k in cls.__dataclass_fields__}
        except KeyError as e:
            raise StateError(f"loader state version {version} lacks field {e.args[0]!r}") from None
        return cls(**{**values, "version": STATE_VERSION})

    def check(self, here: LoaderState) -> None:
        """Raise :class:`StateError` unless this state can resume on the loader whose own state is ``here``
        (same build and training steps; inside a step, also the same DP layout)."""
        if self.build_id != here.build_id:
            raise StateError(
                f"this state comes from another build (build_id {self.build_id[:12]}…, this build is "
                f"{here.build_id[:12]}…); resume with the build the run started on"
            )
        steps = ("seed", "window", "period", "slack", "layout", "edges")
        if any(getattr(self, k) != getattr(here, k) for k in steps):
            saved = ", ".join(f"{k} {getattr(self, k)}" for k in steps)
            now = ", ".join(f"{k} {getattr(here, k)}" for k in steps)
            raise StateError(f"state was saved with {saved}; this loader has {now}")
        layout = ("dp_rank", "dp_size", "micro_batches")
        if self.consumed and any(getattr(self, k) != getattr(here, k) for k in layout):
            raise StateError(
                f"state was saved for dp rank {self.dp_rank}/{self.dp_size} ({self.micro_batches} micro-batches) "
                f"inside step {self.step}; a resume on dp rank {here.dp_rank}/{here.dp_size} ({here.micro_batches} "
                "micro-batches) needs a state saved at a step boundary"
            )
