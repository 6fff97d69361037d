"""Resources of the definitions, configured the Dagster way: values that differ per deployment come from
the environment through :class:`dagster.EnvVar`, so the UI shows where a setting comes from, never a secret.

The ``storage`` resource is a :class:`LeasedStorage`: a run's step that builds into an object-store root holds
the root's lease (:mod:`pipelines.lease`) from its first use of the root to its end, as ``weir build`` does.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import PrivateAttr

from assets import WeirEngine, WeirStorage
from contract.errors import WeirError
from contract.redaction import redact_url
from contract.store import Store
from mixing import BuildLayout, Mix
from pipelines.lease import held_lease, root_lease
from pipelines.outage import riding_outages

__all__ = ["S3_ENV", "LeasedStorage", "engine_resource", "mix_storage_options", "storage_resource"]


class LeasedStorage(WeirStorage):
    """:class:`assets.WeirStorage` whose steps hold the lease of the object-store root they build into.

    The lease is taken when a step first asks for the layout of a mix whose build is published to an ``s3://``
    root (:meth:`layout`), waiting for another build's lease to end (said in the step's log), and released when
    the step ends; meanwhile the root is fenced (its writes are refused once the lease is lost) and an endpoint
    outage is ridden out (:mod:`pipelines.outage`). A step of ``weir build``'s own run writes under the lease
    its process holds already. Outside a run (``layout`` called directly: reading a build), nothing is taken.
    """

    _leases: _Leases | None = PrivateAttr(default=None)

    @contextmanager
    def yield_for_execution(self, context: dg.InitResourceContext) -> Iterator[LeasedStorage]:
        with _Leases(_step_log) as leases:
            self._leases = leases
            try:
                yield self
            finally:
                self._leases = None

    def layout(self, mix: Mix) -> BuildLayout:
        layout = super().layout(mix)
        if layout.target is not None and self._leases is not None:
            self._leases.hold(Store(layout.target, layout.storage_options))
        return layout


def _step_log(line: str) -> None:
    """``line`` in the log of the step running now (the lease is taken, and said, while a step runs)."""
    try:
        dg.OpExecutionContext.get().log.info(line)
    except dg.DagsterInvariantViolationError:  # not in a step
        print(line)


class _Leases:
    """The leases one step holds (one per root it builds into), released together when it ends."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say, self._stack, self._roots = say, ExitStack(), set[str]()

    def __enter__(self) -> _Leases:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stack.__exit__(*exc)

    def hold(self, store: Store) -> None:
        if store.url in self._roots or held_lease(store) is not None:
            return
        lease = self._stack.enter_context(root_lease(store, wait=True, say=self.say))
        until = lease.deadline if lease is not None else None
        self._stack.enter_context(riding_outages(redact_url(store.url), self.say, until=until))
        self._roots.add(store.url)


# WeirStorage field → environment variable (the AWS SDKs' standard names, so existing setups just work).
S3_ENV = {
    "s3_endpoint_url": "AWS_ENDPOINT_URL",
    "aws_access_key_id": "AWS_ACCESS_KEY_ID",
    "aws_secret_access_key": "AWS_SECRET_ACCESS_KEY",
    "aws_region": "AWS_DEFAULT_REGION",
}


def storage_resource(
    root: Path | str, env: Mapping[str, str] = os.environ, per_mix: bool = True, bound: bool = True
) -> LeasedStorage:
    """The ``storage`` resource (a :class:`LeasedStorage`): builds under ``root`` (``root/<mix>`` when
    ``per_mix``); S3 from the environment.

    Only fields that :class:`WeirStorage` declares and whose variable is set are bound (an unset
    ``EnvVar`` is an error when a run starts), so a machine without S3 needs no configuration. With ``bound``
    false the values themselves are set instead: for use outside a Dagster run (``weir build``'s own checks).
    """
    fields = WeirStorage.model_fields
    s3 = {f: dg.EnvVar(var) if bound else env[var] for f, var in S3_ENV.items() if f in fields and env.get(var)}
    return LeasedStorage(root=str(root), per_mix=per_mix, **s3)  # type: ignore[arg-type]


def engine_resource(
    env: Mapping[str, str] = os.environ, kind: str | None = None, address: str | None = None
) -> WeirEngine:
    """The ``engine`` resource: ``kind`` (default ``$WEIR_ENGINE``, else ``local``) and the Ray cluster's
    ``address`` (default ``$WEIR_RAY_ADDRESS``, bound as an ``EnvVar`` so the UI shows where it comes from)."""
    kind = kind or env.get("WEIR_ENGINE", "").strip() or "local"
    if kind not in ("local", "ray"):
        raise WeirError(f"engine {kind!r} (WEIR_ENGINE or --engine): expected local or ray")
    if address:
        return WeirEngine(kind=kind, ray_address=address)  # type: ignore[arg-type]
    if kind == "ray" and env.get("WEIR_RAY_ADDRESS"):
        return WeirEngine(kind=kind, ray_address=dg.EnvVar("WEIR_RAY_ADDRESS"))  # type: ignore[arg-type]
    return WeirEngine(kind=kind)  # type: ignore[arg-type]


def mix_storage_options(mix: Mix, env: Mapping[str, str] = os.environ) -> dict[str, object] | None:
    """fsspec options from the environment (as the resource binds them), only for mixes that read remote files;
    for the CLI's own stage runs outside Dagster (``weir plan``)."""
    uris = [mix.source_uri(n) for n in mix.sources]
    if not any("://" in u and not u.startswith("file://") for u in uris):
        return None
    return storage_resource(Path("."), env, per_mix=False, bound=False).storage_options()
