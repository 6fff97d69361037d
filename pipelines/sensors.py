"""A sensor per mix that starts a build when a source's files change (new, modified or removed files).

Files are listed with :func:`mixing.ingest.sources.index_source` (fsspec: local paths, ``s3://`` …), the same
listing and fingerprints (size + mtime or ETag) the ``source_index`` asset records. The cursor holds one
digest per source, so a change triggers exactly once: the tick that sees it stores the new digest.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING

import dagster as dg
import fsspec

from mixing import Mix
from mixing.ingest.sources import SourceIndexError, index_source

if TYPE_CHECKING:  # the class of define_asset_job's result is not exported by dagster
    from dagster._core.definitions.unresolved_asset_job_definition import (
        UnresolvedAssetJobDefinition as AssetJob,
    )

__all__ = ["source_digests", "source_sensor"]


def source_digests(mix: Mix) -> dict[str, str]:
    """Per source, a hex digest of its sorted (path, fingerprint) list; ``"none"`` when nothing matches."""
    out = {}
    for name in sorted(mix.sources):
        # fsspec reuses one filesystem object per protocol and options, and s3fs caches listings in it:
        # without this a long-lived code server would never see a new object.
        fsspec.core.url_to_fs(mix.source_uri(name))[0].invalidate_cache()
        try:
            df = index_source(mix, name)
        except SourceIndexError:
            out[name] = "none"  # an empty source is a state too: files appearing later are a change
            continue
        h = hashlib.sha256()
        for path, fp in zip(df["path"], df["fingerprint"], strict=True):
            h.update(f"{path}\0{fp}\n".encode())
        out[name] = h.hexdigest()[:24]
    return out


def source_sensor(mix: Mix, job: AssetJob, interval_s: int = 60) -> dg.SensorDefinition:
    """A sensor (stopped until turned on) requesting one run of ``job`` per changed source of ``mix``.

    The first tick records the sources as they are and requests nothing (turning the sensor on does not
    rebuild); later ticks request a run, partition = source, for each source whose digest changed.
    """

    @dg.sensor(
        name=f"sources_{mix.name}",
        job=job,
        minimum_interval_seconds=interval_s,
        default_status=dg.DefaultSensorStatus.STOPPED,
        description=f"Rebuild mix {mix.name!r} when files under a source's URI are added, changed or removed.",
    )
    def sources_changed(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
        now = source_digests(mix)
        cursor = json.dumps(now, sort_keys=True)
        if context.cursor is None:
            context.update_cursor(cursor)
            return dg.SkipReason(f"recorded the files of {len(now)} sources as the baseline")
        seen: dict[str, str] = json.loads(context.cursor)
        changed = [s for s in sorted(now) if seen.get(s) != now[s]]
        if not changed:
            return dg.SkipReason("no source changed")
        return dg.SensorResult(
            run_requests=[
                dg.RunRequest(
                    run_key=f"{s}:{now[s]}",
                    partition_key=s,
                    tags={"weir/trigger": "source-change", "weir/source": s},
                )
                for s in changed
            ],
            cursor=cursor,
        )

    return sources_changed
