"""The build the provenance tests look up (``test_provenance*.py``, of ``mixing/provenance.py`` and the commands
that print it), and the ``weir`` command run in this process.

One small build reads every input format weir reads (jsonl with a template and a malformed line, parquet, csv
with a template and a value across two lines, text cut by a separator, a code ``.tar`` with a member it skips),
with a trained BPE and the loader's regrouping on, built in this process (about a second): each test module
builds it once (:func:`build_formats`, from a module-scoped fixture of its own). Each kept record's text as its
source renders it is written out here without weir's readers (:attr:`Formats.rendered`).
"""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from typer.testing import CliRunner

from mixing import load_mix
from mixing.output.layout import BuildLayout
from mixing.stages import STAGES
from pipelines.cli import app

__all__ = ["BATCH", "FORMATS_MIX", "LABEL", "STEPS", "Formats", "S", "build_formats", "weir", "write_formats"]

S, BATCH, STEPS = 64, 4, 8
LABEL = {  # what each format's ``line`` reads as
    "qa": r"line \d+",
    "rows": r"row \d+",
    "table": r"row \d+",
    "notes": r"piece \d+",
    "code": r"member \d+ \(pkg/m\d\.py\)",
}


@dataclass(frozen=True)
class Formats:
    """The build's root and, per (source, line), the record's text as its source renders it."""

    root: Path
    rendered: dict[tuple[str, int], str]


def write_formats(data: Path) -> dict[tuple[str, int], str]:
    """One file per format under ``data``; returns every kept record's rendered text by (source, line)."""
    data.mkdir(parents=True)
    rendered: dict[tuple[str, int], str] = {}
    lines = [json.dumps({"q": f"what is {i}+{i}?", "a": str(2 * i)}) for i in range(30)]
    lines.insert(5, "{not json")  # quarantined: the records after it keep their own line numbers
    (data / "qa.jsonl").write_text("\n".join(lines) + "\n")
    for n, line in enumerate(lines, start=1):
        if line.startswith('{"q"'):
            rec = json.loads(line)
            rendered["qa", n] = f"Q: {rec['q']} A: {rec['a']}"
    texts = [f"row {i}: " + " ".join(f"w{(i * 5 + k) % 17}" for k in range(3 + i)) for i in range(20)]
    pq.write_table(pa.table({"text": texts}), data / "rows.parquet")
    rendered |= {("rows", i + 1): t for i, t in enumerate(texts)}
    bodies = [f"body {i} é, {'x' * i}" if i != 3 else "body 3\nacross two lines" for i in range(20)]
    (data / "t.csv").write_text("title,body\n" + "".join(f't{i},"{b}"\n' for i, b in enumerate(bodies)))
    rendered |= {("table", i + 1): f"t{i}: {b}" for i, b in enumerate(bodies)}  # a row, not a line
    pieces = [f"note {i}: " + "abc " * (i * 3) + "end" for i in range(15)]
    (data / "notes.txt").write_text("\n\n".join(pieces))
    rendered |= {("notes", i + 1): p for i, p in enumerate(pieces)}
    with tarfile.open(data / "code.tar", "w") as tar:
        members = [("pkg/README.txt", "not code: skipped, but it is member 1")]
        members += [(f"pkg/m{i}.py", f"def f{i}(x):\n    return x * {i}\n" * (i + 1)) for i in range(8)]
        for n, (name, body) in enumerate(members, start=1):
            info = tarfile.TarInfo(name)
            info.size = len(body.encode())
            tar.addfile(info, io.BytesIO(body.encode()))
            if name.endswith(".py"):
                rendered["code", n] = body
    return rendered


FORMATS_MIX = """\
name: formats
seed: 3
tokenizer: {{kind: bpe, vocab_size: 300}}
sequence: {{length: {S}, global_batch: {BATCH}}}
sources:
  qa:    {{uri: "{data}/qa.jsonl", format: jsonl, template: "Q: {{q}} A: {{a}}", max_epochs: 50}}
  rows:  {{uri: "{data}/rows.parquet", format: parquet, max_epochs: 50}}
  table: {{uri: "{data}/t.csv", format: csv, template: "{{title}}: {{body}}", max_epochs: 50}}
  notes: {{uri: "{data}/notes.txt", format: text, separator: "\\n\\n", max_epochs: 50}}
  code:  {{uri: "{data}/code.tar", format: code, max_epochs: 50}}
curriculum:
  - {{phase: one, steps: {STEPS}, mixture: {{qa: 0.2, rows: 0.2, table: 0.2, notes: 0.2, code: 0.2}}}}
balance: {{regroup: {{window: 4, period: 2, slack: 1.15}}}}
"""


def build_formats(base: Path) -> Formats:
    """The mix of every format written under ``base`` (``data/``, ``formats.yaml``) and built, every stage in this
    process, into ``base/build``."""
    rendered = write_formats(base / "data")
    (base / "formats.yaml").write_text(FORMATS_MIX.format(S=S, BATCH=BATCH, STEPS=STEPS, data=base / "data"))
    mix, layout = load_mix(base / "formats.yaml"), BuildLayout(base / "build")
    for stage in STAGES:
        for part in stage.partitions(mix):
            stage.run(mix, layout, part)
    return Formats(layout.root, rendered)


def weir(*args: str) -> tuple[int, str, str]:
    """``weir ARGS`` run in this process: its exit code, stdout and stderr."""
    r = CliRunner().invoke(app, list(args))
    return r.exit_code, r.stdout, r.stderr
