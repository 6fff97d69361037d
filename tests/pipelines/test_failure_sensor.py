"""``pipelines/sensors.py``'s failure sensor: a failed run is reported as one log line naming the job, the
partition, the run and the failed step's own error, and POSTed as JSON to ``$WEIR_FAILURE_WEBHOOK`` (a real
HTTP server on 127.0.0.1 here); a hook that does not answer is logged and the sensor goes on."""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import dagster as dg
import pytest

from contract.errors import WeirError
from pipelines.definitions import defs
from pipelines.sensors import FAILURE_WEBHOOK_ENV, failure_sensor


@pytest.fixture
def hook() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A local HTTP server that keeps the JSON bodies POSTed to it; its URL and those bodies."""
    received: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers["Content-Length"])
            assert self.headers["Content-Type"] == "application/json"
            received.append(json.loads(self.rfile.read(length)))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *_args: object) -> None:  # not on the test's stderr
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hooks/builds", received
    finally:
        server.shutdown()
        server.server_close()


def _failed_run() -> tuple[dg.DagsterInstance, dg.DagsterRun, dg.DagsterEvent]:
    """A run of a partitioned job whose step fails with a stage's error, as a nightly build's would."""

    @dg.op
    def plan() -> None:
        raise WeirError("source 'qa' runs out in phase 'second'")

    @dg.job(name="build_tiny", partitions_def=dg.StaticPartitionsDefinition(["notes", "qa"]))
    def build_tiny() -> None:
        plan()

    instance = dg.DagsterInstance.ephemeral()
    result = build_tiny.execute_in_process(
        instance=instance, partition_key="qa", raise_on_error=False, tags={"weir/trigger": "nightly"}
    )
    assert not result.success
    run = instance.get_run_by_id(result.run_id)
    assert run is not None
    events = [e.dagster_event for e in instance.all_logs(result.run_id) if e.dagster_event is not None]
    (failure,) = [e for e in events if e.is_run_failure]
    return instance, run, failure


def test_a_failed_run_is_logged_and_posted_to_the_hook(
    hook: tuple[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    url, received = hook
    monkeypatch.setenv(FAILURE_WEBHOOK_ENV, url)
    instance, run, failure = _failed_run()
    sensor = failure_sensor()
    context = dg.build_run_status_sensor_context(
        sensor_name=sensor.name, dagster_instance=instance, dagster_run=run, dagster_event=failure
    ).for_run_failure()
    with caplog.at_level(logging.ERROR, logger="weir.failures"):
        sensor(context)  # type: ignore[call-arg]
    (body,) = received
    line = f"weir: run {run.run_id} of build_tiny [qa] failed: plan: WeirError: source 'qa' runs out in phase 'second'"
    assert body["text"] == line
    assert [r.getMessage() for r in caplog.records] == [line]
    assert (body["run_id"], body["job"], body["partition"]) == (run.run_id, "build_tiny", "qa")
    assert body["tags"]["weir/trigger"] == "nightly" and body["errors"] == [line.split(" failed: ", 1)[1]]

    # a hook that does not answer: logged, and the sensor does not fail
    gone = _nothing_listens()
    monkeypatch.setenv(FAILURE_WEBHOOK_ENV, gone)
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="weir.failures"):
        sensor(context)  # type: ignore[call-arg]
    assert len(received) == 1
    assert caplog.records[-1].getMessage().startswith(f"could not POST the failure of run {run.run_id}")
    assert gone not in caplog.text  # the URL may hold a token


def _nothing_listens() -> str:
    """A URL on 127.0.0.1 where nothing listens (a port bound, then released), with a token in it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/hooks/builds?token=secret"


def test_the_definitions_report_failed_runs_unless_turned_off() -> None:
    sensor = defs.get_repository_def().get_sensor_def("report_failed_runs")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
