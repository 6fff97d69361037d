"""Sensors: per mix, one that starts a build when a source's files change (new, modified or removed files);
for the code location, one that reports every failed run.

Files are listed with :func:`mixing.ingest.sources.index_source` (fsspec: local paths, ``s3://`` …), the same
listing and fingerprints (size + mtime or ETag) the ``source_index`` asset records. The cursor holds one
digest per source, so a change triggers exactly once: the tick that sees it stores the new digest.

A failed run (a nightly build, a build launched in the UI, an automation run) is reported by
:func:`failure_sensor`: one log line, and a JSON POST to ``$WEIR_FAILURE_WEBHOOK`` when it is set (a Slack
incoming webhook takes the ``text`` field as it is; a mail or chat relay reads the other fields).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import urllib.request
from collections.abc import Mapping
from typing import Any

import dagster as dg
import fsspec

from contract.errors import first_line
from mixing import Mix
from mixing.ingest.sources import SourceIndexError, index_source

__all__ = ["FAILURE_WEBHOOK_ENV", "failure_report", "failure_sensor", "post_json", "source_digests", "source_sensor"]

FAILURE_WEBHOOK_ENV = "WEIR_FAILURE_WEBHOOK"
"""The variable holding the URL each failed run is POSTed to (read when the sensor runs, in the code server)."""
_LOG = logging.getLogger("weir.failures")


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


def source_sensor(mix: Mix, job: dg.JobDefinition, interval_s: int = 60) -> dg.SensorDefinition:
    """A sensor (stopped until turned on) requesting one run of ``job`` per changed source of ``mix``.

    The first tick records the sources as they are and requests nothing (turning the sensor on does not
    rebuild); later ticks request a run, partition = source, for each source whose digest changed.
    """

    # the job by name: given the job itself, Dagster 1.13 rebuilds the sensor when it binds the job's resources,
    # passing on its (empty) owners, and warns on every load of the code location that that parameter is in beta
    @dg.sensor(
        name=f"sources_{mix.name}",
        job_name=job.name,
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


def failure_report(run: dg.DagsterRun, errors: list[str]) -> dict[str, Any]:
    """What is said of the failed ``run``: ``text`` (one line: job, partition, run id, the first step error),
    ``run_id``, ``job``, ``partition``, ``tags`` (the run's ``weir/`` and ``dagster/`` tags: trigger, output,
    partition, schedule or sensor) and ``errors`` (each failed step's error, first line)."""
    tags = {k: v for k, v in run.tags.items() if k.startswith(("weir/", "dagster/"))}
    partition = run.tags.get("dagster/partition")
    what = run.job_name + (f" [{partition}]" if partition else "")
    text = f"weir: run {run.run_id} of {what} failed" + (f": {errors[0]}" if errors else "")
    return {"text": text, "run_id": run.run_id, "job": run.job_name, "partition": partition, "tags": tags,
            "errors": errors}  # fmt: skip


def post_json(url: str, body: Mapping[str, Any], timeout_s: float = 10.0) -> int:
    """POST ``body`` as JSON to ``url``; the HTTP status (raises ``OSError`` when it cannot be delivered)."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return int(response.status)


def failure_sensor(interval_s: int = 30) -> dg.SensorDefinition:
    """The sensor (running unless turned off) that reports each failed run of the code location: a log line
    (the tick's log in the UI, and the logger ``weir.failures``) and, when ``$WEIR_FAILURE_WEBHOOK`` is set, a
    POST of :func:`failure_report` there. A hook that cannot be reached is logged, never retried: a failing
    hook must not keep the next failures from being reported."""

    @dg.run_failure_sensor(
        name="report_failed_runs",
        minimum_interval_seconds=interval_s,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Reports every failed run: a log line, and a JSON POST to ${FAILURE_WEBHOOK_ENV} when set.",
    )
    def report_failed_runs(context: dg.RunFailureSensorContext) -> None:
        errors = []
        for event in context.get_step_failure_events():
            error = event.step_failure_data.error
            if error is not None:
                shown = error.cause if error.cause is not None else error  # the stage's own error, not Dagster's
                said = shown.message.split(": ", 1)[-1]  # the message leads with the error's module and class
                errors.append(f"{event.step_key}: {shown.cls_name}: {first_line(Exception(said))}")
        body = failure_report(context.dagster_run, errors)
        context.log.error(body["text"])
        _LOG.error(body["text"])
        url = os.environ.get(FAILURE_WEBHOOK_ENV, "").strip()
        if not url:
            return
        try:
            post_json(url, body)
        except OSError as e:  # urllib's errors are OSErrors; the URL itself is not logged (it may hold a token)
            context.log.error(f"could not POST the failure of run {body['run_id']} to ${FAILURE_WEBHOOK_ENV}: {e}")
            _LOG.error(f"could not POST the failure of run {body['run_id']} to ${FAILURE_WEBHOOK_ENV}: {e}")

    return report_failed_runs
