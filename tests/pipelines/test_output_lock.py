"""``pipelines/output_lock.py``: one build per output. The lock names its holder, or is waited for, and is gone
afterwards, leaving nothing beside the output. (Two real builds into one output: ``test_transaction.py``; the UI's
runs that write the output: ``test_build_run.py`` and ``test_ui_automation.py``.)"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from pipelines.output_lock import output_lock
from pipelines.transaction import BuildBusy


def test_the_lock_names_its_holder_or_is_waited_for_and_is_gone_afterwards(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    lock = tmp_path / ".out.lock"
    said: list[str] = []
    with output_lock(dest, False, said.append):
        assert lock.read_text() == f"{os.getpid()}\n"
        with pytest.raises(BuildBusy) as busy, output_lock(dest, False, said.append):
            pass
        assert str(busy.value) == (
            f"{dest}: another weir build (pid {os.getpid()}) is building into this folder; "
            f"wait for it, or pass --wait to start when it is done (lock {lock})"
        )

        waiting, entered = threading.Event(), threading.Event()

        def say_and_wait(line: str) -> None:
            said.append(line)
            waiting.set()

        def second() -> None:  # its own open file: the flock excludes it as it would another process
            with output_lock(dest, True, say_and_wait):
                entered.set()

        waiter = threading.Thread(target=second)
        waiter.start()
        assert waiting.wait(60), "the second build says it waits"
        assert not entered.is_set()
    waiter.join(60)
    assert entered.is_set(), "it enters once the first is done"
    assert said == [f"waiting for the build of pid {os.getpid()} into {dest} to finish"]
    assert not lock.exists() and list(tmp_path.iterdir()) == [], "nothing is left beside the output"
