"""Host callbacks inside jit, scan and grad: jax.pure_callback,
jax.debug.print, jax.experimental.io_callback (ordered), jax.debug.callback."""
import numpy as np, jax, jax.numpy as jnp
from jax.experimental import io_callback
seen = []
def host_sq(a):
    return np.asarray(a) ** 2
@jax.jit
def f(x):
    y = jax.pure_callback(host_sq, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
    jax.debug.print("sum {s}", s=y.sum())
    io_callback(lambda v: seen.append(np.asarray(v).copy()), None, y[:4], ordered=True)
    jax.debug.callback(lambda v: seen.append(("dbg", float(v))), x[0])
    return y + 1
x = jnp.arange(16, dtype=jnp.float32)
out = f(x); out.block_until_ready()
def body(c, i):
    r = io_callback(lambda v: np.asarray(v, np.float32) + 1,
                    jax.ShapeDtypeStruct((), jnp.float32), c, ordered=True)
    return r, r
c, ys = jax.jit(lambda c: jax.lax.scan(body, c, jnp.arange(5)))(jnp.float32(0))
jax.block_until_ready(ys)
jax.effects_barrier()
print("seen", len(seen), "callbacks; scan carry", float(c))
assert len(seen) >= 2, seen
print("OK host_callbacks")
