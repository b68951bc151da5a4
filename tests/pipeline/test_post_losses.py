"""The post-training losses against values computed by hand on tiny inputs."""

from __future__ import annotations

import math

import pytest
import torch

from ito.pipeline.loss import IGNORE_INDEX, causal_lm_loss
from ito.pipeline.post_losses import (
    dapo_policy_loss,
    dpo_loss,
    group_advantages,
    informative_groups,
    prompt_completion,
)


def test_an_sft_example_labels_the_completion_and_its_end_only() -> None:
    ids, labels = prompt_completion([5, 6, 7], [8, 9], eos=0, max_len=10)
    assert ids == [5, 6, 7, 8, 9, 0]
    assert labels == [IGNORE_INDEX] * 3 + [8, 9, 0]
    # Too long: the prompt gives way from its start, the completion is kept whole.
    assert prompt_completion([5, 6, 7], [8, 9], eos=0, max_len=4) == (
        [7, 8, 9, 0],
        [IGNORE_INDEX, 8, 9, 0],
    )
    with pytest.raises(ValueError):
        prompt_completion([5], [8, 9, 10], eos=0, max_len=3)


def test_the_sft_loss_is_the_mean_over_completion_tokens_only() -> None:
    torch.manual_seed(0)
    ids, labels = prompt_completion([1, 2, 3], [4, 5], eos=0, max_len=8)
    logits = torch.randn(1, len(ids), 6)
    loss = causal_lm_loss(logits, lambda h: h, torch.tensor([labels]))
    # By hand: position t predicts labels[t + 1]; only 4, 5 and the end are predicted.
    logp = torch.log_softmax(logits[0], dim=-1)
    expected = -(logp[2, 4] + logp[3, 5] + logp[4, 0]) / 3
    assert float(loss) == pytest.approx(float(expected), rel=1e-6)
    # The prompt's own next-token predictions do not count: changing them changes nothing.
    logits[0, :2] += 5.0
    again = causal_lm_loss(logits, lambda h: h, torch.tensor([labels]))
    assert float(again) == pytest.approx(float(loss), rel=1e-6)


def test_the_dpo_loss_by_hand() -> None:
    loss = dpo_loss(
        torch.tensor([-1.0]), torch.tensor([-2.0]), torch.tensor([-1.5]), torch.tensor([-1.5]), 0.1
    )
    # β((−1 + 1.5) − (−2 + 1.5)) = 0.1; −log σ(0.1) = log(1 + e^−0.1).
    assert float(loss[0]) == pytest.approx(math.log(1 + math.exp(-0.1)), rel=1e-6)
    # Policy equal to the reference: log 2, whatever β.
    same = dpo_loss(torch.tensor([-3.0]), torch.tensor([-1.0]), torch.tensor([-3.0]),
                    torch.tensor([-1.0]), 5.0)  # fmt: skip
    assert float(same[0]) == pytest.approx(math.log(2), rel=1e-6)


def test_rpo_adds_the_chosen_completions_per_token_likelihood_to_dpo() -> None:
    chosen = torch.tensor([-1.0, -3.0], requires_grad=True)
    args = (chosen, torch.tensor([-2.0, -1.0]), torch.tensor([-1.5, -3.0]),
            torch.tensor([-1.5, -1.0]))  # fmt: skip
    plain = dpo_loss(*args, 0.1)
    rpo = dpo_loss(*args, 0.1, rpo_alpha=0.5, chosen_tokens=torch.tensor([2, 3]))
    # 0.5 × (1 / 2) and 0.5 × (3 / 3) on top of each pair's DPO loss.
    assert rpo.tolist() == pytest.approx([plain[0].item() + 0.25, plain[1].item() + 0.5])
    # The second pair's policy equals its reference (DPO: log 2); RPO still pulls its chosen
    # completion up: d/dπ_c of 0.5·(−π_c/3) is −1/6 beside DPO's −β/2.
    torch.autograd.backward(rpo[1])
    assert chosen.grad is not None
    assert float(chosen.grad[1]) == pytest.approx(-0.1 / 2 - 0.5 / 3, rel=1e-6)


@pytest.mark.parametrize(("clip_high", "gradient"), [(0.28, -1.25), (0.2, 0.0)])
def test_clip_higher_keeps_the_gradient_of_a_ratio_the_symmetric_clip_cuts(
    clip_high: float, gradient: float
) -> None:
    old = torch.tensor([[math.log(0.4)]])
    logps = (old + math.log(1.25)).clone().requires_grad_(True)  # ratio 1.25, advantage 1
    loss = dapo_policy_loss(
        logps,
        old,
        torch.tensor([1.0]),
        torch.ones(1, 1),
        clip_low=0.2,
        clip_high=clip_high,
        normaliser=1.0,
    )
    torch.autograd.backward(loss)
    assert logps.grad is not None
    # −min(r·A, clip(r)·A): unclipped under 1.28, the gradient is −r; clipped at 1.2, none.
    assert float(logps.grad[0, 0]) == pytest.approx(gradient, abs=1e-6)


def _two_sequences() -> tuple[torch.Tensor, torch.Tensor]:
    mask = torch.zeros(2, 9)
    mask[0, 0] = 1.0  # a sequence of 1 token
    mask[1, :] = 1.0  # and one of 9
    return torch.zeros(2, 9, requires_grad=True), mask


def test_token_level_aggregation_weighs_every_token_the_same() -> None:
    logps, mask = _two_sequences()
    loss = dapo_policy_loss(
        logps, logps.detach(), torch.ones(2), mask, clip_low=0.2, clip_high=0.28, normaliser=10
    )
    torch.autograd.backward(loss)
    assert logps.grad is not None
    assert float(loss.detach()) == pytest.approx(-1.0)
    # Each of the 10 tokens weighs 1/10, whichever sequence it is in.
    assert torch.allclose(logps.grad[mask.bool()], torch.full((10,), -0.1))


def test_sample_level_aggregation_weighs_every_sequence_the_same() -> None:
    logps, mask = _two_sequences()
    loss = dapo_policy_loss(
        logps, logps.detach(), torch.ones(2), mask, clip_low=0.2, clip_high=0.28, normaliser=None
    )
    torch.autograd.backward(loss)
    assert logps.grad is not None
    # GRPO's mean of means: the lone token weighs 1/2, each of the nine 1/18.
    assert float(logps.grad[0, 0]) == pytest.approx(-0.5)
    assert torch.allclose(logps.grad[1], torch.full((9,), -1 / 18))


def test_one_or_four_accumulated_micro_batches_give_the_same_gradient() -> None:
    torch.manual_seed(1)
    old = torch.randn(8, 12) - 2.0
    start = old + 0.1 * torch.randn(8, 12)
    advantages = torch.randn(8)
    lengths = torch.randint(1, 13, (8,))
    mask = (torch.arange(12)[None, :] < lengths[:, None]).float()
    total = float(mask.sum())

    def gradient(parts: int) -> torch.Tensor:
        logps = start.clone().requires_grad_(True)
        for rows in torch.arange(8).chunk(parts):
            loss = dapo_policy_loss(
                logps[rows],
                old[rows],
                advantages[rows],
                mask[rows],
                clip_low=0.2,
                clip_high=0.28,
                normaliser=total,
            )
            torch.autograd.backward(loss)
        assert logps.grad is not None
        return logps.grad

    assert torch.allclose(gradient(1), gradient(4), atol=1e-7)


def test_group_advantages_and_the_groups_dynamic_sampling_keeps() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.5])
    advantages = group_advantages(rewards, 4)
    # Group 1: mean 0.5, unbiased std √(1/3): ±0.5 / 0.57735 = ±0.866.
    assert torch.allclose(advantages[:4], torch.tensor([0.866, -0.866, -0.866, 0.866]), atol=1e-3)
    # All-equal group: 0 everywhere (no gradient), and dynamic sampling drops it.
    assert torch.equal(advantages[4:8], torch.zeros(4))
    assert informative_groups(rewards, 4).tolist() == [True, False, True]
