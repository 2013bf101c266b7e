"""Chunked log-probs against hand numbers and the naive full-logits computation; sampling rules."""

import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from seal_mini.config import load_config
from seal_mini.engine.logprobs import token_logprobs, token_logprobs_and_entropy
from seal_mini.engine.policy import load_policy
from seal_mini.engine.sequences import sample_tokens


class _Decoder(torch.nn.Module):
    """Hidden state of each position = the embedding row of its token (no mixing)."""

    def __init__(self, table):
        super().__init__()
        self.table = torch.nn.Parameter(table)

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=None):
        return type("Out", (), {"last_hidden_state": self.table[input_ids]})()


class _HandLM(torch.nn.Module):
    """Vocab 3, hidden 3, identity LM head: the logits after token t are row t of `table`."""

    def __init__(self, table):
        super().__init__()
        self.decoder = _Decoder(table)
        self.head = torch.nn.Linear(3, 3, bias=False)
        with torch.no_grad():
            self.head.weight.copy_(torch.eye(3))

    def get_decoder(self):
        return self.decoder

    def get_output_embeddings(self):
        return self.head


def test_log_probs_and_entropy_by_hand():
    ln3 = math.log(3.0)
    # after token 0 the logits are [0, ln 3, 0]: probabilities [1/5, 3/5, 1/5]
    # after token 1 the logits are [0, 0, 0]:    probabilities [1/3, 1/3, 1/3]
    model = _HandLM(torch.tensor([[0.0, ln3, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    ids = torch.tensor([[0, 1, 2], [1, 0, 0]])
    loss_mask = torch.tensor([[0, 1, 1], [0, 0, 1]])
    logp, entropy = token_logprobs_and_entropy(model, ids, torch.ones_like(ids), loss_mask, chunk=1)
    expected = torch.tensor([[0.0, math.log(3 / 5), math.log(1 / 3)], [0.0, 0.0, math.log(1 / 5)]])
    assert torch.allclose(logp, expected, atol=1e-6)
    h_after_0 = -(2 * 0.2 * math.log(0.2) + 0.6 * math.log(0.6))  # 0.9503
    expected_entropy = torch.tensor([[0.0, h_after_0, math.log(3)], [0.0, 0.0, h_after_0]])
    assert torch.allclose(entropy, expected_entropy, atol=1e-6)


def test_log_probs_of_a_tempered_distribution_by_hand():
    # after token 0 the logits are [0, ln 9, 0]; at temperature 2 they are [0, ln 3, 0]: [1/5, 3/5, 1/5]
    model = _HandLM(torch.tensor([[0.0, math.log(9.0), 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    ids, loss_mask = torch.tensor([[0, 1, 2]]), torch.tensor([[0, 1, 1]])
    logp = token_logprobs(model, ids, torch.ones_like(ids), loss_mask, chunk=2, temperature=2.0)
    assert torch.allclose(logp, torch.tensor([[0.0, math.log(3 / 5), math.log(1 / 3)]]), atol=1e-6)
    plain = token_logprobs(model, ids, torch.ones_like(ids), loss_mask)
    assert plain[0, 1].item() == pytest.approx(math.log(9 / 11), abs=1e-6)


def test_first_position_cannot_be_scored():
    model = _HandLM(torch.zeros(3, 3))
    ids = torch.tensor([[0, 1]])
    with pytest.raises(AssertionError, match="first token"):
        token_logprobs(model, ids, torch.ones_like(ids), torch.tensor([[1, 1]]))


@pytest.fixture(scope="module")
def policy():
    policy = load_policy(load_config(None, ["model.name=tiny-random", "device=cpu"]))
    with torch.no_grad():  # a non-zero adapter, so its gradients are not trivially zero
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    return policy


def _naive(model, ids, attention, loss_mask):
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=attention, position_ids=positions).logits.float()  # (B, T, V)
    logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)  # (B, T-1)
    return torch.cat([torch.zeros_like(logp[:, :1]), logp], 1) * loss_mask


def test_chunked_log_probs_and_gradients_match_full_logits(policy):
    torch.manual_seed(0)
    ids = torch.randint(0, 4000, (3, 40))
    attention = torch.ones_like(ids)
    attention[1, 30:] = 0  # right padding
    attention[2, 25:] = 0
    loss_mask = (torch.rand(3, 40) < 0.5).long() * attention
    loss_mask[:, 0] = 0
    model = policy.model
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]

    reference = _naive(model, ids, attention, loss_mask)
    reference.sum().backward()
    reference_grads = [p.grad.clone() for p in params]
    for chunk in (1, 7, 10_000):
        model.zero_grad()
        logp = token_logprobs(model, ids, attention, loss_mask, chunk=chunk)
        assert torch.allclose(logp, reference, atol=1e-5), chunk
        assert torch.all(logp[loss_mask == 0] == 0)
        logp.sum().backward()
        for got, want in zip((p.grad for p in params), reference_grads, strict=True):
            assert torch.allclose(got, want, atol=1e-5, rtol=1e-4), chunk
    model.zero_grad()
    model.eval()


def test_greedy_and_top_p_sampling():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.2, 0.7]]))
    assert sample_tokens(logits, 0.0).tolist() == [0, 2]
    # top_p 0.6 keeps token 0 (mass before it 0) and token 1 (mass before it 0.5 < 0.6), never token 2
    draws = torch.stack(
        [sample_tokens(logits[:1], 1.0, 0.6, torch.Generator().manual_seed(s)) for s in range(400)]
    ).flatten()
    assert set(draws.tolist()) == {0, 1}
    assert abs((draws == 0).float().mean().item() - 0.5 / 0.8) < 0.08  # renormalised: 0.625 vs 0.375


def test_sampling_is_reproducible_from_the_generator():
    logits = torch.randn(4, 50)
    a = sample_tokens(logits, 1.0, 1.0, torch.Generator().manual_seed(3))
    b = sample_tokens(logits, 1.0, 1.0, torch.Generator().manual_seed(3))
    c = [sample_tokens(logits, 1.0, 1.0, torch.Generator().manual_seed(s)) for s in range(4, 10)]
    assert torch.equal(a, b) and any(not torch.equal(a, x) for x in c)


def test_sampling_follows_the_distribution_and_skips_zero_mass_tokens():
    probs = torch.tensor([0.0, 0.1, 0.0, 0.6, 0.3, 0.0])
    logits = torch.log(probs).expand(20000, -1)  # (R, V): 20000 independent draws in one call
    draws = sample_tokens(logits, 1.0, 1.0, torch.Generator().manual_seed(0))
    counts = torch.bincount(draws, minlength=6).float() / len(draws)
    assert counts[[0, 2, 5]].sum() == 0  # zero-mass tokens, first and last included, are never drawn
    assert torch.allclose(counts, probs, atol=0.015), counts.tolist()


def test_right_pad_lays_rows_out_left_with_zeros_after_by_hand():
    from seal_mini.engine.logprobs import right_pad

    out = right_pad([[5, 6, 7], [8]], torch.long)
    assert out.tolist() == [[5, 6, 7], [8, 0, 0]] and out.dtype == torch.long
    assert right_pad([[0.5], [1.0, -2.0]], torch.float32).tolist() == [[0.5, 0.0], [1.0, -2.0]]
