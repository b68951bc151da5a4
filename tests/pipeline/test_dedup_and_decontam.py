"""The pure helpers of data preparation: normalisation, row text, shingles, exact and near
duplicates, and n-gram decontamination including whole-item matching of short eval items."""

from __future__ import annotations

import random

import pytest

from ito.data.decontam import EvalIndex, match_tokens, ngrams
from ito.data.rows import Row, row_from_mapping
from ito.pipeline.data_prep import normalise_text
from ito.pipeline.dedup import (
    NearDedup,
    exact_duplicates,
    exact_key,
    jaccard,
    near_duplicates,
    word_shingles,
)

LONG = (
    "the scheduler reads every token of the long sentences and the optimizer stores "
    "the gradient in many shards while a careful reader checks its own notes again"
)


# --- normalisation --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("  a  b\t\tc\n\nd  ", "a b c d"),
        ("Ｆｕｌｌ\u00a0width", "Full width"),
        ("e\u0301", "é"),
        ("ﬁne ①", "fine 1"),
        ("\u2003\u3000", ""),
    ],
)
def test_text_is_nfkc_normalised_with_whitespace_collapsed(raw: str, expected: str) -> None:
    assert normalise_text(raw) == expected


def test_a_prompt_keeps_one_trailing_space_and_an_answer_one_leading_space() -> None:
    assert normalise_text(" 1+2=\t", keep_end=True) == "1+2= "
    assert normalise_text("  ３ ", keep_start=True) == " 3"
    assert normalise_text("A:", keep_end=True) == "A:"
    assert normalise_text("\u3000", keep_start=True) == " "


def _row(role: str, **fields: object) -> Row:
    return row_from_mapping(fields, role, data_id="d", where={"line": 1})


def test_a_row_keeps_only_its_roles_fields_normalised() -> None:
    row = _row("pretrain", text=" a  b ", url=" https://x/ ", n=3).normalised()
    assert row.to_dict() == {"text": "a b"}
    dpo = _row("dpo", prompt=" 1+2=\t", chosen="３ ", rejected="4", weight=1.5).normalised()
    assert dpo.to_dict() == {"prompt": "1+2= ", "chosen": "3", "rejected": "4"}


def test_row_text_joins_each_prompt_to_its_answer_as_the_data_has_it() -> None:
    assert _row("pretrain", text="hello world", title="t").text == "hello world"
    assert _row("sft", completion="3", prompt="1+2=").text == "1+2=3"
    assert _row("dpo", rejected="4", prompt="1+2=", chosen="3").text == "1+2=3\n1+2=4"
    assert _row("rlvr", answer=" 3", prompt="Q: 1+2?\nA:", extra="z").text == "Q: 1+2?\nA: 3"
    assert _row("eval", prompt="1+2=", answer="3").text == "1+2=3"
    assert _row("eval", text="an eval passage").text == "an eval passage"
    assert _row("sft", prompt="1+2=", completion=" ").is_blank


# --- duplicates -----------------------------------------------------------------------------


def test_exact_key_ignores_key_order_and_exact_duplicates_keep_the_first() -> None:
    assert exact_key({"a": 1, "b": "x"}) == exact_key({"b": "x", "a": 1})
    rows: list[dict[str, object]] = [
        {"text": "a"},
        {"text": "b"},
        {"text": "a"},
        {"text": "a", "s": 1},
        {"text": "b"},
    ]
    assert exact_duplicates(rows) == [2, 4]


def test_word_shingles_are_casefolded_windows_and_short_texts_are_one_shingle() -> None:
    assert word_shingles("A b C d", 3) == frozenset({"a b c", "b c d"})
    assert word_shingles("1+2= 3", 3) == frozenset({"1+2= 3"})
    assert word_shingles("", 3) == frozenset()
    assert jaccard(frozenset({"a", "b"}), frozenset({"b", "c"})) == pytest.approx(1 / 3)


def test_near_duplicates_drop_later_copies_and_keep_distinct_texts() -> None:
    words = [f"{word}{i}" for i, word in enumerate(LONG.split() * 3)]
    changed = list(words)
    changed[10] = "CHANGED"
    texts = [
        " ".join(words),
        "something else entirely here",
        " ".join(changed),
        " ".join(reversed(words)),
        " ".join(words).upper(),
    ]
    assert near_duplicates(texts, NearDedup()) == [2, 4]
    assert near_duplicates(texts, NearDedup(threshold=1.0)) == [4]
    assert near_duplicates([], NearDedup()) == []


def test_short_and_empty_texts_are_one_shingle_or_none() -> None:
    texts = ["", "", "a b", "A  b", "a b c", "x a b"]
    # Two empty shingle sets are identical (Jaccard 1); "a b" is one shingle, "x a b" another.
    assert near_duplicates(texts, NearDedup()) == [1, 3]


def test_near_duplicates_are_those_an_exact_pairwise_search_finds() -> None:
    rng = random.Random(7)
    vocab = [f"w{i}" for i in range(400)]
    texts: list[str] = []
    for _ in range(60):
        base = [rng.choice(vocab) for _ in range(rng.randint(80, 160))]
        texts.append(" ".join(base))
        for _ in range(rng.randint(0, 2)):
            copy = list(base)
            for pos in rng.sample(range(len(copy)), rng.randint(0, 1)):
                copy[pos] = rng.choice(vocab)
            texts.append(" ".join(copy))
    rng.shuffle(texts)
    settings = NearDedup(threshold=0.8)
    shingles = [word_shingles(t, settings.shingle_words) for t in texts]
    expected: list[int] = []
    kept: list[int] = []
    for i, s in enumerate(shingles):
        if any(jaccard(s, shingles[j]) >= settings.threshold for j in kept):
            expected.append(i)
        else:
            kept.append(i)
    # Pairs well above the threshold are proposed with probability ≈ 1 and then checked exactly,
    # so the sketch finds every one of them and nothing else.
    pairs = [jaccard(s, shingles[j]) for i, s in enumerate(shingles) for j in range(i)]
    assert not any(0.75 < p < 0.85 for p in pairs)  # no pair close to the threshold
    assert len(expected) > 20
    assert near_duplicates(texts, settings) == expected


@pytest.mark.parametrize(
    "kwargs",
    [{"threshold": 0.0}, {"threshold": 1.5}, {"shingle_words": 0}, {"num_perm": 1}, {"seed": -1}],
)
def test_near_dedup_settings_are_checked(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        NearDedup(**kwargs)  # type: ignore[arg-type]


# --- decontamination ------------------------------------------------------------------------


def test_ngrams_are_contiguous_windows() -> None:
    assert ngrams(["a", "b", "c", "d"], 3) == {("a", "b", "c"), ("b", "c", "d")}
    assert ngrams(["a", "b"], 3) == set()
    assert match_tokens(" The  CAT ") == ["the", "cat"]


def test_a_long_eval_item_matches_on_a_shared_ngram_only() -> None:
    index = EvalIndex([LONG], 13)
    words = LONG.split()
    shares_13 = "unrelated prefix " + " ".join(words[5:18]) + " unrelated suffix"
    shares_12 = "unrelated prefix " + " ".join(words[5:17]) + " unrelated suffix"
    assert index.matches(shares_13) == {0}
    assert index.matches(shares_12) == set()
    assert index.matches(" ".join(words[5:18]).upper()) == {0}


def test_a_short_eval_item_matches_when_contained_whole() -> None:
    index = EvalIndex(["503+511= 1014", "7+8= 15", LONG], 13)
    assert index.matches("we saw 503+511= 1014 here") == {0}
    assert index.matches("503+511= 1015") == set()
    assert index.matches("1014 503+511=") == set()
    assert index.matches("7+8= 15 and 503+511= 1014") == {0, 1}
    assert index.matches("") == set()


def test_spacing_around_punctuation_never_hides_an_eval_item() -> None:
    # An eval row's text joins its prompt to its answer as they are ("503+511=1014").
    assert match_tokens("503+511=1014") == ["503", "+", "511", "=", "1014"]
    index = EvalIndex(["503+511=1014"], 13)
    for text in ("so 503+511= 1014 .", "503 + 511 = 1014", "503+511=1014!"):
        assert index.matches(text) == {0}, text
    assert index.matches("pages 503, 511, 1014") == set()


def test_an_index_without_items_matches_nothing() -> None:
    index = EvalIndex([], 13)
    assert index.size == 0
    assert index.matches(LONG) == set()
    with pytest.raises(ValueError):
        EvalIndex([], 0)


@pytest.mark.parametrize("n", [1, 2, 3, 13])
def test_matches_are_those_a_plain_search_of_every_window_finds(n: int) -> None:
    # A small alphabet with punctuation, so windows repeat, items share n-grams and short items
    # of every length occur; the index's hashing must change nothing the search finds.
    rng = random.Random(n)
    alphabet = ["a", "b", "C", "d", "+", "=", "1", "2", "x.y"]

    def text(most: int) -> str:
        return " ".join(rng.choice(alphabet) for _ in range(rng.randint(0, most)))

    for _ in range(40):
        items = [text(20) for _ in range(rng.randint(0, 6))]
        index = EvalIndex(items, n)
        patterns: list[tuple[tuple[str, ...], int]] = []
        for i, item in enumerate(items):
            tokens = match_tokens(item)
            grams = (
                ngrams(tokens, n) if len(tokens) >= n else ({tuple(tokens)} if tokens else set())
            )
            patterns.extend((gram, i) for gram in grams)
        for _ in range(10):
            tokens = match_tokens(text(60))
            windows = {
                tuple(tokens[s : s + len(g)]) for g, _ in patterns for s in range(len(tokens))
            }
            expected = {i for gram, i in patterns if gram in windows}
            assert index.matches(" ".join(tokens)) == expected
