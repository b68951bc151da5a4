"""Data preparation end to end on the test recipe's real files (DESIGN §7.4): verified digests,
deduplication, decontamination against the held-out set, the run's tokenizer (named by the
manifest or trained), atomic shards and a provenance report whose digests are those of the bytes
written — and refusals that write nothing."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from tokenizers import Tokenizer, models

from ito.core.errors import ItoError
from ito.core.manifest import Manifest, parse_manifest
from ito.core.provenance import provenance_digest
from ito.pipeline.data import pack, prepared_tokenizer, read_documents
from ito.pipeline.data_prep import (
    MAX_DATA_FILE_BYTES,
    PROVENANCE_FILE,
    BookingStorage,
    PrepReport,
    TokenizerReport,
    prepare_data,
    prepared_dir,
    shard_path,
)
from ito.pipeline.tokenizer import (
    EOS,
    TOKENIZER_FILE,
    tokenizer_bytes,
    train_tokenizer,
    vocab_size,
)
from ito.recipes import build_recipe

Row = dict[str, Any]


@dataclass
class Recipe:
    """The test recipe written to disk, editable: change rows, then take a fresh manifest."""

    data_dir: Path
    doc: dict[str, Any]

    def path(self, data_id: str) -> Path:
        ref = next(d for d in self.doc["data"] if d["id"] == data_id)
        return Path(ref["uri"].removeprefix("file://"))

    def rows(self, data_id: str) -> list[Row]:
        return [json.loads(line) for line in self.path(data_id).read_bytes().splitlines()]

    def write_rows(self, data_id: str, rows: list[Row]) -> None:
        """Rewrite the data and its digest in the manifest, as a buyer editing data would."""
        raw = b"".join(json.dumps(row).encode() + b"\n" for row in rows)
        self.path(data_id).write_bytes(raw)
        ref = next(d for d in self.doc["data"] if d["id"] == data_id)
        ref["sha256"] = hashlib.sha256(raw).hexdigest()

    def manifest(self, **policy: Any) -> Manifest:
        self.doc["data_policy"].update(policy)
        return parse_manifest(json.dumps(self.doc).encode())


def _write_recipe(name: str, data_dir: Path) -> Recipe:
    data_dir.mkdir()
    recipe = build_recipe(name, str(data_dir))
    for fname, content in recipe.files.items():
        (data_dir / fname).write_bytes(content)
    # A JSON round trip, not deepcopy: the recipe shares lists between entries.
    return Recipe(data_dir=data_dir, doc=json.loads(json.dumps(recipe.manifest)))


@pytest.fixture
def recipe(tmp_path: Path) -> Recipe:
    return _write_recipe("test", tmp_path / "data")


def _refusal(manifest: Manifest, workdir: Path) -> ItoError:
    with pytest.raises(ItoError) as info:
        prepare_data(manifest, workdir)
    return info.value


def _tree(path: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()
    }


def _long_doc(prefix: str) -> str:
    return " ".join(
        f"{prefix} section {i} of the report lists shard {i * 7} with checksum {i * 13 + 5} ."
        for i in range(20)
    )


# --- the happy path -------------------------------------------------------------------------


def test_prepared_shards_and_provenance_match_the_bytes_written(
    recipe: Recipe, tmp_path: Path
) -> None:
    manifest = recipe.manifest()
    workdir = tmp_path / "work"
    report = prepare_data(manifest, workdir)

    assert isinstance(report, PrepReport)
    provenance = json.loads((prepared_dir(workdir) / PROVENANCE_FILE).read_bytes())
    assert provenance == report.to_dict()
    assert [d.id for d in report.datasets] == [ref.id for ref in manifest.data]
    for data, ref in zip(report.datasets, manifest.data, strict=True):
        shard = shard_path(workdir, data.id).read_bytes()
        assert data.input_sha256 == ref.sha256
        assert data.output_sha256 == hashlib.sha256(shard).hexdigest()
        assert data.output_bytes == len(shard)
        assert data.output_rows == len(shard.splitlines())
        assert data.input_rows == len(recipe.rows(data.id))
        assert data.input_rows == (
            data.empty_removed
            + data.exact_dupes_removed
            + data.near_dupes_removed
            + data.contaminated_removed
            + data.output_rows
        )
    assert report.dataset("web").ngram == 13
    assert report.dataset("web").decontaminated_against == ("arith-heldout",)
    assert report.dataset("arith-heldout").ngram is None
    assert [(e.id, e.items, e.contaminated) for e in report.evals] == [("arith-heldout", 200, 0)]
    assert report.eval_contaminated_fraction == 0.0
    assert sorted(p.name for p in prepared_dir(workdir).iterdir()) == sorted(
        [f"{ref.id}.jsonl" for ref in manifest.data] + [PROVENANCE_FILE, TOKENIZER_FILE]
    )
    # Without model.tokenizer one is trained on the data, and the report holds its digest.
    tokenizer = (prepared_dir(workdir) / TOKENIZER_FILE).read_bytes()
    assert report.tokenizer.source == "trained"
    assert report.tokenizer.sha256 == hashlib.sha256(tokenizer).hexdigest()
    assert 256 < report.tokenizer.vocab <= 512  # the tiny model's vocabulary bounds it
    assert provenance["tokenizer"] == {
        "source": "trained",
        "sha256": report.tokenizer.sha256,
        "vocab": report.tokenizer.vocab,
    }


def test_prepared_rows_are_normalised_and_keep_only_their_roles_fields(
    recipe: Recipe, tmp_path: Path
) -> None:
    web = recipe.rows("web")
    web[0] = {"text": "  Ｔhe\u00a0model\tadds\n\nsmall  numbers .  ", "source": "crawl-7"}
    sft = recipe.rows("arith-sft")
    sft[0] = {"prompt": " 1+2=\u3000", "completion": "３", "weight": 2}
    recipe.write_rows("web", web)
    recipe.write_rows("arith-sft", sft)
    workdir = tmp_path / "work"
    prepare_data(recipe.manifest(), workdir)

    first_web = json.loads(shard_path(workdir, "web").read_bytes().splitlines()[0])
    assert first_web == {"text": "The model adds small numbers ."}
    first_sft = json.loads(shard_path(workdir, "arith-sft").read_bytes().splitlines()[0])
    assert first_sft == {"prompt": "1+2= ", "completion": "3"}


def test_exact_and_near_duplicates_are_removed_and_counted(recipe: Recipe, tmp_path: Path) -> None:
    web = recipe.rows("web")
    original = _long_doc("alpha")
    words = original.split()
    words[len(words) // 2] = "changed"
    one_word_changed = " ".join(words)
    half_changed = " ".join(w if i % 2 else "other" for i, w in enumerate(words))
    web += [
        dict(web[3]),  # exact copy
        {"text": "  " + web[5]["text"].replace(" ", "   ") + "\n"},  # same after normalising
        {"text": original},
        {"text": one_word_changed},  # near duplicate
        {"text": half_changed},  # similar, not a duplicate
    ]
    recipe.write_rows("web", web)
    workdir = tmp_path / "work"
    report = prepare_data(recipe.manifest(), workdir)

    counts = report.dataset("web")
    assert (counts.exact_dupes_removed, counts.near_dupes_removed) == (2, 1)
    assert counts.output_rows == len(web) - 3
    texts = [
        json.loads(line)["text"] for line in shard_path(workdir, "web").read_bytes().splitlines()
    ]
    assert texts.count(web[3]["text"]) == 1
    assert texts.count(web[5]["text"]) == 1
    assert original in texts
    assert half_changed in texts
    assert one_word_changed not in texts


def test_planted_eval_items_are_removed_from_training_data_and_counted(
    recipe: Recipe, tmp_path: Path
) -> None:
    heldout = recipe.rows("arith-heldout")
    item_a, item_b = heldout[7], heldout[42]
    sft = recipe.rows("arith-sft")
    sft.insert(10, {"prompt": item_a["prompt"], "completion": item_a["answer"]})
    recipe.write_rows("arith-sft", sft)
    web = recipe.rows("web")
    web.insert(
        3,
        {
            "text": f"the batch counts two digits . {item_b['prompt']} "
            f"{item_b['answer']} . the model adds small numbers ."
        },
    )
    recipe.write_rows("web", web)
    workdir = tmp_path / "work"
    report = prepare_data(recipe.manifest(max_contamination=0.05), workdir)

    assert report.dataset("arith-sft").contaminated_removed == 1
    assert report.dataset("web").contaminated_removed == 1
    assert report.dataset("arith-prefs").contaminated_removed == 0
    assert [(e.id, e.items, e.contaminated) for e in report.evals] == [("arith-heldout", 200, 2)]
    assert report.eval_contaminated_fraction == pytest.approx(0.01)
    written = json.loads((prepared_dir(workdir) / PROVENANCE_FILE).read_bytes())
    assert written["eval_contaminated_fraction"] == pytest.approx(0.01)
    # The report names the matched eval items and where each was found.
    matched = written["evals"][0]["matched"]
    assert [(m["item"], m["found_in"]) for m in matched] == [
        (7, {"arith-sft": 1}),
        (42, {"web": 1}),
    ]
    assert all(len(m["item_sha256"]) == 64 for m in matched)
    assert written["evals"][0]["matched_listed_all"] is True
    assert item_a["prompt"].encode() not in shard_path(workdir, "arith-sft").read_bytes()
    assert item_b["prompt"].encode() not in shard_path(workdir, "web").read_bytes()
    # The eval data itself is kept whole.
    assert report.dataset("arith-heldout").output_rows == 200


def test_a_clean_near_duplicate_of_a_contaminated_row_is_kept(
    recipe: Recipe, tmp_path: Path
) -> None:
    item = recipe.rows("arith-heldout")[0]
    clean = _long_doc("beta")
    web = recipe.rows("web")
    web += [{"text": f"{clean} {item['prompt']} {item['answer']}"}, {"text": clean}]
    recipe.write_rows("web", web)
    workdir = tmp_path / "work"
    report = prepare_data(recipe.manifest(max_contamination=0.01), workdir)

    assert report.dataset("web").contaminated_removed == 1
    assert report.dataset("web").near_dupes_removed == 0
    texts = [
        json.loads(line)["text"] for line in shard_path(workdir, "web").read_bytes().splitlines()
    ]
    assert clean in texts


def test_two_runs_give_byte_identical_shards_and_provenance(recipe: Recipe, tmp_path: Path) -> None:
    web = recipe.rows("web")
    web += [dict(web[0]), {"text": _long_doc("gamma")}, {"text": _long_doc("gamma") + " x"}]
    recipe.write_rows("web", web)
    manifest = recipe.manifest()
    first = prepare_data(manifest, tmp_path / "one")
    second = prepare_data(manifest, tmp_path / "two")

    assert [d.output_sha256 for d in first.datasets] == [d.output_sha256 for d in second.datasets]
    assert first == second
    assert _tree(prepared_dir(tmp_path / "one")) == _tree(prepared_dir(tmp_path / "two"))
    # Preparing again into the same directory replaces the files with the same bytes.
    before = _tree(prepared_dir(tmp_path / "one"))
    prepare_data(manifest, tmp_path / "one")
    assert _tree(prepared_dir(tmp_path / "one")) == before


# --- refusals write nothing -----------------------------------------------------------------


def test_a_sha256_mismatch_refuses_and_writes_nothing(recipe: Recipe, tmp_path: Path) -> None:
    manifest = recipe.manifest()
    path = recipe.path("arith-prompts")
    path.write_bytes(path.read_bytes() + b'{"prompt": "1+1=", "answer": "2"}\n')
    workdir = tmp_path / "work"

    exc = _refusal(manifest, workdir)
    assert exc.code == "data_policy_violation"
    assert exc.details["reason"] == "sha256_mismatch"
    assert exc.details["data_id"] == "arith-prompts"
    assert not workdir.exists()


def test_a_refusal_leaves_an_earlier_preparation_untouched(recipe: Recipe, tmp_path: Path) -> None:
    manifest = recipe.manifest()
    workdir = tmp_path / "work"
    prepare_data(manifest, workdir)
    before = _tree(workdir)
    recipe.path("web").write_bytes(b'{"text": "tampered"}\n')

    assert _refusal(manifest, workdir).details["reason"] == "sha256_mismatch"
    assert _tree(workdir) == before


def test_contamination_above_the_policy_refuses_and_writes_nothing(
    recipe: Recipe, tmp_path: Path
) -> None:
    item = recipe.rows("arith-heldout")[3]
    prompts = recipe.rows("arith-prompts")
    prompts.append({"prompt": item["prompt"], "answer": item["answer"]})
    recipe.write_rows("arith-prompts", prompts)
    workdir = tmp_path / "work"

    exc = _refusal(recipe.manifest(max_contamination=0.0), workdir)
    assert exc.code == "data_policy_violation"
    assert exc.details["reason"] == "contamination"
    assert exc.details["data_id"] == "arith-heldout"
    assert exc.details["fraction"] == pytest.approx(1 / 200)
    assert not workdir.exists()


def test_contamination_at_the_policy_limit_is_accepted(recipe: Recipe, tmp_path: Path) -> None:
    item = recipe.rows("arith-heldout")[3]
    prompts = recipe.rows("arith-prompts")
    prompts.append({"prompt": item["prompt"], "answer": item["answer"]})
    recipe.write_rows("arith-prompts", prompts)

    report = prepare_data(recipe.manifest(max_contamination=1 / 200), tmp_path / "work")
    assert report.dataset("arith-prompts").contaminated_removed == 1


def test_a_non_file_uri_is_refused_as_unavailable(recipe: Recipe, tmp_path: Path) -> None:
    recipe.doc["data"][2]["uri"] = "s3://bucket/arith-sft.jsonl"
    exc = _refusal(recipe.manifest(), tmp_path / "work")
    assert exc.code == "capability_unavailable"
    assert exc.details["data_id"] == "arith-sft"
    assert not (tmp_path / "work").exists()


def test_a_missing_file_is_refused(recipe: Recipe, tmp_path: Path) -> None:
    manifest = recipe.manifest()
    recipe.path("arith-prefs").unlink()
    exc = _refusal(manifest, tmp_path / "work")
    assert exc.code == "data_policy_violation"
    assert (exc.details["reason"], exc.details["data_id"]) == ("unreadable", "arith-prefs")


def test_a_device_or_fifo_is_refused_without_being_read(recipe: Recipe, tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)  # opening it for reading would block forever without O_NONBLOCK
    for uri in ("file:///dev/zero", f"file://{fifo}"):
        recipe.doc["data"][2]["uri"] = uri
        exc = _refusal(recipe.manifest(), tmp_path / "work")
        assert exc.code == "data_policy_violation"
        assert (exc.details["reason"], exc.details["data_id"]) == ("not_regular_file", "arith-sft")


def test_a_symlinked_data_file_is_refused(recipe: Recipe, tmp_path: Path) -> None:
    link = tmp_path / "link.jsonl"
    link.symlink_to(recipe.path("arith-sft"))
    recipe.doc["data"][2]["uri"] = f"file://{link}"
    exc = _refusal(recipe.manifest(), tmp_path / "work")
    assert (exc.code, exc.details["reason"]) == ("data_policy_violation", "unreadable")


def _in_storage(tmp_path: Path) -> tuple[Recipe, BookingStorage]:
    """The test recipe written under a booking's storage, at ``storage/manifests/m``."""
    storage = tmp_path / "storage"
    (storage / "manifests").mkdir(parents=True)
    recipe = _write_recipe("test", storage / "manifests" / "m")
    return recipe, BookingStorage(f"file://{storage}", storage.resolve())


def _refusal_in(manifest: Manifest, workdir: Path, storage: BookingStorage) -> ItoError:
    with pytest.raises(ItoError) as info:
        prepare_data(manifest, workdir, storage=storage)
    return info.value


def test_data_inside_the_booking_storage_is_read_through_proven_directories(
    tmp_path: Path,
) -> None:
    recipe, storage = _in_storage(tmp_path)
    walked = prepare_data(recipe.manifest(), tmp_path / "walked", storage=storage)
    by_path = prepare_data(recipe.manifest(), tmp_path / "by-path")
    assert walked.to_dict() == by_path.to_dict()


def test_a_directory_link_inside_the_storage_leads_nowhere(tmp_path: Path) -> None:
    """``storage/manifests/m`` a link to a directory outside: the URI names a path inside the
    storage, the gates accept it, and the walk refuses it without opening the file."""
    recipe, storage = _in_storage(tmp_path)
    outside = tmp_path / "outside"
    (storage.root / "manifests" / "m").rename(outside)
    (storage.root / "manifests" / "m").symlink_to(outside)
    exc = _refusal_in(recipe.manifest(), tmp_path / "work", storage)
    assert exc.code == "data_policy_violation"
    assert (exc.details["reason"], exc.details["data_id"]) == ("link_in_path", "web")
    assert not (tmp_path / "work").exists()


def test_a_data_file_linked_inside_the_storage_is_refused(tmp_path: Path) -> None:
    recipe, storage = _in_storage(tmp_path)
    secret = tmp_path / "secret.jsonl"
    recipe.path("arith-sft").rename(secret)
    recipe.path("arith-sft").symlink_to(secret)
    exc = _refusal_in(recipe.manifest(), tmp_path / "work", storage)
    assert (exc.code, exc.details["reason"]) == ("data_policy_violation", "link_in_path")
    assert exc.details["data_id"] == "arith-sft"


def test_a_fifo_or_a_too_large_file_inside_the_storage_is_refused_unread(tmp_path: Path) -> None:
    recipe, storage = _in_storage(tmp_path)
    manifest = recipe.manifest()
    recipe.path("arith-sft").unlink()
    os.mkfifo(recipe.path("arith-sft"))
    exc = _refusal_in(manifest, tmp_path / "work", storage)
    assert (exc.code, exc.details["reason"]) == ("data_policy_violation", "not_regular_file")
    recipe.path("arith-sft").unlink()
    with recipe.path("arith-sft").open("wb") as handle:
        handle.truncate(MAX_DATA_FILE_BYTES + 1)  # sparse: never written, never read
    exc = _refusal_in(manifest, tmp_path / "work", storage)
    assert (exc.code, exc.details["reason"]) == ("data_policy_violation", "too_large")


def test_data_outside_the_booking_storage_is_refused_before_it_is_opened(tmp_path: Path) -> None:
    recipe, storage = _in_storage(tmp_path)
    elsewhere = _write_recipe("test", tmp_path / "elsewhere")
    recipe.doc["data"][2]["uri"] = f"file://{elsewhere.path('arith-sft')}"
    exc = _refusal_in(recipe.manifest(), tmp_path / "work", storage)
    assert exc.code == "data_policy_violation"
    assert (exc.details["reason"], exc.details["data_id"]) == (
        "outside_booking_storage",
        "arith-sft",
    )


def test_a_named_tokenizer_behind_a_link_in_the_storage_is_refused(tmp_path: Path) -> None:
    recipe, storage = _in_storage(tmp_path)
    target = tmp_path / "tokenizer.json"
    target.write_bytes(b"{}")
    link = storage.root / "manifests" / "tokenizer.json"
    link.symlink_to(target)
    recipe.doc["model"]["tokenizer"] = {
        "uri": f"file://{link}",
        "sha256": hashlib.sha256(b"{}").hexdigest(),
    }
    exc = _refusal_in(recipe.manifest(), tmp_path / "work", storage)
    assert (exc.code, exc.details["reason"]) == ("tokenizer_invalid", "link_in_path")


@pytest.mark.parametrize(
    ("bad_line", "reason"),
    [
        (b"not json", "not_json"),
        (b"[1, 2]", "not_object"),
        (b'{"text": 5}', "wrong_type"),
        (b'{"prompt": "a", "completion": "b"}', "missing_field"),
        (b"\xff\xfe", "not_utf8"),
        (b'{"text": NaN}', "not_json"),
    ],
)
def test_a_malformed_row_is_refused(
    recipe: Recipe, tmp_path: Path, bad_line: bytes, reason: str
) -> None:
    path = recipe.path("web")
    raw = path.read_bytes() + bad_line + b"\n"
    path.write_bytes(raw)
    recipe.doc["data"][0]["sha256"] = hashlib.sha256(raw).hexdigest()
    exc = _refusal(recipe.manifest(), tmp_path / "work")
    assert exc.code == "data_invalid"
    assert (exc.details["data_id"], exc.details["reason"]) == ("web", reason)
    assert exc.details["line"] == len(raw.splitlines())
    assert not (tmp_path / "work").exists()


def test_a_licence_outside_the_policy_is_refused(recipe: Recipe, tmp_path: Path) -> None:
    exc = _refusal(recipe.manifest(allowed_licenses=["cc-by-4.0"]), tmp_path / "work")
    assert exc.code == "data_policy_violation"
    assert exc.details["reason"] == "license"
    assert not (tmp_path / "work").exists()


# --- parameters and scale -------------------------------------------------------------------


def test_the_ngram_override_is_used_and_recorded(recipe: Recipe, tmp_path: Path) -> None:
    report = prepare_data(recipe.manifest(), tmp_path / "work", ngram=8)
    assert {d.ngram for d in report.datasets if d.role != "eval"} == {8}
    assert report.to_dict()["parameters"]["decontamination"]["n_override"] == 8


def test_the_demo_recipe_prepares_every_row_of_its_web_data(tmp_path: Path) -> None:
    # How fast is a bench's question (bench/ scripts), not a test's: no timed assertion here.
    demo = _write_recipe("demo", tmp_path / "data")
    report = prepare_data(demo.manifest(), tmp_path / "work")
    assert report.dataset("web").input_rows == 3000


# --- the tokenizer --------------------------------------------------------------------------


def _name_tokenizer(recipe: Recipe, raw: bytes, *, uri_form: str = "file") -> Path:
    """Write ``raw`` as the tokenizer file the manifest names, with its digest."""
    path = recipe.data_dir / "named-tokenizer.json"
    path.write_bytes(raw)
    uri = f"file://{path}" if uri_form == "file" else str(path)
    recipe.doc["model"]["tokenizer"] = {"uri": uri, "sha256": hashlib.sha256(raw).hexdigest()}
    return path


def _bpe(texts: list[str], vocab: int) -> bytes:
    return tokenizer_bytes(train_tokenizer(texts, vocab))


def _word_level(words: int, *, eos: bool) -> bytes:
    """A word-level tokenizer of ``words`` entries (and the end-of-text token if ``eos``)."""
    tokenizer = Tokenizer(models.WordLevel({f"w{i}": i for i in range(words)}, unk_token="w0"))
    if eos:
        tokenizer.add_special_tokens([EOS])
    return tokenizer_bytes(tokenizer)


@pytest.mark.parametrize("uri_form", ["file", "path"])
def test_the_tokenizer_the_manifest_names_is_the_one_training_tokenizes_with(
    recipe: Recipe, tmp_path: Path, uri_form: str
) -> None:
    trained = prepare_data(recipe.manifest(), tmp_path / "trained")
    # Trained on other text than the run's, with a smaller vocabulary: not what preparation
    # trains.
    named = _bpe([row["text"] for row in recipe.rows("arith-mid")], 400)
    vocab = vocab_size(Tokenizer.from_str(named.decode()))
    path = _name_tokenizer(recipe, named, uri_form=uri_form)
    workdir = tmp_path / "work"
    report = prepare_data(recipe.manifest(), workdir)

    digest = hashlib.sha256(named).hexdigest()
    assert report.tokenizer == TokenizerReport(source="manifest", sha256=digest, vocab=vocab)
    assert trained.tokenizer.source == "trained" and trained.tokenizer.sha256 != digest
    provenance = (prepared_dir(workdir) / PROVENANCE_FILE).read_bytes()
    assert json.loads(provenance)["tokenizer"] == {
        "source": "manifest",
        "sha256": digest,
        "vocab": vocab,
    }
    assert (prepared_dir(workdir) / TOKENIZER_FILE).read_bytes() == named
    # Everything else is prepared as without it.
    assert report.datasets == trained.datasets

    # What training packs from the prepared shards, through the tokenizer the engine loads,
    # are exactly the named tokenizer's tokens (and not those of the one trained without it).
    engine = prepared_tokenizer(workdir, provenance_digest(provenance), 512)
    assert engine is not None
    docs = read_documents(recipe.manifest().data_by_id()["web"], workdir)
    packed = pack(engine, docs, 64)
    assert torch.equal(packed, pack(Tokenizer.from_file(str(path)), docs, 64))
    other = prepared_tokenizer(tmp_path / "trained", None, 512)
    assert other is not None and not torch.equal(pack(other, docs, 64)[0], packed[0])


def test_a_named_tokenizer_with_another_sha256_refuses_before_any_data_is_read(
    recipe: Recipe, tmp_path: Path
) -> None:
    _name_tokenizer(recipe, _word_level(100, eos=True))
    recipe.doc["model"]["tokenizer"]["sha256"] = "0" * 64
    recipe.path("web").unlink()  # never reached: the tokenizer is checked first
    workdir = tmp_path / "work"

    exc = _refusal(recipe.manifest(), workdir)
    assert (exc.code, exc.details["reason"]) == ("tokenizer_invalid", "sha256_mismatch")
    assert exc.details["expected"] == "0" * 64
    assert not workdir.exists()


def test_a_named_tokenizer_changed_after_the_manifest_was_written_is_refused(
    recipe: Recipe, tmp_path: Path
) -> None:
    path = _name_tokenizer(recipe, _bpe(["one two three"] * 10, 300))
    manifest = recipe.manifest()
    path.write_bytes(_bpe(["four five six"] * 10, 300))
    exc = _refusal(manifest, tmp_path / "work")
    assert (exc.code, exc.details["reason"]) == ("tokenizer_invalid", "sha256_mismatch")
    assert not (tmp_path / "work").exists()


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (_word_level(600, eos=True), "vocab_too_large"),  # the tiny model has 512 rows
        (_word_level(100, eos=False), "no_eos"),
        (b'{"version": "1.0"}', "not_a_tokenizer"),
        (b"\xff\xfe", "not_a_tokenizer"),
    ],
    ids=["vocab-too-large", "no-eos", "not-a-tokenizer", "not-utf8"],
)
def test_a_named_tokenizer_that_does_not_fit_the_model_is_refused(
    recipe: Recipe, tmp_path: Path, raw: bytes, reason: str
) -> None:
    _name_tokenizer(recipe, raw)
    exc = _refusal(recipe.manifest(), tmp_path / "work")
    assert (exc.code, exc.details["reason"]) == ("tokenizer_invalid", reason)
    if reason == "vocab_too_large":
        assert (exc.details["vocab"], exc.details["model_vocab"]) == (601, 512)
    assert not (tmp_path / "work").exists()


def test_a_named_tokenizer_that_is_missing_or_not_a_file_is_refused(
    recipe: Recipe, tmp_path: Path
) -> None:
    path = _name_tokenizer(recipe, _word_level(100, eos=True))
    path.unlink()
    exc = _refusal(recipe.manifest(), tmp_path / "work")
    assert (exc.code, exc.details["reason"]) == ("tokenizer_invalid", "unreadable")
    recipe.doc["model"]["tokenizer"]["uri"] = "file:///dev/zero"
    exc = _refusal(recipe.manifest(), tmp_path / "work")
    assert (exc.code, exc.details["reason"]) == ("tokenizer_invalid", "not_regular_file")
    assert not (tmp_path / "work").exists()


def test_a_named_tokenizer_at_a_remote_uri_is_refused_as_unavailable(
    recipe: Recipe, tmp_path: Path
) -> None:
    recipe.doc["model"]["tokenizer"] = {"uri": "s3://bucket/tokenizer.json", "sha256": "0" * 64}
    exc = _refusal(recipe.manifest(), tmp_path / "work")
    assert (exc.code, exc.details["reason"]) == ("capability_unavailable", "uri_scheme")
    assert not (tmp_path / "work").exists()


def test_a_prepared_tokenizer_swapped_after_preparation_is_refused(
    recipe: Recipe, tmp_path: Path
) -> None:
    _name_tokenizer(recipe, _bpe([row["text"] for row in recipe.rows("arith-mid")], 400))
    workdir = tmp_path / "work"
    prepare_data(recipe.manifest(), workdir)
    bound = provenance_digest((prepared_dir(workdir) / PROVENANCE_FILE).read_bytes())
    prepared = prepared_dir(workdir) / TOKENIZER_FILE
    assert prepared_tokenizer(workdir, bound, 512) is not None

    # Another valid tokenizer in its place: refused whether or not a report is bound.
    prepared.write_bytes(_word_level(100, eos=True))
    for bound_digest in (bound, None):
        with pytest.raises(ItoError) as refused:
            prepared_tokenizer(workdir, bound_digest, 512)
        assert refused.value.code == "provenance_mismatch"
    prepared.unlink()
    with pytest.raises(ItoError) as refused:
        prepared_tokenizer(workdir, bound, 512)
    assert refused.value.code == "provenance_mismatch"


def test_without_a_preparation_there_is_no_prepared_tokenizer(tmp_path: Path) -> None:
    assert prepared_tokenizer(tmp_path / "work", None, 512) is None


def test_two_preparations_train_byte_identical_tokenizers(recipe: Recipe, tmp_path: Path) -> None:
    # A preparation repeated on another worker must reproduce the bound report, whose
    # tokenizer digest is the trained file's.
    first = prepare_data(recipe.manifest(), tmp_path / "one")
    second = prepare_data(recipe.manifest(), tmp_path / "two")
    assert first.tokenizer == second.tokenizer
    assert (prepared_dir(tmp_path / "one") / TOKENIZER_FILE).read_bytes() == (
        prepared_dir(tmp_path / "two") / TOKENIZER_FILE
    ).read_bytes()
