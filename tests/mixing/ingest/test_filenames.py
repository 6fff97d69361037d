"""mixing.ingest.filenames: a name that is not UTF-8 is shown escaped, stored as UTF-8, and opened again by
its bytes; a UTF-8 name is itself; the escaping is reversible."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from mixing.ingest.filenames import real_path, shown_path


@given(st.binary(min_size=1, max_size=30).filter(lambda b: b"/" not in b and b"\0" not in b))
def test_any_name_is_shown_as_utf8_and_maps_back_to_its_bytes(raw: bytes) -> None:
    name = "/d/" + os.fsdecode(raw)
    shown = shown_path(name)
    shown.encode("utf-8")  # storable anywhere: never raises
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        assert os.fsencode(real_path(shown)) == b"/d/" + raw
    else:
        assert shown == name


def test_a_utf8_name_and_a_url_are_themselves(tmp_path: Path) -> None:
    assert shown_path(str(tmp_path / "plain é.txt")) == str(tmp_path / "plain é.txt")
    assert real_path("s3://b/caf\\xe9.txt") == "s3://b/caf\\xe9.txt"
