"""The build-storage resource: where each mix's build folder lives, and how sources' storage is reached."""

from pathlib import Path
from typing import Any

import dagster as dg

from mixing import BuildLayout, Mix

__all__ = ["WeirStorage"]


class WeirStorage(dg.ConfigurableResource):  # type: ignore[type-arg]
    """Builds go to ``root/<mix name>``, or straight into ``root`` when ``per_mix`` is false.

    Sources on ``s3://`` are read with s3fs using ``s3_endpoint_url``, ``aws_access_key_id``,
    ``aws_secret_access_key`` and ``aws_region`` when set (wire them to ``dg.EnvVar("AWS_ENDPOINT_URL")``
    and friends); when unset, s3fs/botocore read the same ``AWS_*`` environment variables themselves.
    Credentials and endpoints never live in the mix file.
    """

    root: str = "build"
    per_mix: bool = True
    s3_endpoint_url: str | None = None
    aws_access_key_id: str | None = None
    aws_secret_access_key: str | None = None
    aws_region: str | None = None

    def layout(self, mix: Mix) -> BuildLayout:
        base = Path(self.root).expanduser().resolve()
        return BuildLayout(base / mix.name if self.per_mix else base)

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
