"""Log-probabilities of the sampled tokens, without ever holding full-vocabulary logits for a sequence.

The decoder runs once over the whole batch; the LM head then runs only at the positions whose next
token has loss_mask 1, a chunk at a time. With gradients on, each chunk is checkpointed: backward
recomputes its (chunk, V) logits instead of keeping them, so memory grows with the hidden size, not
with the vocabulary (152k for Qwen2.5: 8k positions of fp32 logits would be 4.9 GB).
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint


def causal_lm(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers causal LM under a peft wrapper (LoRA layers live inside it, so they still apply)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def right_pad(rows: list[list], dtype: torch.dtype) -> torch.Tensor:
    """Rows of different lengths -> (B, T), each row at the left, zeros after its end (T = longest row).
    How the update and the warm start lay out a batch: ids, attention, loss_mask, old log-probs alike."""
    out = torch.zeros(len(rows), max(len(r) for r in rows), dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=dtype)
    return out


def _chunk_stats(
    hidden: torch.Tensor, targets: torch.Tensor, head: torch.nn.Module, temperature: float
) -> torch.Tensor:
    """(n, H) hidden states and (n,) next tokens -> (n, 2): log-prob of the token, entropy (of logits / temperature)."""
    logits = head(hidden).float() / temperature  # (n, V)
    logp = torch.log_softmax(logits, dim=-1)
    token = logp.gather(-1, targets[:, None]).squeeze(-1)  # (n,)
    entropy = -(logp.exp() * logp).sum(-1)  # (n,)
    return torch.stack([token, entropy], dim=-1)


def token_logprobs_and_entropy(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    loss_mask: torch.Tensor,
    chunk: int = 256,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) log p(token_t | tokens_<t) and the entropy of that distribution where loss_mask is 1, else 0.

    p is softmax(logits / temperature): the distribution a sampler at that temperature draws from (the RL
    update scores the rollouts' own temperature, as TRL and verl do; supervised training scores 1).
    Differentiable when grad is enabled. Position 0 has no context and must have loss_mask 0."""
    assert input_ids.shape == attention_mask.shape == loss_mask.shape and input_ids.dim() == 2
    assert temperature > 0, f"log-probs need a temperature > 0, got {temperature}"
    assert not bool(loss_mask[:, 0].any()), "the first token has no context; its loss_mask must be 0"
    lm = causal_lm(model)
    # Positions count real tokens only, so left- and right-padded rows both get the positions they had
    # when they were sampled.
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, T)
    decoder = lm.get_decoder()
    hidden = decoder(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
    ).last_hidden_state  # (B, T, H)
    head = lm.get_output_embeddings()
    rows, cols = loss_mask.nonzero(as_tuple=True)  # (N,), (N,): the tokens to score
    pieces = []
    for start in range(0, rows.numel(), chunk):
        r, c = rows[start : start + chunk], cols[start : start + chunk]
        h = hidden[r, c - 1]  # (n, H): the state that predicts token c
        targets = input_ids[r, c]  # (n,)
        if torch.is_grad_enabled():
            pieces.append(checkpoint(_chunk_stats, h, targets, head, temperature, use_reentrant=False))
        else:
            pieces.append(_chunk_stats(h, targets, head, temperature))
    stats = torch.cat(pieces) if pieces else hidden.new_zeros(0, 2, dtype=torch.float32)  # (N, 2)
    zeros = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)  # (B, T)
    return zeros.index_put((rows, cols), stats[:, 0]), zeros.index_put((rows, cols), stats[:, 1])


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    loss_mask: torch.Tensor,
    chunk: int = 256,
    temperature: float = 1.0,
) -> torch.Tensor:
    """(B, T) log p(token_t | tokens_<t) where loss_mask is 1, 0 elsewhere (chunked LM head, differentiable);
    p = softmax(logits / temperature)."""
    return token_logprobs_and_entropy(model, input_ids, attention_mask, loss_mask, chunk, temperature)[0]
