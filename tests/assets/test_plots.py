"""``assets/plots.py``: each plot is one markdown image line holding a PNG data URI, the same bytes for the same
figures whatever the order of the frame's rows (no timestamp, no software stamp), and different figures make
different images. (That the assets' metadata carries them: ``test_plan_assets.py``.)"""

from __future__ import annotations

import base64
import re
import struct

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from assets.plots import length_histogram_md, mixture_area_md

PNG = b"\x89PNG\r\n\x1a\n"
LINE = re.compile(r"!\[([^\]]*)\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)")


def png(md: str, alt: str) -> bytes:
    """The PNG of a markdown image line, checked: one line, the alt text, a PNG whose chunks carry no stamp."""
    m = LINE.fullmatch(md)
    assert m is not None and m.group(1) == alt, md[:80]
    data = base64.b64decode(m.group(2), validate=True)
    assert data.startswith(PNG)
    at, kinds = len(PNG), []
    while at < len(data):  # walk the chunks: length, type, data, crc
        (n,) = struct.unpack(">I", data[at : at + 4])
        kinds.append(data[at + 4 : at + 8])
        at += 12 + n
    assert at == len(data) and kinds[0] == b"IHDR" and kinds[-1] == b"IEND"
    assert b"tIME" not in kinds and b"tEXt" not in kinds, kinds  # nothing that differs between runs
    return data


@st.composite
def histograms(draw: st.DrawFn) -> pl.DataFrame:
    """A ``length_histogram`` frame: per source, docs per log2 bucket, and the ``*`` rows over all of them."""
    rows = []
    for source in draw(st.lists(st.sampled_from(["code", "prose", "qa"]), min_size=1, max_size=3, unique=True)):
        buckets = draw(st.lists(st.integers(0, 16), min_size=1, max_size=6, unique=True))
        rows += [(source, 2**b, 2 ** (b + 1), draw(st.integers(1, 1000))) for b in buckets]
    rows += [("*", lo, hi, n) for _s, lo, hi, n in rows]
    rows = draw(st.permutations(rows))
    df = pl.DataFrame(rows, schema=["source", "lo", "hi", "docs"], orient="row")
    return df.with_columns(tokens=pl.col("docs") * pl.col("lo"))


@st.composite
def quotas(draw: st.DrawFn) -> pl.DataFrame:
    """A ``plan_quotas`` frame: every source's quota of every step, steps in named phases."""
    sources = draw(st.lists(st.sampled_from(["code", "prose", "qa"]), min_size=1, max_size=3, unique=True))
    phases = draw(st.lists(st.integers(1, 5), min_size=1, max_size=3))
    rows, step = [], 0
    for i, steps in enumerate(phases):
        for _ in range(steps):
            rows += [(step, f"p{i}", s, draw(st.integers(0, 4096))) for s in sources]
            step += 1
    return pl.DataFrame(draw(st.permutations(rows)), schema=["step", "phase", "source", "quota"], orient="row")


@settings(max_examples=3)
@given(hist=histograms(), seq_len=st.sampled_from([None, 64, 4096]))
def test_the_length_histogram_is_one_stable_png_line(hist: pl.DataFrame, seq_len: int | None) -> None:
    alt = "length histogram per source"
    image = png(length_histogram_md(hist, seq_len), alt)
    assert png(length_histogram_md(hist.reverse(), seq_len), alt) == image, "row order does not matter"


@settings(max_examples=3)
@given(q=quotas())
def test_the_mixture_chart_is_one_stable_png_line(q: pl.DataFrame) -> None:
    alt = "planned mixture over steps"
    image = png(mixture_area_md(q), alt)
    assert png(mixture_area_md(q.reverse()), alt) == image, "row order does not matter"


def test_different_figures_make_different_images() -> None:
    hist = pl.DataFrame(
        {
            "source": ["a", "a", "*", "*"],
            "lo": [1, 4, 1, 4],
            "hi": [2, 8, 2, 8],
            "docs": [3, 1, 3, 1],
            "tokens": [3, 4] * 2,
        }
    )
    moved = hist.with_columns(docs=pl.Series([1, 3, 1, 3]))
    assert png(length_histogram_md(hist), "length histogram per source") != png(
        length_histogram_md(moved), "length histogram per source"
    )
    assert length_histogram_md(hist, 4) != length_histogram_md(hist), "the S line is drawn"
    q = pl.DataFrame({"step": [0, 0, 1, 1], "phase": ["p"] * 4, "source": ["a", "b"] * 2, "quota": [10, 0, 10, 0]})
    flipped = q.with_columns(quota=pl.Series([0, 10, 0, 10]))
    assert mixture_area_md(q) != mixture_area_md(flipped)
