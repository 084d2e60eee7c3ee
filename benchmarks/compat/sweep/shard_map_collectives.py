"""shard_map over a 1-D mesh of every device: psum, all_gather, ppermute,
all_to_all, psum_scatter, and a jit over NamedSharding'd arrays."""
import numpy as np, jax, jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
try:
    from jax import shard_map
except ImportError:
    from jax.experimental.shard_map import shard_map
n = jax.device_count()
mesh = Mesh(np.array(jax.devices()), ("x",))
# numpy data, put on the devices by copies (which run on the fake)
xs = np.arange(n * 8 * n, dtype=np.float32).reshape(n * 8, n) + 1
x = jax.device_put(xs,
                   NamedSharding(mesh, P("x")))
def f(a):
    g = jax.lax.all_gather(a, "x", tiled=True)
    p = jax.lax.ppermute(a, "x", [(i, (i + 1) % n) for i in range(n)])
    t = jax.lax.all_to_all(a, "x", 1, 1, tiled=True)
    s = jax.lax.psum(a, "x")
    r = jax.lax.psum_scatter(a, "x", scatter_dimension=0, tiled=True)
    return g, p, t, s, r
sm = jax.jit(shard_map(f, mesh=mesh, in_specs=P("x"),
                       out_specs=(P(), P("x"), P("x"), P(), P("x")),
                       check_vma=False) if "check_vma" in shard_map.__code__.co_varnames
             else shard_map(f, mesh=mesh, in_specs=P("x"),
                            out_specs=(P(), P("x"), P("x"), P(), P("x")), check_rep=False))
g, p, t, s, r = sm(x)
assert np.array_equal(np.asarray(g), xs), "all_gather bytes"
assert np.array_equal(np.asarray(p), np.roll(xs, 8, axis=0)), "ppermute bytes"
jax.block_until_ready((t, s, r))
# sharded matmul with automatic partitioning
w = jax.device_put(jnp.ones((n, 512)), NamedSharding(mesh, P(None, "x")))
y = jax.jit(lambda a, w: jnp.tanh(a @ w).sum())(x, w)
y.block_until_ready()
print(f"OK shard_map_collectives on {n} devices")
