"""``assets/storage.py``: where a mix's build lives. A local root is an absolute folder (``file://``, ``~`` and
relative roots resolved), ``root/<mix>`` or ``root`` itself; an object-store root publishes to its URL and works
in one local folder per URL under the work dir; the fsspec options carry exactly the settings that are set.
(An unreachable or unknown root refused: ``test_dagster_engine.py``.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from assets import WeirStorage
from assets.storage import work_folder
from mixing import load_mix

SETTINGS = {
    "s3_endpoint_url": ("endpoint_url", "http://127.0.0.1:9000"),
    "aws_access_key_id": ("key", "AKIA-test"),
    "aws_secret_access_key": ("secret", "not-a-secret"),
}


def test_a_local_root_is_one_absolute_folder_per_mix_or_the_root_itself(
    tiny_mix_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mix = load_mix(tiny_mix_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for root in ("builds", "./builds", str(tmp_path / "builds"), f"file://{tmp_path}/builds"):
        assert WeirStorage(root=root).layout(mix).root == tmp_path / "builds" / "tiny", root
        assert WeirStorage(root=root, per_mix=False).layout(mix).root == tmp_path / "builds", root
    assert WeirStorage(root="~/b").layout(mix).root == tmp_path / "home" / "b" / "tiny"
    layout = WeirStorage(root="builds").layout(mix)
    assert (layout.url, layout.target) == (str(tmp_path / "builds" / "tiny"), None), "published where it is built"


def test_an_object_store_root_publishes_to_its_url_and_works_in_a_folder_of_its_own(
    tiny_mix_path: Path, tmp_path: Path
) -> None:
    mix = load_mix(tiny_mix_path)
    work = str(tmp_path / "work")
    per_mix = WeirStorage(root="memory://weir-test/builds/", work_dir=work).layout(mix)
    whole = WeirStorage(root="memory://weir-test/builds", per_mix=False, work_dir=work).layout(mix)
    assert per_mix.url == "memory://weir-test/builds/tiny" and whole.url == "memory://weir-test/builds"
    assert per_mix.root == work_folder(per_mix.url, work) and whole.root == work_folder(whole.url, work)
    assert per_mix.root != whole.root


@settings(max_examples=100)
@given(chosen=st.sets(st.sampled_from([*SETTINGS, "aws_region"])))
def test_the_fsspec_options_carry_exactly_the_settings_that_are_set(chosen: set[str]) -> None:
    fields = {f: SETTINGS[f][1] if f in SETTINGS else "eu-west-1" for f in chosen}
    opts = WeirStorage(**fields).storage_options()  # type: ignore[arg-type]
    want: dict[str, object] = {SETTINGS[f][0]: v for f, v in fields.items() if f in SETTINGS}
    if "aws_region" in chosen:
        want["client_kwargs"] = {"region_name": "eu-west-1"}
    assert opts == want


URLS = st.from_regex(r"(s3|gs|memory)://[a-z0-9-]{1,12}(/[a-z0-9._-]{1,8}){0,3}", fullmatch=True)


@settings(max_examples=40)
@given(urls=st.sets(URLS, min_size=1, max_size=8))
def test_every_url_has_its_own_stable_work_folder_under_the_work_dir(urls: set[str]) -> None:
    base = Path("/tmp/weir-work-test")
    folders = {u: work_folder(u, str(base)) for u in urls}
    assert len(set(folders.values())) == len(urls), "two builds never share a working folder"
    for u, f in folders.items():
        assert f.parent == base.resolve() and f == work_folder(u, str(base))


def test_the_work_dir_defaults_to_the_environment_then_the_user_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = "s3://bucket/builds/tiny"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("WEIR_WORK_DIR", raising=False)
    assert work_folder(url).parent == tmp_path / "home" / ".cache" / "weir" / "work"
    monkeypatch.setenv("WEIR_WORK_DIR", str(tmp_path / "env"))
    assert work_folder(url).parent == tmp_path / "env"
    assert work_folder(url, str(tmp_path / "given")).parent == tmp_path / "given", "an explicit work dir wins"
    assert work_folder(url).name == work_folder(url, str(tmp_path / "given")).name
