"""The decoder-only transformer LM (Flax NNX), its size presets,
rematerialisation policies and sharding layouts.

The blocks are either scanned (one Block whose parameters carry a leading
layer axis, made with nnx.vmap and run with nnx.scan: one compiled body for
every layer, as large-model trainers do) or unrolled (an nnx.List of
Blocks). Rematerialisation is nnx.remat with a jax.checkpoint_policies policy,
applied to the block (inside the scanned body when scanned). Attention is
jax.nn.dot_product_attention: cuDNN's fused kernel on a GPU, XLA's on a CPU.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, Optional, Sequence

import jax
import jax.numpy as jnp
import optax
from flax import nnx
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
    # Offloading: what is kept for the backward pass waits in the host's
    # pinned memory, and comes back to the device when the backward needs it.
    "offload-dots": "offload_dots",     # matmul outputs, offloaded
    "offload-attn-mlp-out": "offload_names",  # attention and MLP outputs
}

#: --attention choices: jax.nn.dot_product_attention's implementation.
#: "auto" is cuDNN's fused kernel on a GPU and XLA's elsewhere.
ATTENTION = ("auto", "cudnn", "xla")


def remat_policy(name: str) -> Any:
    kind = REMAT_POLICIES[name]
    if kind == "names":
        return jax.checkpoint_policies.save_only_these_names(
            "attn_out", "mlp_out")
    if kind == "offload_dots":
        return jax.checkpoint_policies.offload_dot_with_no_batch_dims(
            "device", "pinned_host")
    if kind == "offload_names":
        return jax.checkpoint_policies.save_and_offload_only_these_names(
            names_which_can_be_saved=[],
            names_which_can_be_offloaded=["attn_out", "mlp_out"],
            offload_src="device", offload_dst="pinned_host")
    return getattr(jax.checkpoint_policies, kind)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    d_model: int
    layers: int
    heads: int
    d_ff: int
    max_len: int
    remat: str = "none"
    dtype: str = "float32"       # compute dtype; parameters stay float32
    attention: str = "xla"       # "xla" or "cudnn" (resolved, not "auto")
    scan_layers: bool = True
    shard: bool = False          # add sharding constraints (needs a mesh)
    lora_rank: int = 0
    lora_alpha: float = 16.0

    def params(self) -> int:
        d, f = self.d_model, self.d_ff
        block = 4 * d * d + 2 * d * f + 2 * d
        lora = 0
        if self.lora_rank:
            r = self.lora_rank
            lora = 4 * r * (d + d) + r * (d + f) + r * (f + d)
        return (VOCAB * d + self.max_len * d + self.layers * (block + lora)
                + d)


# -- the model ---------------------------------------------------------------


def _constrain(x: jax.Array, cfg: ModelConfig, *spec: Any) -> jax.Array:
    if not cfg.shard:
        return x
    return jax.lax.with_sharding_constraint(x, P(*spec))


class ScaledLoRALinear(nnx.LoRALinear):
    """nnx.LoRALinear with the usual alpha / rank scale on the adapter's
    output (nnx.LoRA itself adds x @ A @ B unscaled)."""

    def __init__(self, in_features: int, out_features: int, *,
                 lora_rank: int, alpha: float, **kwargs: Any) -> None:
        super().__init__(in_features, out_features, lora_rank=lora_rank,
                         **kwargs)
        self.scale = alpha / lora_rank

    def __call__(self, x: jax.Array, out_sharding: Any = None) -> jax.Array:
        y = nnx.Linear.__call__(self, x, out_sharding=out_sharding)
        return y + self.scale * self.lora(x)


def linear(cfg: ModelConfig, d_in: int, d_out: int, rngs: nnx.Rngs
           ) -> nnx.Module:
    kwargs = dict(use_bias=False, dtype=jnp.dtype(cfg.dtype),
                  kernel_init=nnx.initializers.normal(1 / math.sqrt(d_in)),
                  rngs=rngs)
    if cfg.lora_rank:
        return ScaledLoRALinear(d_in, d_out, lora_rank=cfg.lora_rank,
                                alpha=cfg.lora_alpha,
                                lora_dtype=jnp.dtype(cfg.dtype), **kwargs)
    return nnx.Linear(d_in, d_out, **kwargs)


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs) -> None:
        self.cfg = cfg
        d = cfg.d_model
        self.q = linear(cfg, d, d, rngs)
        self.k = linear(cfg, d, d, rngs)
        self.v = linear(cfg, d, d, rngs)
        self.out = linear(cfg, d, d, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.cfg
        b, length, d = x.shape
        heads = (b, length, cfg.heads, d // cfg.heads)
        q, k, v = (_constrain(p(x).reshape(heads), cfg, "data", None,
                              "model", None)
                   for p in (self.q, self.k, self.v))
        att = jax.nn.dot_product_attention(q, k, v, is_causal=True,
                                           implementation=cfg.attention)
        return self.out(att.reshape(b, length, d))


class MLP(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs) -> None:
        self.cfg = cfg
        self.up = linear(cfg, cfg.d_model, cfg.d_ff, rngs)
        self.down = linear(cfg, cfg.d_ff, cfg.d_model, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = _constrain(jax.nn.gelu(self.up(x)), self.cfg, "data", None,
                       "model")
        return self.down(h)


class Block(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs) -> None:
        self.cfg = cfg
        self.norm_attn = nnx.RMSNorm(cfg.d_model, rngs=rngs)
        self.attn = Attention(cfg, rngs)
        self.norm_mlp = nnx.RMSNorm(cfg.d_model, rngs=rngs)
        self.mlp = MLP(cfg, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.cfg
        att = checkpoint_name(self.attn(self.norm_attn(x)), "attn_out")
        x = _constrain(x + att.astype(x.dtype), cfg, "data", None, None)
        h = checkpoint_name(self.mlp(self.norm_mlp(x)), "mlp_out")
        return _constrain(x + h.astype(x.dtype), cfg, "data", None, None)


def _block_fn(cfg: ModelConfig) -> Any:
    """x, block -> block(x): rematerialised by the config's policy."""
    def forward(x: jax.Array, block: Block) -> jax.Array:
        return block(x)
    if cfg.remat == "none":
        return forward
    # Inside a scan jax needs no CSE barrier (the loop already is one).
    return nnx.remat(forward, policy=remat_policy(cfg.remat),
                     prevent_cse=not cfg.scan_layers)


class LM(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs) -> None:
        self.cfg = cfg
        d = cfg.d_model
        self.embed = nnx.Embed(VOCAB, d, embedding_init=nnx.initializers
                               .normal(0.02), rngs=rngs)
        self.pos_embed = nnx.Param(
            nnx.initializers.normal(0.02)(rngs.params(), (cfg.max_len, d)))
        if cfg.scan_layers:
            @nnx.split_rngs(splits=cfg.layers)
            @nnx.vmap(in_axes=(0,), out_axes=0)
            def make_blocks(rngs: nnx.Rngs) -> Block:
                return Block(cfg, rngs)
            self.blocks = make_blocks(rngs)
        else:
            self.blocks = nnx.List([Block(cfg, rngs)
                                    for _ in range(cfg.layers)])
        self.norm_out = nnx.RMSNorm(d, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        cfg = self.cfg
        dtype = jnp.dtype(cfg.dtype)
        x = self.embed(tokens) + self.pos_embed[:tokens.shape[1]]
        x = _constrain(x.astype(dtype), cfg, "data", None, None)
        forward = _block_fn(cfg)
        if cfg.scan_layers:
            x = nnx.scan(forward, in_axes=(nnx.Carry, 0),
                         out_axes=nnx.Carry)(x, self.blocks)
        else:
            for block in self.blocks:
                x = forward(x, block)
        x = self.norm_out(x)
        logits = self.embed.attend(x.astype(dtype))
        return _constrain(logits.astype(jnp.float32), cfg, "data", None,
                          None)


def loss_fn(model: LM, batch: jax.Array) -> jax.Array:
    inputs, targets = batch[:, :-1], batch[:, 1:]
    logits = model(inputs)
    return optax.softmax_cross_entropy_with_integer_labels(
        logits, targets).mean()


# -- sharding layouts --------------------------------------------------------

LAYOUTS = ("data", "fsdp", "tp")

#: tp: Megatron's split, by the last two names of a kernel's path.
_TP_RULES = {"q/kernel": (None, "model"), "k/kernel": (None, "model"),
             "v/kernel": (None, "model"), "out/kernel": ("model", None),
             "up/kernel": (None, "model"), "down/kernel": ("model", None)}


def param_spec(path: str, shape: Sequence[int], layout: str,
               mesh_shape: Dict[str, int], stacked: bool) -> P:
    """The PartitionSpec of a parameter, or of optimizer state shaped like
    one, by its path ("blocks/attn/q/kernel", "opt_state/0/mu/blocks/...").
    `stacked`: the path is a scanned block's, with a leading layer axis,
    which stays whole (each scan iteration reads one layer)."""
    lead: tuple = ()
    if stacked:
        lead, shape = (None,), tuple(shape[1:])
    if layout == "fsdp":
        parts = mesh_shape.get("data", 1)
        for i in sorted(range(len(shape)), key=lambda i: -shape[i]):
            if shape[i] % parts == 0 and shape[i] >= parts:
                spec: list = [None] * len(shape)
                spec[i] = "data"
                return P(*lead, *spec)
        return P()
    if layout == "tp" and "lora" not in path:
        model = mesh_shape.get("model", 1)
        for suffix, rule in _TP_RULES.items():
            if path.endswith(suffix) and len(shape) == len(rule):
                if all(a is None or shape[i] % model == 0
                       for i, a in enumerate(rule)):
                    return P(*lead, *rule)
                return P()
    return P()


def state_specs(state: Any, layout: str, mesh_shape: Dict[str, int],
                scan_layers: bool) -> Any:
    """A tree like `state` (an nnx.State, or any tree of arrays) with each
    array replaced by its PartitionSpec under `layout`."""
    def one(path: Any, x: Any) -> P:
        name = jax.tree_util.keystr(path, simple=True, separator="/")
        name = name.removesuffix("/value")  # an nnx.Variable's own leaf
        stacked = scan_layers and "blocks/" in name
        return param_spec(name, x.shape, layout, mesh_shape, stacked)
    return jax.tree_util.tree_map_with_path(one, state)
