"""jax.pmap over every local device: psum, pmean, all_gather, ppermute,
all_to_all; the bytes of the copying collectives are checked."""
import numpy as np, jax, jax.numpy as jnp
n = jax.local_device_count()
# numpy data: pmap puts it on the devices by copies, which run on the fake
x = np.arange(n * 4 * n, dtype=np.float32).reshape(n, 4 * n) + 1
g = jax.pmap(lambda a: jax.lax.all_gather(a, "i"), axis_name="i")(x)
assert np.array_equal(np.asarray(g)[0], x), "all_gather bytes"  # g[0] would be a kernel
perm = [(i, (i + 1) % n) for i in range(n)]
p = jax.pmap(lambda a: jax.lax.ppermute(a, "i", perm), axis_name="i")(x)
assert np.array_equal(np.asarray(p), np.roll(x, 1, axis=0)), "ppermute bytes"
s = jax.pmap(lambda a: jax.lax.psum(a, "i") + jax.lax.pmean(a, "i"), axis_name="i")(x)
t = jax.pmap(lambda a: jax.lax.all_to_all(a.reshape(n, 4), "i", 0, 0), axis_name="i")(x)
jax.block_until_ready((s, t))
# a pmapped training-like step with grads averaged
w = jnp.ones((n, 256, 256))
step = jax.pmap(lambda w, b: w - 0.1 * jax.lax.pmean(
    jax.grad(lambda w: ((b @ w) ** 2).mean())(w), "d"), axis_name="d")
for _ in range(3):
    w = step(w, jnp.ones((n, 32, 256)))
jax.block_until_ready(w)
print(f"OK pmap_collectives on {n} devices")
