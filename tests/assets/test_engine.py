"""``assets/engine.py``: the ``engine`` resource names the engine that runs a build's fan-out work; ``local``
is the in-process engine, ``ray`` a Ray engine at the configured address with the configured retries (an
``EnvVar`` address read from the environment in a run and outside one), and no other kind is accepted."""

from __future__ import annotations

import dagster as dg
import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from assets import WeirEngine
from mixing.engine import LOCAL, LocalEngine, RayEngine

ADDRESSES = st.one_of(
    st.none(),
    st.from_regex(r"[a-z][a-z0-9.-]{0,20}:[0-9]{2,5}", fullmatch=True),
    st.from_regex(r"ray://[a-z][a-z0-9.-]{0,20}:[0-9]{2,5}", fullmatch=True),
)


def test_the_default_is_the_local_engine_whatever_the_ray_settings() -> None:
    assert WeirEngine().engine() is LOCAL
    assert isinstance(WeirEngine(ray_address="head:6379", max_retries=9).engine(), LocalEngine)


@settings(max_examples=30)
@given(address=ADDRESSES, retries=st.integers(min_value=0, max_value=20))
def test_ray_carries_the_address_and_retries_without_connecting(address: str | None, retries: int) -> None:
    engine = WeirEngine(kind="ray", ray_address=address, max_retries=retries).engine()
    assert isinstance(engine, RayEngine)
    assert (engine.address, engine.max_retries, engine.name) == (address, retries, "ray")


def test_an_env_var_address_is_read_from_the_environment_in_a_run_and_outside_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WEIR_TEST_RAY_ADDRESS", "head:6379")
    resource = WeirEngine(kind="ray", ray_address=dg.EnvVar("WEIR_TEST_RAY_ADDRESS"))
    made = resource.engine()
    assert isinstance(made, RayEngine) and made.address == "head:6379"

    @dg.asset
    def where(engine: WeirEngine) -> dg.MaterializeResult:
        e = engine.engine()
        return dg.MaterializeResult(metadata={"name": e.name, "address": str(getattr(e, "address", None))})

    result = dg.materialize([where], resources={"engine": resource}, instance=dg.DagsterInstance.ephemeral())
    meta = result.asset_materializations_for_node("where")[0].metadata
    assert (meta["name"].value, meta["address"].value) == ("ray", "head:6379")


def test_an_unknown_kind_is_refused() -> None:
    with pytest.raises(pydantic.ValidationError, match="'local' or 'ray'"):
        WeirEngine(kind="spark")  # type: ignore[arg-type]
