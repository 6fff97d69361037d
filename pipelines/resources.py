"""Resources of the definitions, configured the Dagster way: values that differ per deployment come from
the environment through :class:`dagster.EnvVar`, so the UI shows where a setting comes from, never a secret.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import dagster as dg

from assets import WeirEngine, WeirStorage
from contract.errors import WeirError
from mixing import Mix

__all__ = ["S3_ENV", "engine_resource", "mix_storage_options", "storage_resource"]

# WeirStorage field → environment variable (the AWS SDKs' standard names, so existing setups just work).
S3_ENV = {
    "s3_endpoint_url": "AWS_ENDPOINT_URL",
    "aws_access_key_id": "AWS_ACCESS_KEY_ID",
    "aws_secret_access_key": "AWS_SECRET_ACCESS_KEY",
    "aws_region": "AWS_DEFAULT_REGION",
}


def storage_resource(
    root: Path | str, env: Mapping[str, str] = os.environ, per_mix: bool = True, bound: bool = True
) -> WeirStorage:
    """The ``storage`` resource: builds under ``root`` (``root/<mix>`` when ``per_mix``); S3 from the environment.

    Only fields that :class:`WeirStorage` declares and whose variable is set are bound (an unset
    ``EnvVar`` is an error when a run starts), so a machine without S3 needs no configuration. With ``bound``
    false the values themselves are set instead: for use outside a Dagster run (``weir build``'s own checks).
    """
    fields = WeirStorage.model_fields
    s3 = {f: dg.EnvVar(var) if bound else env[var] for f, var in S3_ENV.items() if f in fields and env.get(var)}
    return WeirStorage(root=str(root), per_mix=per_mix, **s3)  # type: ignore[arg-type]


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
