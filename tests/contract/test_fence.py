"""``contract.fence``: a registered fence covers its root and every key under it (on its protocol only, never a
sibling whose name merely starts alike), for the ``with`` block only; a second fence on one root is refused,
naming the root without its credentials; the same fence nested keeps the root fenced until the outermost
block ends. (Every write and removal of a Store admitted by it, and a refused one
leaving nothing: tests/pipelines/test_lease_fence.py, with the lease as the fence.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from contract.fence import covering, fenced
from contract.store import Store


class _Fence:
    generation = 3

    def admit(self, name: str) -> None:
        pass


def test_a_fence_covers_its_root_and_what_is_under_it_for_the_with_block(tmp_path: Path) -> None:
    root = Store(f"memory://fence-{tmp_path.name}/build")
    fence = _Fence()
    assert covering("memory", root.root) is None
    with fenced(root, fence):
        assert covering("memory", root.root) == (fence, "")
        assert covering("memory", f"{root.root}/shards/a.bin") == (fence, "shards/a.bin")
        assert covering("memory", f"{root.root}-other/a.bin") is None, "a sibling whose name starts alike"
        assert covering("s3", f"{root.root}/a.bin") is None, "another protocol"
        assert root.sub("shards").fence() is fence
    assert covering("memory", f"{root.root}/shards/a.bin") is None
    assert root.fence() is None


def test_a_fence_is_removed_when_its_block_raises(tmp_path: Path) -> None:
    root = Store(f"memory://fence-{tmp_path.name}")
    with pytest.raises(KeyError), fenced(root, _Fence()):
        raise KeyError("the step failed")
    assert root.fence() is None


def test_a_second_fence_on_a_root_is_refused_naming_the_root_without_credentials(tmp_path: Path) -> None:
    root = Store(f"memory://KEY:SECRET@fence-{tmp_path.name}")
    fence = _Fence()
    with fenced(root, fence):
        with pytest.raises(RuntimeError) as err, fenced(root, _Fence()):
            pass
        assert str(err.value) == f"memory://***@fence-{tmp_path.name} is fenced already"
        assert root.fence() is fence, "the refused one did not replace it"
    assert root.fence() is None


def test_the_same_fence_nested_keeps_the_root_fenced_until_the_outer_block_ends(tmp_path: Path) -> None:
    root = Store(f"memory://fence-{tmp_path.name}")
    fence = _Fence()
    with fenced(root, fence):
        with fenced(root.sub("shards"), fence):
            assert root.fence() is fence
        with fenced(root, fence):
            pass
        assert root.fence() is fence, "the inner block ended; the outer one still fences the root"
    assert root.fence() is None


def test_a_local_folder_is_never_fenced(tmp_path: Path) -> None:
    local = Store(tmp_path)
    with fenced(local, _Fence()):
        assert local.fence() is None
