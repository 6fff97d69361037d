"""``mixing/feedback.py``: a continuation's weights from the switch on, from a per-source loss log under a named
policy: read in either format with a bad row named by file and line, the same log giving the same mix, the
phases before the switch untouched, the policy's bounds held. (A build with feedback: test_continuation.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mixing import load_mix
from mixing.feedback import FeedbackError, apply_feedback, read_losses, unlogged

MIX = """\
name: fb
tokenizer: {kind: bytes}
sequence: {length: 64, global_batch: 4}
sources:
  a: {uri: "x/*.txt", format: text}
  b: {uri: "y/*.txt", format: text}
  c: {uri: "z/*.txt", format: text}
curriculum:
  - {phase: first, steps: 10, mixture: {a: 0.5, b: 0.25, c: 0.25}}
  - {phase: later, steps: 10, mixture: {a: 0.5, b: 0.25, c: 0.25}}
"""


def _log(path: Path, losses: dict[str, float], steps: range = range(10)) -> Path:
    rows = [f"{t},{s},{v * 100:.3f},100" for t in steps for s, v in losses.items()]
    path.write_text("step,source,loss_sum,tokens\n" + "\n".join(rows) + "\n")
    return path


def test_both_formats_read_alike_and_a_bad_row_is_named(tmp_path: Path) -> None:
    csv_log = _log(tmp_path / "l.csv", {"a": 2.0, "b": 3.0}, range(2))
    jsonl = tmp_path / "l.jsonl"
    jsonl.write_text(
        "\n".join(
            json.dumps({"step": t, "source": s, "loss_sum": v * 100, "tokens": 100})
            for t in range(2)
            for s, v in {"a": 2.0, "b": 3.0}.items()
        )
    )
    assert read_losses(csv_log) == read_losses(jsonl)
    csv_log.write_text(csv_log.read_text() + "3,a,nan?,100\n")
    with pytest.raises(FeedbackError, match=r"l\.csv:6:"):
        read_losses(csv_log)
    jsonl.write_text(jsonl.read_text() + "\n{broken")
    with pytest.raises(FeedbackError, match=r"l\.jsonl:5:"):
        read_losses(jsonl)


def test_a_spreadsheets_export_is_read_and_an_empty_log_is_named(tmp_path: Path) -> None:
    """A byte-order mark and CRLF line ends (a spreadsheet's CSV) read as the plain file; a quoted field over two
    lines moves the named line with it; an empty file is said to be empty, not to have a header of None."""
    plain = _log(tmp_path / "plain.csv", {"a": 2.0, "b": 3.0}, range(2))
    exported = tmp_path / "export.csv"
    exported.write_bytes(b"\xef\xbb\xbf" + plain.read_text().replace("\n", "\r\n").encode())
    assert read_losses(exported) == read_losses(plain)
    quoted = tmp_path / "quoted.csv"
    quoted.write_text('step,source,loss_sum,tokens\n0,"a\nb",1.0,10\n1,a,x,10\n')
    with pytest.raises(FeedbackError, match=r"quoted\.csv:4:"):
        read_losses(quoted)
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(FeedbackError, match=r"empty\.csv: the loss log is empty"):
        read_losses(empty)


def test_the_future_is_reweighted_within_bounds_and_the_past_kept(tmp_path: Path) -> None:
    (tmp_path / "fb.yaml").write_text(MIX)
    base = tmp_path / "base"
    mix = load_mix(tmp_path / "fb.yaml").continuing(str(base), 10)
    log = _log(tmp_path / "l.csv", {"a": 2.0, "b": 3.0, "c": 100.0})  # c's loss far above: its factor stops at 2
    out = apply_feedback(mix, log, "loss_proportional")
    assert out.curriculum[0] == mix.curriculum[0]
    w = out.curriculum[1].mixture
    assert abs(sum(w.values()) - 1.0) < 1e-6
    mean = (2.0 + 3.0 + 100.0) / 3
    raw = {"a": 0.5 * max(0.5, 2.0 / mean), "b": 0.25 * max(0.5, 3.0 / mean), "c": 0.25 * 2.0}
    assert w == pytest.approx({s: v / sum(raw.values()) for s, v in raw.items()}, abs=2e-6)
    assert out.continues is not None and out.continues.feedback is not None
    assert out.continues.feedback.weights == {"later": w} and out.continues.feedback.steps == (0, 10)
    again = apply_feedback(mix, log, "loss_proportional")
    assert again.fingerprint() == out.fingerprint() != mix.fingerprint()


def test_what_cannot_be_reweighted_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "fb.yaml").write_text(MIX)
    log = _log(tmp_path / "l.csv", {"a": 2.0})
    mix = load_mix(tmp_path / "fb.yaml")
    with pytest.raises(FeedbackError, match="--continue"):
        apply_feedback(mix, log, "loss_proportional")
    with pytest.raises(FeedbackError, match="unknown"):
        apply_feedback(mix.continuing(str(tmp_path), 10), log, "magic")
    with pytest.raises(FeedbackError, match="no phase starts at or after step 12"):
        apply_feedback(mix.continuing(str(tmp_path), 12), log, "loss_proportional")
    with pytest.raises(FeedbackError, match="no step before the switch"):
        apply_feedback(
            mix.continuing(str(tmp_path), 10),
            _log(tmp_path / "late.csv", {"a": 1.0}, range(10, 12)),
            "loss_proportional",
        )
    bad = MIX.replace("curriculum:", "continues: {base: b, at: 5, feedback: {policy: x}}\ncurriculum:")
    (tmp_path / "bad.yaml").write_text(bad)
    with pytest.raises(Exception, match="not from a mix file"):
        load_mix(tmp_path / "bad.yaml")


def test_scaling_law_reads_each_curve_against_the_tokens_trained_since_the_log_began(tmp_path: Path) -> None:
    """150 logged steps, the policy's window their last 100: each source's loss follows its own power law of its
    tokens trained, counted from step 0 (b trained 5 times as many tokens a step before the window as in it), so
    the factors are the laws' potentials α·β·n^(−α) at step 149 over their mean; counted from the window's start
    they would be other laws."""
    (tmp_path / "fb.yaml").write_text(MIX.replace("steps: 10,", "steps: 150,"))
    laws = {"a": (1.0, 30.0, 0.4), "b": (1.2, 20.0, 0.3), "c": (0.8, 50.0, 0.45)}  # ε, β, α

    def tokens(s: str, t: int) -> int:
        return 1000 if s == "b" and t < 50 else 200 if s == "b" else 100

    seen = {s: 0 for s in laws}
    rows = []
    for t in range(150):
        for s, (e, b, al) in laws.items():
            n = tokens(s, t)
            seen[s] += n
            rows.append(f"{t},{s},{(e + b * seen[s] ** -al) * n!r},{n}")
    log = tmp_path / "l.csv"
    log.write_text("step,source,loss_sum,tokens\n" + "\n".join(rows) + "\n")
    out = apply_feedback(load_mix(tmp_path / "fb.yaml").continuing(str(tmp_path / "base"), 150), log, "scaling_law")
    potential = {s: al * b * seen[s] ** -al for s, (e, b, al) in laws.items()}
    mean = sum(potential.values()) / 3
    note = out.continues.feedback  # type: ignore[union-attr]
    assert note is not None and note.policy == "scaling_law" and note.steps == (50, 150)
    assert note.factor == pytest.approx({s: p / mean for s, p in potential.items()}, rel=0.02)
    assert min(note.factor.values()) > 0.5 and max(note.factor.values()) < 2.0  # within bounds, none clipped


def test_only_the_mixs_sources_count_and_a_log_of_none_of_them_is_refused(tmp_path: Path) -> None:
    """A source the mix does not have moves no factor; a source the log lacks keeps its weight and is named; a
    log of another run (none of the mix's sources) is refused rather than leaving every weight unchanged."""
    (tmp_path / "fb.yaml").write_text(MIX)
    mix = load_mix(tmp_path / "fb.yaml").continuing(str(tmp_path / "base"), 10)
    out = apply_feedback(mix, _log(tmp_path / "l.csv", {"a": 2.0, "b": 6.0, "web": 1000.0}), "loss_proportional")
    note = out.continues.feedback  # type: ignore[union-attr]
    assert note is not None and set(note.loss) == {"a", "b"}
    assert note.factor == {"a": 0.5, "b": 1.5}  # the mean is a's and b's, 4.0: web's loss moved nothing
    assert unlogged(note) == ["c"] and note.weights["later"]["c"] == pytest.approx(0.25 / (0.25 + 0.375 + 0.25))
    with pytest.raises(FeedbackError, match=r"steps 0\.\.9 log no source of this mix \(they log web, wiki;"):
        apply_feedback(mix, _log(tmp_path / "other.csv", {"web": 2.0, "wiki": 3.0}), "loss_proportional")
