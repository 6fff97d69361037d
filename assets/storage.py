"""The build-storage resource: where each mix's build folder lives."""

from pathlib import Path

import dagster as dg

from mixing import BuildLayout, Mix

__all__ = ["WeirStorage"]


class WeirStorage(dg.ConfigurableResource):  # type: ignore[type-arg]
    """Builds go to ``root/<mix name>``, or straight into ``root`` when ``per_mix`` is false."""

    root: str = "build"
    per_mix: bool = True

    def layout(self, mix: Mix) -> BuildLayout:
        base = Path(self.root).expanduser().resolve()
        return BuildLayout(base / mix.name if self.per_mix else base)
