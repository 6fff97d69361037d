"""A real browser over the real Dagster UI: the demo mix, built into the UI's instance, shows as materialized
with its checks passed, as one run of ``build_demo``; its plan's mixture-over-steps plot renders from the
materialization's metadata, and the shards' numeric figures are plotted (*Metadata*, *Plots*).

Starts ``dagster dev`` (its own process group, a temporary DAGSTER_HOME with telemetry off, a free port on
127.0.0.1) on a copy of the demo mix reading a temporary copy of the demo data, builds the mix into the same
instance, and drives headless Debian Chromium with Playwright (never a downloaded browser). Screenshots go to
``test-artifacts/``; with ``WEIR_UPDATE_DOCS=1`` they also replace the images under ``docs/`` (docs/operations.md).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from mixing import load_mix, stages
from mixing.ingest.synthetic import write_demo_data
from pipelines.build import build_mix

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Before any fixture starts a server: without playwright there is nothing to drive the browser with.
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
STAGES = [s.name for s in stages.STAGES]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed (apt-get install chromium)"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"dagster dev exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.25)
    pytest.fail(f"the Dagster UI did not answer at {url} within {timeout_s:.0f} s:\n{log.read_text()[-3000:]}")


@pytest.fixture
def demo_in_ui(tmp_path: Path) -> Iterator[str]:
    """The UI's base URL, once the demo mix is built into the UI's instance."""
    data = tmp_path / "demo-data"
    mixes = tmp_path / "mixes"
    mixes.mkdir()
    text = (ROOT / "mixes" / "demo.yaml").read_text().replace("{mix_dir}/../build/demo-data", str(data))
    (mixes / "demo.yaml").write_text(text)
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    port = _free_port()
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "WEIR_MIXES": str(mixes),
        "WEIR_BUILD_ROOT": str(tmp_path / "build"),
        # Automation sensors off: this UI shows a build made here, it must not start runs of its own.
        "WEIR_AUTOMATION": "off",
    }
    # Create the instance's storage before the UI opens it: two processes migrating fresh SQLite files at
    # once leave them broken ("more than one head").
    instance = dg.DagsterInstance.from_config(str(home))
    instance.get_runs(limit=1)
    instance.get_latest_materialization_event(dg.AssetKey(["demo", "plan"]))
    instance.all_instigator_state()
    log = tmp_path / "dagster-dev.log"
    cmd = [sys.executable, "-m", "dagster", "dev", "-m", "pipelines.definitions", "-h", "127.0.0.1", "-p", str(port)]
    with log.open("wb") as out:
        # Its own session (process group): SIGTERM to the group stops the webserver, daemon and code server.
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # Make the data and build while the UI starts (loading definitions needs only the mix file); the
        # instance is the UI's, so the materializations show there.
        write_demo_data(data)
        build_mix(load_mix(mixes / "demo.yaml"), tmp_path / "build" / "demo", say=lambda _s: None, instance=instance)
        _wait_http(f"http://127.0.0.1:{port}/server_info", proc, log)
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _open(page, url: str, first: bool = False) -> None:  # type: ignore[no-untyped-def]
    page.goto(url)
    if not first:
        return
    skip = page.get_by_role("button", name="Skip")  # the first visit's newsletter dialog
    try:
        skip.wait_for(timeout=5000)
        skip.click()
    except Exception:  # no dialog this time: nothing to dismiss
        pass


def _wait_text(page, *needles: str, timeout_s: float = 90) -> str:  # type: ignore[no-untyped-def]
    """The page's text once it holds every needle (the UI fills nodes in as its queries return).

    Polls in the browser every 250 ms rather than sleeping a fixed time: fast when the machine is idle,
    patient (up to ``timeout_s``) when it is loaded.
    """
    try:
        page.wait_for_function(
            "needles => needles.every(n => document.body.innerText.includes(n))",
            arg=list(needles),
            polling=250,
            timeout=timeout_s * 1000,
        )
    except sync_api.TimeoutError:
        text = page.inner_text("body")
        page.screenshot(path=str(ARTIFACTS / "ui-failure.png"))
        missing = [n for n in needles if n not in text]
        pytest.fail(f"the page never showed {missing} within {timeout_s:.0f} s; it shows:\n{text[:3000]}")
    return str(page.inner_text("body"))


def _assert_all_checks_succeeded(text: str) -> None:
    """A checks tab lists ``Checks (n)`` and n results; every one reads Succeeded (none failed or warned)."""
    listed = re.search(r"Checks \((\d+)\)", text)
    assert listed, text
    assert text.count("Succeeded") == int(listed[1]), text
    assert "Failed" not in text and "Warning" not in text, text


def test_demo_mix_is_materialized_with_checks_passed_and_plots_in_the_ui(demo_in_ui: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    shots = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1800, "height": 640})
        page.set_default_timeout(60_000)  # clicks and waits on a loaded machine

        _open(page, f"{demo_in_ui}/locations/pipelines.definitions/asset-groups/demo", first=True)
        text = _wait_text(page, *STAGES, "1 / 1 Passed", "3 / 3 Passed")
        # Unpartitioned stages read "Materialized"; per-source ones have every partition filled.
        assert text.count("Materialized") >= 4, text
        assert text.count("100% filled") == 2, text
        assert "Failed" not in text and "Missing" not in text, text
        shots.append(ARTIFACTS / "ui-asset-graph.png")
        page.screenshot(path=str(shots[-1]))

        _open(page, f"{demo_in_ui}/assets/demo/packed_shards?view=checks")
        text = _wait_text(page, "manifest_checksums", "packing_efficiency", "truncated_docs", "Succeeded")
        _assert_all_checks_succeeded(text)
        shots.append(ARTIFACTS / "ui-packed-shards-checks.png")
        page.screenshot(path=str(shots[-1]))

        # The plan's checks: mixture_error is WARN severity, the demo meets its goals, so all three pass.
        _open(page, f"{demo_in_ui}/assets/demo/plan?view=checks")
        text = _wait_text(page, "mixture_error", "planned_documents_exist", "token_budget_per_phase", "Succeeded")
        _assert_all_checks_succeeded(text)
        page.screenshot(path=str(ARTIFACTS / "ui-plan-checks.png"))

        # The plan's latest materialization: fingerprints inline, the mixture plot behind its markdown button.
        page.set_viewport_size({"width": 1400, "height": 1000})
        _open(page, f"{demo_in_ui}/assets/demo/plan")
        _wait_text(page, "mixture_error_window", "mix_fingerprint", "tokenizer_fingerprint", "[Show Markdown]")
        page.locator("table", has_text="mix_fingerprint").first.screenshot(path=str(ARTIFACTS / "ui-plan-metadata.png"))
        page.get_by_text("[Show Markdown]").first.click()
        dialog = page.get_by_role("dialog")
        plot = dialog.locator('img[src^="data:image/png"][alt="planned mixture over steps"]')
        plot.wait_for()
        # Rendered, not just present: the browser decoded the PNG (a broken data URI has natural width 0).
        page.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=plot.element_handle())
        assert plot.evaluate("img => img.naturalWidth") > 300
        shots.append(ARTIFACTS / "ui-plan-plot.png")
        dialog.screenshot(path=str(shots[-1]))
        page.keyboard.press("Escape")

        # One run per build: the build above is one run of the job build_demo, every stage in it.
        _open(page, f"{demo_in_ui}/runs")
        text = _wait_text(page, "build_demo", "Success")
        assert len(re.findall(r"\bbuild_demo\b", text)) == 1, text
        assert "__ephemeral_asset_job__" not in text, text
        shots.append(ARTIFACTS / "ui-runs.png")
        page.screenshot(path=str(shots[-1]))

        # The build's figures are numbers, so the shards' events can be plotted across builds.
        _open(page, f"{demo_in_ui}/assets/demo/packed_shards")
        text = _wait_text(page, "packing_efficiency", "Plots")
        assert "Unsynced" not in text, text  # the build's run recorded what each stage read
        page.get_by_text("Plots", exact=True).first.click()
        text = _wait_text(page, "packing_efficiency", "mixture_error_window", "sequence_cost_p95_over_mean")
        shots.append(ARTIFACTS / "ui-packed-shards-plots.png")
        page.screenshot(path=str(shots[-1]))

        # One source's documents: its quarantine count beside the path of the quarantined records.
        _open(page, f"{demo_in_ui}/assets/demo/documents?view=partitions&partition=qa")
        text = _wait_text(page, "docs_quarantined", "quarantine_reasons", "qa/quarantine.jsonl", "tokenizer_finger")
        shown = re.search(r"docs_quarantined\s+(\d+)", text)
        link = re.search(r"(\S+/sources/qa/quarantine\.jsonl)", text)
        assert shown and link, text
        # The count the page shows is the number of records in the file it links.
        assert int(shown[1]) == len(Path(link[1]).read_text().splitlines()) > 0, text
        shots.append(ARTIFACTS / "ui-documents-quarantine.png")
        page.screenshot(path=str(shots[-1]))
        browser.close()
    if os.environ.get("WEIR_UPDATE_DOCS"):
        for shot in shots:
            shutil.copy(shot, ROOT / "docs" / shot.name)
