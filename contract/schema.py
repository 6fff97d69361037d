"""The conventions every typed part of the build contract follows (:mod:`contract.manifest`, :mod:`contract.record`).

:class:`Frozen` is the base of each part: strict (``"32"`` is not a count, ``1.0`` not an int), frozen (a part
is a value, never edited in place), and unknown keys ignored on read, so a newer writer's extra
field does not stop an older reader (writers are held to the declared fields by
:func:`contract.manifest.validated`). :data:`NonNeg` (an int ≥ 0), :data:`Pos` (an int ≥ 1) and :data:`Weight`
(a finite float ≥ 0) are the field types the parts' counts and weights use; a field annotated with
:data:`Defaulted` reads a recorded null as its default (:func:`none_is_default`).
"""

from __future__ import annotations

from typing import Annotated, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticUseDefault

__all__ = ["Defaulted", "Frozen", "NonNeg", "Pos", "Weight", "none_is_default"]

NonNeg = Annotated[int, Field(ge=0)]
Pos = Annotated[int, Field(ge=1)]
Weight = Annotated[float, Field(ge=0, allow_inf_nan=False)]
_T = TypeVar("_T")


def none_is_default(value: _T) -> _T:
    """A field recorded as null means its default (older and hand-written manifests)."""
    if value is None:
        raise PydanticUseDefault
    return value


Defaulted = BeforeValidator(none_is_default)


class Frozen(BaseModel):
    # strict: "32" is not a count; unknown keys are ignored on read (writers are held to the declared ones)
    model_config = ConfigDict(strict=True, frozen=True, extra="ignore")
