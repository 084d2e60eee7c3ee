"""Buffer donation: a jitted update that donates its state, and a
donated argument that is deleted afterwards (using it raises)."""
import numpy as np, jax, jax.numpy as jnp
@jax.jit
def upd(state, g):
    return jax.tree.map(lambda s, d: s - 0.1 * d, state, g)
upd = jax.jit(upd, donate_argnums=0)
state = {"w": jnp.ones((1024, 1024)), "b": jnp.zeros((1024,))}
g = jax.tree.map(jnp.ones_like, state)
for _ in range(10):
    old = state["w"]
    state = upd(state, g)
    assert old.is_deleted(), "donated buffer still live"
jax.block_until_ready(state)
try:
    old + 1
    raise SystemExit("using a donated array did not raise")
except RuntimeError as e:
    print("donated array:", str(e).splitlines()[0][:80])
# donation of an input that aliases into an output of the same shape
x = jax.device_put(np.arange(1 << 20, dtype=np.float32))
y = jax.jit(lambda a: a, donate_argnums=0)(x)
assert np.array_equal(np.asarray(y), np.arange(1 << 20, dtype=np.float32))
print("OK donation")
