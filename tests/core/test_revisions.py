"""``model.revision`` parsed (``ito.core.revisions``): the three forms, the refusals of what
cannot name weights, the architecture check of a Hugging Face ``config.json`` and the digest
that names one committed checkpoint."""

from __future__ import annotations

import pytest

from ito.core.errors import ItoError
from ito.core.model_sizes import SIZES
from ito.core.revisions import (
    HfRevision,
    RunRevision,
    architecture_mismatch,
    checkpoint_digest,
    parse_revision,
    storage_parts,
)

SHA = "0123456789abcdef" * 4


def test_the_three_forms_parse() -> None:
    assert parse_revision("scratch") is None
    assert parse_revision("run:run_abc2@120") == RunRevision("run_abc2", 120)
    assert parse_revision(f"hf:/models/tiny@sha256:{SHA}") == HfRevision("/models/tiny", SHA)
    # The last "@sha256:" separates: a directory may hold an "@".
    assert parse_revision(f"hf:/m/a@b@sha256:{SHA}") == HfRevision("/m/a@b", SHA)


@pytest.mark.parametrize(
    "revision",
    [
        f"hf:/models/../etc@sha256:{SHA}",
        f"hf:/models/tiny/@sha256:{SHA}",
        f"hf:/@sha256:{SHA}",
        "run:run_abc@99999999999",
        "run:run_abc",
        f"sha256:{SHA}",
        f"hf:models@sha256:{SHA}",
    ],
)
def test_what_names_no_weights_is_unresolvable_at_the_revision(revision: str) -> None:
    with pytest.raises(ItoError) as refused:
        parse_revision(revision)
    assert refused.value.code == "revision_unresolvable"
    assert refused.value.details["path"] == "$.model.revision"
    assert refused.value.details["reason"] == "malformed"


def test_the_export_config_of_a_size_matches_it_and_no_other() -> None:
    tiny = SIZES["tiny"]
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": tiny.vocab,
        "hidden_size": tiny.hidden,
        "intermediate_size": tiny.ffn,
        "num_hidden_layers": tiny.layers,
        "num_attention_heads": tiny.heads,
        "num_key_value_heads": tiny.kv_heads,
        "tie_word_embeddings": False,
    }
    assert architecture_mismatch(config, SIZES["tiny"]) is None
    assert architecture_mismatch(config, SIZES["150m"]) == "vocab_size"
    assert architecture_mismatch(config | {"num_hidden_layers": 3}, SIZES["tiny"]) == (
        "num_hidden_layers"
    )
    assert architecture_mismatch(config | {"architectures": ["GPT2LMHeadModel"]}, SIZES["tiny"])
    assert architecture_mismatch(config | {"tie_word_embeddings": True}, SIZES["tiny"])


def test_the_checkpoint_digest_depends_on_both_files_and_where_they_split() -> None:
    base = checkpoint_digest(b"meta", b"commit")
    assert base == checkpoint_digest(b"meta", b"commit")
    assert base != checkpoint_digest(b"meta", b"commit2")
    assert base != checkpoint_digest(b"meta2", b"commit")
    assert base != checkpoint_digest(b"metac", b"ommit")


def test_a_directory_is_placed_by_its_names_strictly_below_the_booking_storage() -> None:
    assert storage_parts("/srv/st/models/t", "file:///srv/st") == ("models", "t")
    assert storage_parts("/srv/my st/m", "file:///srv/my%20st") == ("m",)
    for path, root in (
        ("/srv/st", "file:///srv/st"),
        ("/srv/stx/m", "file:///srv/st"),
        ("/etc/m", "file:///srv/st"),
        ("/srv/st/m", None),
    ):
        with pytest.raises(ItoError) as refused:
            storage_parts(path, root)
        assert refused.value.details["reason"] == "outside_booking_storage"
