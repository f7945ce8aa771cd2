"""A real, trainable policy small enough for CPU: a character tokenizer with a ChatML template, and a GPT of about
0.8 M parameters (PyTorch). The tiny vLLM server (`tiny_vllm`) samples from it; the learning demo trains it.

It owns the tokenizer, the template, the network, sampling and the log-probabilities the trainer recomputes; it must
not know HTTP. Sampling and training share one `forward`, so a completion's logprob computed token by token while
sampling and the one recomputed on the whole padded row agree to float32 rounding (the demo's mismatch check).
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "PAD_ID",
    "SPECIAL_IDS",
    "CharTokenizer",
    "PolicyConfig",
    "Request",
    "Sampled",
    "TinyGPT",
    "greedy_batch",
    "load_policy",
    "parameters",
    "policy_bytes",
    "sample",
    "sample_batch",
    "token_logprobs",
]

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
_SPECIALS = ("<pad>", "<|im_start|>", "<|im_end|>")
SPECIAL_IDS = len(_SPECIALS)
"""Ids below this are special tokens."""
_CHARS = "\n" + "".join(chr(c) for c in range(32, 127))


class CharTokenizer:
    """One id per printable ASCII character (and newline); `<|im_start|>` is 1, `<|im_end|>` (EOS) 2. Other
    characters encode as `?`: the task's texts are ASCII, and the template must never fail on an agent's text."""

    def __init__(self) -> None:
        self.vocab: tuple[str, ...] = _SPECIALS + tuple(_CHARS)
        self._ids = {c: i for i, c in enumerate(self.vocab) if i >= len(_SPECIALS)}
        self._unknown = self._ids["?"]

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        ids, unknown = self._ids, self._unknown
        return [ids.get(c, unknown) for c in text]

    def token_str(self, token_id: int) -> str:
        return self.vocab[token_id] if 0 <= token_id < len(self.vocab) else ""

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        first = len(_SPECIALS) if skip_special_tokens else 0
        return "".join(self.vocab[i] for i in ids if first <= i < len(self.vocab))

    def chat_prompt_ids(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
    ) -> list[int]:
        """ChatML: `<|im_start|>role\\ncontent<|im_end|>\\n` per message, then `<|im_start|>assistant\\n`."""
        ids: list[int] = []
        for m in messages:
            content = m.get("content")
            if isinstance(content, list):  # text parts
                content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            ids += [BOS_ID, *self.encode(f"{m.get('role', 'user')}\n{content or ''}"), EOS_ID]
            ids += self.encode("\n")
        if add_generation_prompt:
            ids += [BOS_ID, *self.encode("assistant\n")]
        return ids


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    vocab_size: int = len(_SPECIALS) + len(_CHARS)
    d_model: int = 128
    layers: int = 4
    heads: int = 4
    max_len: int = 64
    """Positions the model knows: prompt and completion together."""


class _Block(nn.Module):  # type: ignore[misc]
    def __init__(self, cfg: PolicyConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.GELU(), nn.Linear(4 * cfg.d_model, cfg.d_model)
        )

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        if past is not None:
            k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x)), (k, v)


class TinyGPT(nn.Module):  # type: ignore[misc]
    """A pre-LayerNorm decoder: learned positions, `layers` blocks, tied input and output embeddings."""

    def __init__(self, cfg: PolicyConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg or PolicyConfig()
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.max_len, cfg.d_model)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.layers))
        self.ln = nn.LayerNorm(cfg.d_model)
        self.apply(_init)

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, V) for ids (B, T); `attention_mask` (B, T) marks real tokens (left padding allowed).
        Positions count real tokens only (VERL's `position_ids`), so padding changes nothing but float rounding."""
        return self.step(ids, attention_mask)[0]

    def step(
        self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None, past: Past | None = None
    ) -> tuple[torch.Tensor, Past]:
        """`forward` that also returns each block's keys and values, and takes those of the tokens before `ids`
        (`past`, with `attention_mask` then covering them too): the cache that sampling extends token by token."""
        if attention_mask is None:
            attention_mask = torch.ones_like(ids)
        t = ids.shape[1]
        total = attention_mask.shape[1]
        positions = ((attention_mask.cumsum(-1) - 1).clamp(min=0))[:, total - t :]
        # Query i (at absolute position total - t + i) sees keys up to itself; a padding query sees itself only,
        # so that no row of the softmax is empty.
        rows = torch.arange(total - t, total, device=ids.device)[:, None]
        cols = torch.arange(total, device=ids.device)[None, :]
        keys = attention_mask.bool()[:, None, None, :] | (cols == rows)
        mask = (cols <= rows) & keys
        x = self.tok(ids) + self.pos(positions)
        cache: Past = []
        for i, block in enumerate(self.blocks):
            x, kv = block(x, mask, None if past is None else past[i])
            cache.append(kv)
        return self.ln(x) @ self.tok.weight.T, cache


Past = list[tuple[torch.Tensor, torch.Tensor]]


def _init(module: nn.Module) -> None:
    if isinstance(module, nn.Linear | nn.Embedding):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def token_logprobs(
    model: TinyGPT, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, temperature: float = 1.0
) -> torch.Tensor:
    """(B, T-1): the log-probability of each token given the ones before it, at `temperature`."""
    logits = model(input_ids, attention_mask)[:, :-1].float() / temperature
    return torch.gather(F.log_softmax(logits, -1), -1, input_ids[:, 1:, None]).squeeze(-1)


@dataclass(frozen=True, slots=True)
class Sampled:
    token_ids: list[int]
    logprobs: list[float]
    """Of each sampled token under the model's own distribution (vLLM's default `raw_logprobs`: before
    temperature), which is what the trainer recomputes."""
    finish_reason: str
    """`stop` (EOS), `length` (max_tokens or the model's context)."""
    alternates: list[list[tuple[int, float]]]
    """The `top_k` most likely tokens at each step, with their logprobs (empty lists when top_k is 0)."""


@dataclass(frozen=True, slots=True)
class Request:
    """One completion to sample (`sample_batch` takes many)."""

    prompt_ids: Sequence[int]
    max_tokens: int
    temperature: float = 1.0
    top_k: int = 0
    generator: torch.Generator | None = None


def sample(
    model: TinyGPT,
    prompt_ids: Sequence[int],
    max_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    generator: torch.Generator | None = None,
) -> Sampled:
    """One completion; greedy at temperature 0."""
    return sample_batch(model, [Request(prompt_ids, max_tokens, temperature, top_k, generator)])[0]


def sample_batch(model: TinyGPT, requests: Sequence[Request]) -> list[Sampled]:
    """Completions of many prompts at once, one forward of the whole (left-padded) batch per token: what a
    server does with the requests that arrive together. Each row draws from its own generator, so a seeded
    request says the same whatever else is in its batch; rows that ended are carried along, unchanged."""
    n = len(requests)
    width = max(len(r.prompt_ids) for r in requests)
    ids = torch.full((n, width), PAD_ID, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(requests):
        ids[i, width - len(r.prompt_ids) :] = torch.tensor(list(r.prompt_ids), dtype=torch.long)
        mask[i, width - len(r.prompt_ids) :] = 1
    limits = [min(r.max_tokens, model.cfg.max_len - len(r.prompt_ids)) for r in requests]
    outs: list[list[int]] = [[] for _ in requests]
    lps: list[list[float]] = [[] for _ in requests]
    alternates: list[list[list[tuple[int, float]]]] = [[] for _ in requests]
    finished = [limit <= 0 for limit in limits]
    steps = max(limits, default=0)
    past: Past | None = None
    step_ids = ids
    with torch.no_grad():
        for _ in range(min(steps, model.cfg.max_len - width)):
            if all(finished):
                break
            out, past = model.step(step_ids, mask, past)
            logits = out[:, -1].float()
            logp = F.log_softmax(logits, -1)
            tokens = logp.argmax(-1)
            for i, r in enumerate(requests):
                if finished[i] or r.temperature <= 0:
                    continue
                probs = F.softmax(logits[i] / r.temperature, -1)
                tokens[i] = torch.multinomial(probs, 1, generator=r.generator)[0]
            chosen = tokens.tolist()
            picked = logp.gather(-1, tokens[:, None]).squeeze(-1).tolist()
            for i, r in enumerate(requests):
                if finished[i]:
                    continue
                outs[i].append(chosen[i])
                lps[i].append(picked[i])
                if r.top_k:
                    top = torch.topk(logp[i], min(r.top_k, logp.shape[-1]))
                    alternates[i].append(list(zip(top.indices.tolist(), top.values.tolist(), strict=True)))
                else:
                    alternates[i].append([])
                if chosen[i] == EOS_ID or len(outs[i]) >= limits[i]:
                    finished[i] = True
            step_ids = tokens[:, None]
            mask = torch.cat([mask, torch.ones((n, 1), dtype=torch.long)], 1)
    return [
        Sampled(out, lp, "stop" if out and out[-1] == EOS_ID else "length", alt)
        for out, lp, alt in zip(outs, lps, alternates, strict=True)
    ]


def greedy_batch(model: TinyGPT, prompts: Sequence[Sequence[int]], max_tokens: int) -> list[list[int]]:
    """Greedy completions of many prompts at once (left-padded), each cut after its EOS: the held-out test."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), PAD_ID, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(list(p))
        mask[i, width - len(p) :] = 1
    out = torch.empty((len(prompts), 0), dtype=torch.long)
    with torch.no_grad():
        for _ in range(min(max_tokens, model.cfg.max_len - width)):
            nxt = model(ids, mask)[:, -1].argmax(-1, keepdim=True)
            out = torch.cat([out, nxt], 1)
            ids = torch.cat([ids, nxt], 1)
            mask = torch.cat([mask, torch.ones_like(nxt)], 1)
    rows = []
    for row in out.tolist():
        rows.append(row[: row.index(EOS_ID) + 1] if EOS_ID in row else row)
    return rows


def policy_bytes(model: TinyGPT) -> bytes:
    """The weights and the config, as one `torch.save` payload (what the weight sync ships)."""
    buf = io.BytesIO()
    torch.save({"config": asdict(model.cfg), "state": model.state_dict()}, buf)
    return buf.getvalue()


def load_policy(data: bytes | str) -> TinyGPT:
    """A model from `policy_bytes`' payload, or from a file holding it."""
    src: Any = io.BytesIO(data) if isinstance(data, bytes) else data
    payload = torch.load(src, map_location="cpu", weights_only=True)
    model = TinyGPT(PolicyConfig(**payload["config"]))
    model.load_state_dict(payload["state"])
    model.eval()
    return model


def parameters(model: nn.Module) -> int:
    return sum(math.prod(p.shape) for p in model.parameters())
