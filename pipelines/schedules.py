"""The nightly rebuild: re-index every source of a mix; automation rebuilds what follows."""

from __future__ import annotations

import dagster as dg

from mixing import Mix

__all__ = ["NIGHTLY_CRON", "nightly_schedule"]

NIGHTLY_CRON = "0 3 * * *"  # 03:00 in the schedule's timezone (UTC unless configured)


def nightly_schedule(mix: Mix, job: dg.JobDefinition, cron: str = NIGHTLY_CRON) -> dg.ScheduleDefinition:
    """A schedule (stopped until someone turns it on) asking one run of ``job`` per source of ``mix``.

    Each run request carries the source as its partition key; the tick time is in the run key, so a tick
    evaluated twice never launches twice.
    """

    @dg.schedule(
        name=f"nightly_{mix.name}",
        cron_schedule=cron,
        job=job,
        default_status=dg.DefaultScheduleStatus.STOPPED,
        description=f"Rebuild mix {mix.name!r} every night: re-index each source, then every later stage.",
    )
    def nightly(context: dg.ScheduleEvaluationContext) -> list[dg.RunRequest]:
        tick = context.scheduled_execution_time.isoformat() if context.scheduled_execution_time else "now"
        return [
            dg.RunRequest(run_key=f"{tick}:{source}", partition_key=source, tags={"weir/trigger": "nightly"})
            for source in sorted(mix.sources)
        ]

    return nightly
