"""The Llama-family size table: architecture and parameter count of each named size.

Parameter counts follow the Llama decoder: per layer ``4·h²`` for attention (q, k, v, o with as
many kv heads as heads) plus ``3·h·f`` for the SwiGLU MLP, two RMSNorm vectors; embeddings and an
untied output head add ``2·V·h`` (Touvron et al. 2023, "Llama 2", Table 1 architectures).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SIZES", "ModelSize", "model_size"]


@dataclass(frozen=True)
class ModelSize:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    max_seq_len: int

    @property
    def parameters(self) -> int:
        h, f = self.hidden, self.ffn
        head_dim = h // self.heads
        attention = h * h * 2 + 2 * h * self.kv_heads * head_dim
        per_layer = attention + 3 * h * f + 2 * h
        return self.layers * per_layer + 2 * self.vocab * h + h

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: 6·N plus the attention term 12·L·h·s
        (Kaplan et al. 2020, §2.1; the Ultra-Scale Playbook, "Memory usage in transformers")."""
        return 6.0 * self.parameters + 12.0 * self.layers * self.hidden * seq_len


SIZES: dict[str, ModelSize] = {
    size.name: size
    for size in (
        ModelSize(
            "tiny", layers=2, hidden=64, heads=4, kv_heads=4, ffn=172, vocab=512, max_seq_len=1024
        ),
        ModelSize(
            "150m",
            layers=12,
            hidden=768,
            heads=12,
            kv_heads=12,
            ffn=2048,
            vocab=32000,
            max_seq_len=4096,
        ),
        ModelSize(
            "1b",
            layers=16,
            hidden=2048,
            heads=32,
            kv_heads=8,
            ffn=8192,
            vocab=128256,
            max_seq_len=8192,
        ),
        ModelSize(
            "8b",
            layers=32,
            hidden=4096,
            heads=32,
            kv_heads=8,
            ffn=14336,
            vocab=128256,
            max_seq_len=8192,
        ),
    )
}


def model_size(name: str) -> ModelSize:
    return SIZES[name]
