"""flax.linen MLP trained with optax, its blocks under jax.checkpoint
(nn.remat) with three rematerialisation policies, and one policy that
offloads saved residuals to pinned host memory."""
import jax, jax.numpy as jnp, optax
import flax.linen as nn
from jax.ad_checkpoint import checkpoint_name

POLICIES = {
    "nothing_saveable": jax.checkpoint_policies.nothing_saveable,
    "dots_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "save_names": jax.checkpoint_policies.save_only_these_names("h"),
    "offload": jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[], names_which_can_be_offloaded=["h"],
        offload_src="device", offload_dst="pinned_host"),
}

class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.Dense(512)(x)
        h = checkpoint_name(nn.gelu(h), "h")
        return x + nn.Dense(x.shape[-1])(h)

class Model(nn.Module):
    policy: object
    @nn.compact
    def __call__(self, x):
        for _ in range(4):
            x = nn.remat(Block, policy=self.policy)()(x)
        return nn.Dense(10)(x)

for name, policy in POLICIES.items():
    model = Model(policy)
    x = jnp.ones((64, 256)); y = jnp.zeros((64,), jnp.int32)
    params = model.init(jax.random.key(0), x)
    opt = optax.adamw(1e-3); state = opt.init(params)
    @jax.jit
    def step(params, state, x, y):
        def loss(p):
            return optax.softmax_cross_entropy_with_integer_labels(
                model.apply(p, x), y).mean()
        l, g = jax.value_and_grad(loss)(params)
        u, state = opt.update(g, state, params)
        return optax.apply_updates(params, u), state, l
    for _ in range(3):
        params, state, l = step(params, state, x, y)
    jax.block_until_ready(params)
    print(f"policy {name}: ok")
print("OK linen_remat")
