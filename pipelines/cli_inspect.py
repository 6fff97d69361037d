"""The commands that read a finished build: ``weir inspect``, ``weir lookup``, ``weir epochs`` and ``weir diff``.

Each takes a build folder or the URL it was published to, reads without changing anything, prints for people or
with ``--json`` for machines, and exits 1 with one line when the build cannot be read (``inspect --strict``: 4
when a goal is missed).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from contract.errors import WeirError
from pipelines.cli_common import STRICT_EXIT, build_root, err, exit_if_missed, out, say_error, with_stream

if TYPE_CHECKING:
    import numpy as np

    from mixing.provenance import Provenance, Slots

__all__ = ["diff", "epochs", "inspect", "lookup"]


def inspect(
    build_dir: Annotated[str, typer.Argument(help="a build folder, or the s3:// URL weir build published it to")],
    as_json: Annotated[bool, typer.Option("--json", help="print JSON for machines")] = False,
    strict: Annotated[bool, typer.Option("--strict", help=f"exit {STRICT_EXIT} when a goal is missed")] = False,
) -> None:
    """Print a build's figures: sequences, tokens, steps, tokens per source, packing metrics.

    Recomputes them from the shards, verifying every checksum. Exits 1 with one line naming the file when
    the build cannot be read (a missing, damaged or edited manifest, shard file or DuckDB file) or a
    shard's checksum does not match the manifest; with --strict, exits 4 when a goal is missed. A build in
    object storage is read with the plan in the working folder of the machine that built it ($WEIR_WORK_DIR).
    """
    from mixing.output.layout import BuildLayout
    from mixing.report import inspect_build
    from pipelines.summary import missed_goals, print_summary

    root = build_root(build_dir)
    try:
        report = with_stream(inspect_build(root), root)
    except WeirError as e:
        say_error("not a readable build", e)
        raise typer.Exit(1) from None
    missed = missed_goals(report)
    shards = BuildLayout.of(root).shards_url
    if as_json:  # the figures as they are (machines judge them); --strict still exits 4
        print(json.dumps(report.as_json(), indent=2, sort_keys=True))
    else:
        print_summary(out, report)
    if not report.manifest_sealed:
        err.print(
            f"[yellow]note[/]: {shards}/manifest.json (format {report.format_version}) was written "
            "before manifests carried their own checksum (manifest_sha256): edits to it cannot be detected; "
            "rebuild to add one",
            highlight=False,
            soft_wrap=True,
        )
    if report.corrupt_files:
        bad = "; ".join(f"{shards}/{name}: {why}" for name, why in report.file_problems.items())
        say_error("corrupt shard files", bad)
        raise typer.Exit(1)
    exit_if_missed(missed, strict, quiet=as_json)


def lookup(
    build_dir: Annotated[str, typer.Argument(help="a build folder, or the s3:// URL weir build published it to")],
    step: Annotated[int, typer.Option("--step", help="the training step, as the loader hands it out")],
    rank: Annotated[
        int | None, typer.Option("--rank", help="only this DP rank's share of the step (with --dp)")
    ] = None,
    dp: Annotated[int, typer.Option("--dp", help="DP ranks the step is dealt to")] = 1,
    cp: Annotated[int, typer.Option("--cp", help="CP ranks each sequence is split over (with --cp-rank)")] = 1,
    cp_rank: Annotated[int, typer.Option("--cp-rank", help="the CP rank whose token ranges to show")] = 0,
    cp_split: Annotated[str, typer.Option("--cp-split", help="zigzag, thd, contiguous or sequence_zigzag")] = "zigzag",
    text: Annotated[bool, typer.Option("--text", help="also print each segment's text, decoded")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON for machines")] = False,
) -> None:
    """Print every segment of training step STEP: its sequence, source, file, record, token range in its document.

    The step is the one a loader with the build's own balance hands out (PackedDataset's default Balance(): with
    balance.regroup a training step gathers sequences of several build steps; without, it is the build step).
    --rank R --dp D: only the sequences DP rank R of D reads, in its reading order. --cp C --cp-rank K: the same
    documents (a CP group trains on the same sequences and reduces one loss, so a spike on one CP rank is a
    spike of these documents), each also listing the token ranges of its document that CP rank K holds under
    --cp-split: zigzag (weir's per-document split, the loader's items), thd (per document, as StepLoader cuts
    it for Transformer Engine), contiguous or sequence_zigzag (slices of the sequence: a rank may hold none of
    a document). --text decodes each segment's tokens as the shards hold them, BOS/EOS left out: a whole
    document's text is its record as rendered. Exit 1 with one line when the build, the step or a source's
    document index cannot be read.
    """
    from mixing.provenance import Provenance

    try:
        prov = Provenance(build_root(build_dir))
        seqs, slots, where = _lookup_share(prov, step, rank, dp, cp, cp_rank, cp_split)
        pieces = prov.lookup(seqs, text=text, slots=slots)
    except WeirError as e:
        say_error("cannot look it up", e)
        raise typer.Exit(1) from None
    except ValueError as e:  # the loader refuses the world or the split (World, LoaderConfig, the planner)
        err.print(
            f"[bold red]cannot look it up[/]: {escape(str(e))}; give the --rank/--dp/--cp/--cp-split of the "
            "training run",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(1) from None
    tokens = sum(p.length for p in pieces)
    if as_json:
        report = {"build": prov.layout.url, "step": step, **where, "sequences": [int(s) for s in seqs]}
        report |= {"tokens": tokens, "segments": [p.as_json() for p in pieces]}
        print(json.dumps(report, indent=2, ensure_ascii=False))
        return
    share = "".join(f", {k.upper()} rank {v['rank']} of {v['size']}" for k, v in where.items() if k in ("dp", "cp"))
    split = f" ({cp_split})" if cp > 1 else ""
    out.print(
        f"training step {step}{share}{split}: {len(seqs)} sequences, {len(pieces)} segments, {tokens:,} tokens",
        highlight=False,
        markup=False,
    )
    last = None
    for p in pieces:
        if p.sequence != last:
            out.print(f"sequence {p.sequence} (build step {p.step})", highlight=False, markup=False)
            last = p.sequence
        held = "" if p.held is None else "  held " + (" ".join(f"{a}:{b}" for a, b in p.held) or "none")
        out.print(
            f"  {p.source}  {p.file}  {p.record}  tokens {p.start}:{p.end} of {p.n_tokens} ({p.length}){held}",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
        if p.text is not None:
            out.print(f"    {json.dumps(p.text, ensure_ascii=False)}", highlight=False, markup=False, soft_wrap=True)


def _lookup_share(
    prov: Provenance, step: int, rank: int | None, dp: int, cp: int, cp_rank: int, cp_split: str
) -> tuple[np.ndarray, Slots | None, dict[str, dict[str, object]]]:
    """The sequences of training ``step`` (or DP rank ``rank``'s, in its reading order), the CP rank's slots
    (None without CP) and the share for the JSON. The loader decides (its planner under the build's balance,
    its checks of the world and the split); with no regroup, no DP rank and no CP a training step is the build
    step, and the loader (torch) is not imported."""
    import numpy as np

    from mixing.provenance import ProvenanceError

    seqs = prov.step_sequences(step)  # a step the build lacks: one line naming its steps
    if rank is None and dp > 1:
        raise ProvenanceError(f"--dp {dp} names no rank: add --rank R (0..{dp - 1}) for that rank's share of the step")
    if cp == 1 and cp_rank:
        raise ProvenanceError(f"--cp-rank {cp_rank} needs --cp C, the CP ranks (more than {cp_rank})")
    where: dict[str, dict[str, object]] = {}
    m = prov.shards.manifest
    if rank is None and m.regrouping.window == 1 and cp == 1:
        return seqs, None, where
    from loaders.config import LoaderConfig
    from loaders.context_parallel import SPLITS
    from loaders.stream import settings_planner
    from loaders.world import World

    world = World(dp_rank=rank or 0, dp_size=dp, cp_rank=cp_rank, cp_size=cp)
    settings = LoaderConfig(world=world, cp_split=cp_split).resolve(m)
    if rank is not None or m.regrouping.window > 1:
        planner = settings_planner(prov.shards, settings.balance)
        if rank is not None:
            planner.check_world(dp)
            seqs = np.asarray(planner.assignment(step, dp)[rank], dtype=np.int64)
            where["dp"] = {"rank": rank, "size": dp}
        else:
            seqs = planner.step_sequences(step)
    if cp == 1:
        return seqs, None, where
    where["cp"] = {"rank": cp_rank, "size": cp, "split": cp_split}
    if cp_split in ("zigzag", "thd"):  # per document: a sequence's own segments decide
        how = SPLITS[cp_split]
        return seqs, lambda lengths: how(lengths, cp, cp_rank), where
    fixed = SPLITS[cp_split](np.array([m.seq_len]), cp, cp_rank)  # slices of the sequence: the same in every one
    return seqs, lambda lengths: fixed, where


def epochs(
    build_dir: Annotated[str, typer.Argument(help="a build folder, or the s3:// URL weir build published it to")],
    steps: Annotated[str | None, typer.Option("--steps", help="build steps A:B (A to B-1; default all)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON for machines")] = False,
) -> None:
    """Print per source what build steps A..B-1 took of it: tokens seen, unique tokens, repeated tokens, epochs.

    A piece of a document (doc_id, start) counts once towards unique tokens however often it is drawn; epochs
    = tokens seen ÷ the source's tokens (its docs.parquet's n_tokens), fractional. Exit 1 with one line when the
    build or a source's document index cannot be read, or A:B is not a span of its steps.
    """
    from rich.table import Table

    from mixing.provenance import Provenance, step_range

    try:
        prov = Provenance(build_root(build_dir))
        report = prov.epochs(*step_range(steps, prov.steps))
    except WeirError as e:
        say_error("cannot count it", e)
        raise typer.Exit(1) from None
    if as_json:
        print(json.dumps(report.as_json(), indent=2))
        return
    table = Table(title=f"build steps {report.first}..{report.stop - 1} of {prov.layout.url}")
    for name in ("source", "tokens", "seen", "unique", "repeated", "epochs"):
        table.add_column(name, justify="left" if name == "source" else "right")
    for s in report.sources:
        table.add_row(
            s.source,
            f"{s.tokens:,}",
            f"{s.tokens_seen:,}",
            f"{s.unique_tokens:,}",
            f"{s.repeated_tokens:,}",
            f"{s.epochs:.3f}",
        )
    out.print(table)


def diff(
    a: Annotated[str, typer.Argument(help="a build folder or URL (the base, for a continuation)")],
    b: Annotated[str, typer.Argument(help="another build folder or URL")],
    as_json: Annotated[bool, typer.Option("--json", help="print JSON for machines")] = False,
) -> None:
    """Print where two builds' training steps part: the steps whose digests are equal, the first that differs,
    and where B continues A. Exits 1 with one line when a build cannot be read."""
    from pipelines.diff import diff_builds, open_shards
    from pipelines.resources import storage_resource

    try:
        opened = [open_shards(x, storage_resource(x, per_mix=False, bound=False).storage_options()) for x in (a, b)]
        result = diff_builds(*opened)
    except WeirError as e:
        say_error("not a readable build", e)
        raise typer.Exit(1) from None
    if as_json:
        print(json.dumps(result.as_json(), indent=2, sort_keys=True))
        return
    for line in result.lines():
        out.print(line, highlight=False, markup=False)
