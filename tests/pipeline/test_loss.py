"""The chunked causal-LM loss (``ito.pipeline.loss``): the same loss and gradients as
``F.cross_entropy`` over the whole logits, and only one chunk's logits alive at a time."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaForCausalLM

from ito.core.model_sizes import SIZES
from ito.pipeline.loss import (
    IGNORE_INDEX,
    causal_lm_loss,
    chunked_cross_entropy,
    shift_labels,
    use_chunked_loss,
)
from ito.pipeline.model import llama_config
from tests.pipeline.distributed_checks import assert_check_passes

HIDDEN, VOCAB = 16, 50


def _inputs(tokens: int, seed: int = 0) -> tuple[torch.Tensor, nn.Linear, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    head = nn.Linear(HIDDEN, VOCAB, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(VOCAB, HIDDEN, generator=generator))
    hidden = torch.randn(tokens, HIDDEN, generator=generator, requires_grad=True)
    labels = torch.randint(0, VOCAB, (tokens,), generator=generator)
    return hidden, head, labels


def _loss_and_grads(
    hidden: torch.Tensor, head: nn.Linear, loss: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    loss.sum().backward()  # type: ignore[no-untyped-call]
    assert hidden.grad is not None and head.weight.grad is not None
    grads = hidden.grad.clone(), head.weight.grad.clone()
    hidden.grad, head.weight.grad = None, None
    return loss.detach(), *grads


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("tokens, chunk", [(37, 8), (64, 16), (5, 1024), (33, 1)])
def test_chunked_loss_and_gradients_equal_cross_entropy_over_the_whole_logits(
    tokens: int, chunk: int, reduction: str
) -> None:
    hidden, head, labels = _inputs(tokens)
    whole = _loss_and_grads(
        hidden, head, F.cross_entropy(head(hidden).float(), labels, reduction=reduction)
    )
    chunked = _loss_and_grads(
        hidden,
        head,
        chunked_cross_entropy(hidden, head, labels, reduction=reduction, chunk_tokens=chunk),  # type: ignore[arg-type]
    )
    for expected, got in zip(whole, chunked, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


def test_ignored_labels_count_neither_in_the_sum_nor_in_the_mean() -> None:
    hidden, head, labels = _inputs(40)
    labels[::3] = IGNORE_INDEX
    labels[16:24] = IGNORE_INDEX  # a whole chunk ignored
    whole = _loss_and_grads(hidden, head, F.cross_entropy(head(hidden), labels))
    chunked = _loss_and_grads(
        hidden, head, chunked_cross_entropy(hidden, head, labels, chunk_tokens=8)
    )
    for expected, got in zip(whole, chunked, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    per_token = chunked_cross_entropy(hidden, head, labels, reduction="none", chunk_tokens=8)
    assert torch.all(per_token[labels == IGNORE_INDEX] == 0)
    everything_ignored = torch.full_like(labels, IGNORE_INDEX)
    assert torch.isnan(chunked_cross_entropy(hidden, head, everything_ignored, chunk_tokens=8))


def test_causal_labels_are_shifted_and_the_last_position_predicts_nothing() -> None:
    labels = torch.tensor([[1, 2, 3], [4, 5, 6]])
    assert shift_labels(labels).tolist() == [[2, 3, IGNORE_INDEX], [5, 6, IGNORE_INDEX]]


def test_the_model_with_the_chunked_loss_matches_hugging_faces_loss_and_gradients() -> None:
    torch.manual_seed(0)
    reference = LlamaForCausalLM(llama_config(SIZES["tiny"]))
    chunked = copy.deepcopy(reference)
    use_chunked_loss(chunked)
    tokens = torch.randint(0, SIZES["tiny"].vocab, (3, 45))
    labels = tokens.clone()
    labels[0, :7] = IGNORE_INDEX  # a prompt not trained on
    expected = reference(input_ids=tokens, labels=labels).loss
    got = chunked(input_ids=tokens, labels=labels).loss
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    expected.backward()
    got.backward()
    for (name, p), q in zip(reference.named_parameters(), chunked.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None, name
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6, msg=name)
    # Without labels the model still answers its logits (evaluation).
    with torch.no_grad():
        torch.testing.assert_close(
            chunked(input_ids=tokens).logits, reference(input_ids=tokens).logits
        )
    per_token = causal_lm_loss(
        chunked.model(input_ids=tokens).last_hidden_state, chunked.lm_head, labels, reduction="none"
    )
    assert per_token.shape == tokens.shape and torch.all(per_token[:, -1] == 0)


@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.5])
def test_the_loss_at_a_temperature_is_that_of_the_tempered_distribution(
    temperature: float,
) -> None:
    """RLVR's log-probabilities at its sampling temperature: each position's loss is the
    cross-entropy of ``softmax(logits / temperature)``, gradients included, over several chunks;
    the logits the model returns are never scaled."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(llama_config(SIZES["tiny"]))
    use_chunked_loss(model, chunk_tokens=16)
    tokens = torch.randint(0, SIZES["tiny"].vocab, (2, 21))
    labels = tokens.clone()
    labels[:, :5] = IGNORE_INDEX
    logits = model(input_ids=tokens).logits.float()
    expected = F.cross_entropy(
        (logits / temperature).reshape(-1, logits.shape[-1]),
        shift_labels(labels).reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="none",
    ).view(labels.shape)
    got = model(input_ids=tokens, labels=labels, loss_reduction="none", temperature=temperature)
    torch.testing.assert_close(got.loss, expected, rtol=1e-5, atol=1e-6)
    (grad,) = torch.autograd.grad(expected.sum(), model.lm_head.weight)
    (got_grad,) = torch.autograd.grad(got.loss.sum(), model.lm_head.weight)
    torch.testing.assert_close(got_grad, grad, rtol=1e-5, atol=1e-6)
    if temperature != 1.0:  # the scaling is not a no-op
        plain = model(input_ids=tokens, labels=labels, loss_reduction="none").loss
        assert not torch.allclose(plain, got.loss)
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=tokens).logits.float(), logits)


@pytest.mark.parametrize("temperature", [0.0, -1.0])
def test_a_temperature_that_is_not_positive_is_refused(temperature: float) -> None:
    model = LlamaForCausalLM(llama_config(SIZES["tiny"]))
    use_chunked_loss(model)
    tokens = torch.randint(0, SIZES["tiny"].vocab, (1, 6))
    with pytest.raises(ValueError):
        model(input_ids=tokens, labels=tokens, temperature=temperature)


class _HeadAndLoss(nn.Module):
    """The output head and its loss under one root module (MemTracker refuses a module called
    twice at the top level, as the head is once per chunk)."""

    def __init__(self, vocab: int, chunk: int | None) -> None:
        super().__init__()
        self.head = nn.Linear(HIDDEN, vocab, bias=False)
        self.chunk = chunk

    def forward(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.chunk is None:
            return F.cross_entropy(self.head(hidden).float(), labels)
        return chunked_cross_entropy(hidden, self.head, labels, chunk_tokens=self.chunk)


def _peak_bytes(chunk: int | None, tokens: int, vocab: int) -> int:
    from torch.distributed._tools.mem_tracker import MemTracker

    module = _HeadAndLoss(vocab, chunk)
    hidden = torch.randn(tokens, HIDDEN, requires_grad=True)
    labels = torch.randint(0, vocab, (tokens,))
    tracker = MemTracker()
    tracker.track_external(module, hidden, labels)
    with tracker:
        module(hidden, labels).backward()
    peak = tracker.get_tracker_snapshot("peak")
    return sum(kinds["Total"] for kinds in peak.values())


def test_only_one_chunk_of_logits_lives_at_a_time() -> None:
    tokens, vocab, chunk = 4096, 2000, 256
    logits = 4 * chunk * vocab  # one chunk's fp32 logits
    whole = _peak_bytes(None, tokens, vocab)
    chunked = _peak_bytes(chunk, tokens, vocab)
    # Unchunked, three fp32 tensors of all the logits are alive together at the backward's
    # start (log-softmax, its gradient, the logits' gradient); chunked, three of one chunk.
    assert whole >= 3 * 4 * tokens * vocab
    assert chunked <= 3 * logits + 8 * tokens * HIDDEN + 8 * vocab * HIDDEN + (1 << 20)


DISTRIBUTED = {
    "dp_shard_2": ("dp_shard=2", "micro_batch=2", "activation_checkpointing=selective"),
    "tp_2": ("tp=2", "micro_batch=2"),
    "pp_2": ("pp=2", "micro_batch=1", "pp_microbatches=2"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(DISTRIBUTED))
def test_several_chunks_give_the_unchunked_loss_and_gradients_under_each_parallelism(
    name: str,
) -> None:
    """FSDP2 gathers and reduces the output head, tensor parallel gathers each chunk's logits
    and the pipeline's last stage applies the head outside its forward: with chunks smaller
    than a micro-batch (recomputed in the backward), loss and gradients stay Hugging Face's."""
    assert_check_passes("loss_check.py", *DISTRIBUTED[name])
