"""``pipelines/resources.py``: the resources from the environment. S3 settings are bound only where their variable
is set, as an ``EnvVar`` (the UI shows the variable, never the secret) or, unbound, as the values; the engine's
kind and address come from ``WEIR_ENGINE`` / ``WEIR_RAY_ADDRESS`` unless given; remote fsspec options reach only
mixes that read a remote store. (The engine resource shown in the definitions: ``test_dagster_engine.py``.)"""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from assets import WeirStorage
from contract.errors import WeirError
from mixing import load_mix
from pipelines.resources import S3_ENV, engine_resource, mix_storage_options, storage_resource


def test_every_bound_variable_names_a_field_of_the_storage_resource() -> None:
    assert set(S3_ENV) <= set(WeirStorage.model_fields)
    assert len(set(S3_ENV.values())) == len(S3_ENV)


@settings(max_examples=50)
@given(env=st.dictionaries(st.sampled_from(sorted(S3_ENV.values())), st.sampled_from(["", "v1", "secret-2"])))
def test_s3_settings_are_bound_only_where_their_variable_is_set(env: dict[str, str]) -> None:
    bound, values = storage_resource("/b", env), storage_resource("/b", env, bound=False)
    for field, var in S3_ENV.items():
        if env.get(var):
            got = getattr(bound, field)
            assert isinstance(got, dg.EnvVar) and got.env_var_name == var, (field, got)
            assert getattr(values, field) == env[var]
        else:  # unset or empty: not bound at all (an unset EnvVar fails a run)
            assert getattr(bound, field) is None and getattr(values, field) is None
    assert (bound.root, bound.per_mix) == ("/b", True)
    assert storage_resource(Path("/b"), env, per_mix=False).per_mix is False


def test_a_bound_setting_is_read_in_a_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-north-1")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)

    @dg.asset
    def options(storage: WeirStorage) -> dg.MaterializeResult:
        return dg.MaterializeResult(metadata={"options": dg.MetadataValue.json(storage.storage_options())})

    resources = {"storage": storage_resource("/b", {"AWS_DEFAULT_REGION": "x"})}
    r = dg.materialize([options], resources=resources, instance=dg.DagsterInstance.ephemeral())
    meta = r.asset_materializations_for_node("options")[0].metadata
    assert meta["options"].value == {"client_kwargs": {"region_name": "eu-north-1"}}


def test_the_engine_comes_from_the_environment_unless_given() -> None:
    ray_env = {"WEIR_ENGINE": "ray", "WEIR_RAY_ADDRESS": "head:6379"}
    assert engine_resource({"WEIR_ENGINE": "  "}).kind == "local"
    assert engine_resource(ray_env, kind="local").kind == "local", "--engine wins over WEIR_ENGINE"
    given_address = engine_resource(ray_env, address="other:6379")
    assert (given_address.kind, given_address.ray_address) == ("ray", "other:6379")
    assert engine_resource({"WEIR_ENGINE": "ray"}).ray_address is None  # a Ray instance on the step's machine
    assert engine_resource({"WEIR_RAY_ADDRESS": "head:6379"}).ray_address is None, "no address for the local one"
    with pytest.raises(WeirError) as e:
        engine_resource({}, kind="dask")
    assert str(e.value) == "engine 'dask' (WEIR_ENGINE or --engine): expected local or ray"


def test_remote_options_reach_only_mixes_that_read_a_remote_store(tiny_mix_path: Path) -> None:
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
    assert mix_storage_options(load_mix(tiny_mix_path), env) is None
    text = tiny_mix_path.read_text()
    tiny_mix_path.write_text(text.replace(f'"{tiny_mix_path.parent}/data/qa.jsonl"', '"s3://corpus/qa.jsonl"'))
    assert mix_storage_options(load_mix(tiny_mix_path), env) == {
        "endpoint_url": "http://127.0.0.1:9",
        "key": "k",
        "secret": "s",
    }
    assert mix_storage_options(load_mix(tiny_mix_path), {}) == {}, "nothing set: s3fs reads its own defaults"
