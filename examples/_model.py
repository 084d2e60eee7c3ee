"""The decoder-only transformer LM (Flax linen), its size presets,
rematerialisation policies and sharding layouts.

Parameters travel as flat dicts {"block_0/q/kernel": array}, which keeps
sharding rules, LoRA's trainable/frozen split and orbax checkpoints simple.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import PartitionSpec as P

VOCAB = 256  # bytes

# -- presets -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Preset:
    d_model: int
    layers: int
    heads: int
    d_ff: int
    seq_len: int
    batch: int
    lr: float


#: Model sizes. tiny is for CPU tests; 1b and beyond are for GPUs, or for
#: compile-only traces (--compile-only --trace) on a machine without one.
PRESETS: Dict[str, Preset] = {
    "tiny": Preset(64, 2, 4, 256, 64, 8, 1e-2),
    "small": Preset(256, 4, 4, 1024, 128, 16, 3e-3),
    "base": Preset(768, 12, 12, 3072, 512, 16, 6e-4),      # ~85M
    "medium": Preset(1024, 24, 16, 4096, 1024, 16, 3e-4),  # ~300M
    "1b": Preset(2048, 20, 16, 8192, 1024, 8, 3e-4),       # ~1.0B
    "3b": Preset(3072, 26, 24, 12288, 1024, 8, 2e-4),      # ~2.9B
    "7b": Preset(4096, 32, 32, 16384, 1024, 4, 1.5e-4),    # ~6.4B
}

#: --remat choices: what a rematerialised block keeps for the backward pass.
REMAT_POLICIES: Dict[str, Optional[str]] = {
    "none": None,                       # no remat: keep every activation
    "full": "nothing_saveable",         # keep only each block's input
    "dots-saveable": "dots_saveable",   # keep matmul outputs
    "dots-no-batch-saveable": "dots_with_no_batch_dims_saveable",
    "attn-mlp-out-saveable": "names",   # keep attention and MLP outputs
}


def remat_policy(name: str) -> Any:
    kind = REMAT_POLICIES[name]
    if kind == "names":
        return jax.checkpoint_policies.save_only_these_names(
            "attn_out", "mlp_out")
    return getattr(jax.checkpoint_policies, kind)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    d_model: int
    layers: int
    heads: int
    d_ff: int
    max_len: int
    remat: str = "none"
    dtype: str = "float32"
    shard: bool = False      # add sharding constraints (needs a mesh)
    lora_rank: int = 0
    lora_alpha: float = 16.0

    def params(self) -> int:
        d, f = self.d_model, self.d_ff
        block = 4 * d * d + 2 * d * f + 4 * d
        return VOCAB * d + self.max_len * d + self.layers * block + 2 * d


# -- the model ---------------------------------------------------------------


def _constrain(x: jax.Array, cfg: ModelConfig, *spec: Any) -> jax.Array:
    if not cfg.shard:
        return x
    return jax.lax.with_sharding_constraint(x, P(*spec))


class Linear(nn.Module):
    """x[..., *in] @ kernel[*in, *features], with an optional LoRA adapter
    (A: [*in, r], B: [r, *features], B starting at zero)."""

    features: Tuple[int, ...]
    in_dims: int
    cfg: ModelConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        in_shape = x.shape[-self.in_dims:]
        fan_in = math.prod(in_shape)
        init = nn.initializers.normal(1.0 / math.sqrt(fan_in))
        kernel = self.param("kernel", init, in_shape + self.features)
        dtype = jnp.dtype(self.cfg.dtype)
        contract = (tuple(range(x.ndim - self.in_dims, x.ndim)),
                    tuple(range(self.in_dims)))
        y = jax.lax.dot_general(x.astype(dtype), kernel.astype(dtype),
                                (contract, ((), ())))
        r = self.cfg.lora_rank
        if r:
            a = self.param("lora_a", init, in_shape + (r,))
            b = self.param("lora_b", nn.initializers.zeros, (r,) + self.features)
            h = jax.lax.dot_general(x.astype(dtype), a.astype(dtype),
                                    (contract, ((), ())))
            y = y + (self.cfg.lora_alpha / r) * jnp.tensordot(
                h, b.astype(dtype), axes=1)
        return y


class Block(nn.Module):
    cfg: ModelConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.cfg
        h_count, d = cfg.heads, cfg.d_model
        dh = d // h_count
        length = x.shape[1]
        h = nn.RMSNorm(name="norm_attn")(x)
        q = Linear((h_count, dh), 1, cfg, name="q")(h)
        k = Linear((h_count, dh), 1, cfg, name="k")(h)
        v = Linear((h_count, dh), 1, cfg, name="v")(h)
        q, k, v = (_constrain(t, cfg, "data", None, "model", None)
                   for t in (q, k, v))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(dh)
        mask = jnp.tril(jnp.ones((length, length), dtype=bool))
        scores = jnp.where(mask, scores.astype(jnp.float32), -1e9)
        probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
        att = jnp.einsum("bhqk,bkhd->bqhd", probs, v)
        att = Linear((d,), 2, cfg, name="out")(att)
        att = checkpoint_name(att, "attn_out")
        x = _constrain(x + att.astype(x.dtype), cfg, "data", None, None)
        h = nn.RMSNorm(name="norm_mlp")(x)
        h = Linear((cfg.d_ff,), 1, cfg, name="up")(h)
        h = _constrain(jax.nn.gelu(h), cfg, "data", None, "model")
        h = Linear((d,), 1, cfg, name="down")(h)
        h = checkpoint_name(h, "mlp_out")
        return _constrain(x + h.astype(x.dtype), cfg, "data", None, None)


class LM(nn.Module):
    cfg: ModelConfig

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        cfg = self.cfg
        embed = nn.Embed(VOCAB, cfg.d_model, name="embed",
                         embedding_init=nn.initializers.normal(0.02))
        pos = self.param("pos_embed", nn.initializers.normal(0.02),
                         (cfg.max_len, cfg.d_model))
        x = embed(tokens) + pos[None, :tokens.shape[1]]
        x = _constrain(x, cfg, "data", None, None)
        block = Block
        if cfg.remat != "none":
            block = nn.remat(Block, policy=remat_policy(cfg.remat),
                             prevent_cse=True)
        for i in range(cfg.layers):
            x = block(cfg, name=f"block_{i}")(x)
        x = nn.RMSNorm(name="norm_out")(x)
        logits = embed.attend(x.astype(jnp.dtype(cfg.dtype)))
        return _constrain(logits.astype(jnp.float32), cfg, "data", None, None)


def flatten(tree: Dict[str, Any]) -> Dict[str, Any]:
    """{"a": {"b": x}} -> {"a/b": x}."""
    out: Dict[str, Any] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict) or hasattr(node, "items"):
            for k, v in node.items():
                walk(f"{prefix}/{k}" if prefix else str(k), v)
        else:
            out[prefix] = node
    walk("", tree)
    return out


def unflatten(flat: Dict[str, Any]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for key, v in flat.items():
        node = out
        *parents, last = key.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = v
    return out


def is_lora(name: str) -> bool:
    return "/lora_" in name


def loss_fn(model: LM, params: Dict[str, Any], batch: jax.Array) -> jax.Array:
    inputs, targets = batch[:, :-1], batch[:, 1:]
    logits = model.apply({"params": unflatten(params)}, inputs)
    return optax.softmax_cross_entropy_with_integer_labels(
        logits, targets).mean()


# -- sharding layouts --------------------------------------------------------

LAYOUTS = ("data", "fsdp", "tp")


def param_spec(name: str, shape: Sequence[int], layout: str,
               mesh_shape: Dict[str, int]) -> P:
    """The PartitionSpec of one parameter under a layout."""
    if layout == "fsdp":
        parts = mesh_shape.get("data", 1)
        order = sorted(range(len(shape)), key=lambda i: -shape[i])
        for i in order:
            if shape[i] % parts == 0 and shape[i] >= parts:
                spec: List[Any] = [None] * len(shape)
                spec[i] = "data"
                return P(*spec)
        return P()
    if layout == "tp" and not is_lora(name):
        model = mesh_shape.get("model", 1)
        rules = {"q/kernel": (None, "model", None),
                 "k/kernel": (None, "model", None),
                 "v/kernel": (None, "model", None),
                 "out/kernel": ("model", None, None),
                 "up/kernel": (None, "model"),
                 "down/kernel": ("model", None)}
        for suffix, spec_t in rules.items():
            if name.endswith(suffix):
                ok = all(a is None or shape[i] % model == 0
                         for i, a in enumerate(spec_t))
                return P(*spec_t) if ok else P()
    return P()
