"""``pipelines/freshness.py``: whether a folder's documents are what a mix tokenizes now. Computing the stats and
asking again finds no difference (a round trip); each way a folder can differ (sources, tokenizer, files added,
gone or changed, chunks missing) is named in one line, and only that; a finished build is never changed, its
stats going to the work cache instead, and a folder another build holds is refused. (``weir plan`` on top of
it: ``test_cli_plan.py``, ``test_operator_retry.py``.)"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from mixing import Mix, load_mix
from mixing.output.layout import BuildLayout
from pipelines.freshness import compute_stats, differences, has_documents, stats_folders
from pipelines.kept_work import work_cache
from pipelines.output_lock import output_lock
from pipelines.transaction import BuildBusy
from tests.conftest import TINY_MIX, write_tiny_sources


def digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


def edited(path: Path, old: str, new: str) -> Mix:
    text = path.read_text()
    assert old in text
    other = path.with_name("edited.yaml")
    other.write_text(text.replace(old, new))
    return load_mix(other)


def test_computed_stats_fit_their_mix_and_each_difference_is_named(tiny_mix_path: Path, tmp_path: Path) -> None:
    mix, root = load_mix(tiny_mix_path), tmp_path / "b"
    assert not has_documents(root) and stats_folders(mix, root) == {}
    said: list[str] = []
    assert compute_stats(mix, root, None, said.append) == root  # no finished build there: into root itself
    assert said[0] == f"computing the length statistics of mix 'tiny' in {root}"
    assert has_documents(root) and not BuildLayout(root).manifest.exists()
    assert differences(mix, root) == [] and stats_folders(mix, root) == {root: []}

    before = digests(root)
    renamed = edited(tiny_mix_path, "notes", "prose")  # its files too: they are not compared, the source is gone
    (found,) = differences(renamed, root)
    assert found == f"sources: the mix has ['prose', 'qa'], {root} holds documents of ['notes', 'qa'] (not ['notes'])"
    (found,) = differences(edited(tiny_mix_path, "{kind: bytes}", "{kind: bytes, bos: true}"), root)
    assert found.startswith("tokenizer: bos is True in the mix, False in")
    (found,) = differences(edited(tiny_mix_path, 'template: "Q: {q} A: {a}"', 'template: "{q}={a}"'), root)
    assert found.startswith("rendering: source 'qa' makes other documents")

    notes = tmp_path / "data" / "notes"
    (notes / "n99.txt").write_text("a new note\n")
    (notes / "n00.txt").unlink()
    (notes / "n01.txt").write_text("rewritten\n")
    (found,) = differences(mix, root)
    assert found.startswith(
        f"files: source 'notes' matches 12 files now, {root} tokenized 12: 1 new, 1 gone, 1 changed"
    )
    shutil.rmtree(notes)
    (found,) = differences(mix, root)
    assert found.startswith("files: source 'notes': no file matches")
    assert digests(root) == before, "asking writes nothing"


def test_a_missing_chunk_or_tokenizer_is_a_difference(tiny_mix_path: Path, tmp_path: Path) -> None:
    mix, root = load_mix(tiny_mix_path), tmp_path / "b"
    compute_stats(mix, root, None, lambda _s: None)
    layout = BuildLayout(root)
    (chunk,) = sorted((layout.source_dir("qa") / "chunks").iterdir())[:1]
    (chunk / "report.json").unlink()
    (found,) = differences(mix, root)  # the files are the same: what they would make now is not all there
    assert found == "rendering: source 'qa' makes other documents now (format, field, template, ...)"
    shutil.rmtree(layout.tokenizer_dir)
    (found,) = differences(mix, root)
    assert found == f"tokenizer: {root} has no prepared tokenizer"


def test_beside_a_finished_build_the_stats_go_to_its_work_cache(tiny_build: Path, tmp_path: Path) -> None:
    out = tmp_path / "build"
    shutil.copytree(tiny_build, out)  # a copy: the session build stays whatever happens here
    shutil.copy(tiny_build.parent / "tiny.yaml", tmp_path / "tiny.yaml")
    mix = load_mix(tmp_path / "tiny.yaml")
    before = digests(out)
    assert stats_folders(mix, out) == {out: []}
    edit = edited(tmp_path / "tiny.yaml", 'template: "Q: {q} A: {a}"', 'template: "{q}={a}"')
    target = compute_stats(edit, out, None, lambda _s: None)
    assert target == work_cache(out)
    assert digests(out) == before, "a finished build is never changed"
    found = stats_folders(edit, out)
    assert list(found) == [out, target] and found[target] == [] and found[out]  # root first; only the cache fits


def test_a_folder_another_build_holds_is_refused(tiny_mix_path: Path, tmp_path: Path) -> None:
    root = tmp_path / "b"
    with output_lock(root, False, lambda _s: None), pytest.raises(BuildBusy, match=f"pid {os.getpid()}"):
        compute_stats(load_mix(tiny_mix_path), root, None, lambda _s: None)
    assert not has_documents(root)


def test_an_hf_tokenizer_is_compared_by_content_not_by_the_path_naming_it(tiny_mix_path: Path, tmp_path: Path) -> None:
    from mixing.ingest.tokenizer import prepare_tokenizer
    from mixing.mixfile.mix import TokenizerSpec

    texts = ["some notes about things", "Q: 1+1 A: 2", "more text of another kind"] * 30
    for name, sample in (("tok", texts), ("other", [t.upper() for t in texts])):
        prepare_tokenizer(TokenizerSpec(kind="bpe", vocab_size=300), tmp_path / f"{name}-bpe", iter(sample))
    assert (tmp_path / "tok-bpe" / "tokenizer.json").read_bytes() != (
        tmp_path / "other-bpe" / "tokenizer.json"
    ).read_bytes()
    tok = tmp_path / "models" / "tok.json"
    tok.parent.mkdir()
    shutil.copyfile(tmp_path / "tok-bpe" / "tokenizer.json", tok)
    hf = "{kind: hf, path: models/tok.json, eos_token: '<|endoftext|>'}"
    mix, root = edited(tiny_mix_path, "{kind: bytes}", hf), tmp_path / "b"
    compute_stats(mix, root, None, lambda _s: None)
    assert differences(mix, root) == []
    # the same file named another way (the path string differs): no difference
    assert differences(edited(tiny_mix_path, "{kind: bytes}", hf.replace("models/", "models/../models/./")), root) == []
    shutil.copyfile(tmp_path / "other-bpe" / "tokenizer.json", tok)  # another tokenizer at the same path
    (found,) = differences(mix, root)
    assert found == f"tokenizer: path: {str(tok)!r} holds another tokenizer than the one {root} was tokenized with"


def test_a_mix_moved_copied_or_linked_with_its_data_still_fits_and_a_changed_file_does_not(tmp_path: Path) -> None:
    write_tiny_sources(tmp_path / "old" / "data")
    (tmp_path / "old" / "tiny.yaml").write_text(TINY_MIX.format(root="data"))
    root = tmp_path / "b"
    compute_stats(load_mix(tmp_path / "old" / "tiny.yaml"), root, None, lambda _s: None)
    (tmp_path / "old").rename(tmp_path / "moved")
    assert differences(load_mix(tmp_path / "moved" / "tiny.yaml"), root) == []  # other paths, the same files

    shutil.copytree(tmp_path / "moved", tmp_path / "copy", copy_function=shutil.copyfile)  # new mtimes too
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / "data").symlink_to(tmp_path / "copy" / "data", target_is_directory=True)
    shutil.copy(tmp_path / "copy" / "tiny.yaml", tmp_path / "linked" / "tiny.yaml")
    for folder in ("copy", "linked"):
        assert differences(load_mix(tmp_path / folder / "tiny.yaml"), root) == [], folder

    note = tmp_path / "copy" / "data" / "notes" / "n04.txt"
    note.write_text(note.read_text().replace("word", "wort"))  # the same size, other bytes
    (found,) = differences(load_mix(tmp_path / "linked" / "tiny.yaml"), root)
    assert found.startswith(
        f"files: source 'notes' matches 12 files now, {root} tokenized 12: 0 new, 0 gone, 1 changed"
    )
    assert found.endswith(f"(e.g. {tmp_path / 'linked' / 'data' / 'notes' / 'n04.txt'})")
