"""The build-storage resource: where each mix's build lives (a local folder or an object store), and how
sources' and builds' storage is reached."""

import hashlib
import os
from pathlib import Path
from typing import Any

import dagster as dg

from contract.store import Store, is_local
from mixing import BuildLayout, Mix

__all__ = ["WeirStorage"]


class WeirStorage(dg.ConfigurableResource):  # type: ignore[type-arg]
    """Builds go to ``root/<mix name>``, or straight into ``root`` when ``per_mix`` is false.

    ``root`` is a local folder or an fsspec URL (``s3://bucket/prefix``; a root fsspec cannot reach is one
    :class:`~contract.store.StoreError`). A build in object storage keeps a local working folder for its
    DuckDB database and small files under ``work_dir`` (default ``$WEIR_WORK_DIR``, else
    ``~/.cache/weir/work``), one sub-folder per build URL, so every step of a run on this machine finds it.

    Sources on ``s3://`` are read with s3fs using ``s3_endpoint_url``, ``aws_access_key_id``,
    ``aws_secret_access_key`` and ``aws_region`` when set (wire them to ``dg.EnvVar("AWS_ENDPOINT_URL")``
    and friends); when unset, s3fs/botocore read the same ``AWS_*`` environment variables themselves.
    Credentials and endpoints never live in the mix file.
    """

    root: str = "build"
    per_mix: bool = True
    work_dir: str | None = None
    s3_endpoint_url: str | None = None
    aws_access_key_id: str | None = None
    aws_secret_access_key: str | None = None
    aws_region: str | None = None

    def layout(self, mix: Mix) -> BuildLayout:
        if is_local(self.root):
            base = Path(self.root.removeprefix("file://")).expanduser().resolve()
            return BuildLayout(base / mix.name if self.per_mix else base)
        url = f"{self.root.rstrip('/')}/{mix.name}" if self.per_mix else self.root.rstrip("/")
        options = self.storage_options()
        Store.open(url, options)  # refuses an unknown protocol or an unreachable root, in one line
        return BuildLayout(work_folder(url, self.work_dir), target=url, storage_options=options)

    def storage_options(self) -> dict[str, Any]:
        """fsspec options for the sources' URIs (s3fs reads ``key``, ``secret``, ``endpoint_url``)."""
        opts: dict[str, Any] = {}
        if self.aws_access_key_id:
            opts["key"] = self.aws_access_key_id
        if self.aws_secret_access_key:
            opts["secret"] = self.aws_secret_access_key
        client: dict[str, Any] = {}
        if self.s3_endpoint_url:
            opts["endpoint_url"] = self.s3_endpoint_url
        if self.aws_region:
            client["region_name"] = self.aws_region
        if client:
            opts["client_kwargs"] = client
        return opts


def work_folder(url: str, work_dir: str | None = None) -> Path:
    """The local working folder of the build published at ``url``: one per URL under ``work_dir`` (default
    ``$WEIR_WORK_DIR``, else ``~/.cache/weir/work``)."""
    base = Path(work_dir or os.environ.get("WEIR_WORK_DIR") or "~/.cache/weir/work").expanduser()
    return base.resolve() / hashlib.sha256(url.encode()).hexdigest()[:16]
