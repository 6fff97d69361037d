"""The ``engine`` resource: where a build's fan-out work (tokenizing chunks, writing shards) runs.

``kind: local`` (default) runs it in the step's own process; ``kind: ray`` submits it as tasks to the Ray
cluster at ``ray_address`` (bound to ``WEIR_RAY_ADDRESS`` by :func:`pipelines.resources.engine_resource`),
so one small Dagster deployment drives a large cluster. Shown in the UI's resource view with its settings.
"""

from __future__ import annotations

from typing import Literal

import dagster as dg

from mixing.engine import LOCAL, Engine, RayEngine

__all__ = ["WeirEngine"]


class WeirEngine(dg.ConfigurableResource):  # type: ignore[type-arg]
    """Which engine runs the ``documents`` and ``packed_shards`` stages' work items.

    ``ray_address``: the cluster's GCS address (``host:6379``) or ``ray://host:10001`` (Ray Client); unset
    with ``kind: ray``, a Ray instance is started on the step's machine. ``max_retries``: how often Ray runs
    a task again whose worker died (killed, out of memory, node lost).
    """

    kind: Literal["local", "ray"] = "local"
    ray_address: str | None = None
    max_retries: int = 3

    def engine(self) -> Engine:
        """The engine; in a run or outside one (an ``EnvVar`` address is read from the environment)."""
        if self.kind == "local":
            return LOCAL
        address = self.ray_address
        if isinstance(address, dg.EnvVar):  # outside a run the field holds the variable, not its value
            address = address.get_value()
        return RayEngine(address, max_retries=self.max_retries)
