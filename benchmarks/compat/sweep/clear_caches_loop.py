"""jax.clear_caches() then re-jit, in a loop, with shapes that change:
each round compiles new executables and drops the old ones."""
import gc, jax, jax.numpy as jnp
for i in range(12):
    n = 128 + 64 * (i % 3)
    f = jax.jit(lambda a: jnp.sin(a @ a.T).sum(axis=1))
    g = jax.jit(jax.grad(lambda a: jnp.tanh(a).sum()))
    x = jnp.ones((n, n))
    f(x).block_until_ready(); g(x).block_until_ready()
    jax.clear_caches(); gc.collect()
stats = jax.devices()[0].memory_stats() or {}
print("bytes_in_use after", stats.get("bytes_in_use"))
print("OK clear_caches_loop")
