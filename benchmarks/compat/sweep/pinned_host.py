"""device_put to pinned_host memory and back, unpinned_host where the
client offers it, and a jit that moves an argument between memory kinds."""
import numpy as np, jax, jax.numpy as jnp
from jax.sharding import SingleDeviceSharding
d = jax.devices()[0]
kinds = [m.kind for m in d.addressable_memories()]
print("memory kinds", kinds)
x = np.arange(1 << 20, dtype=np.float32)
a = jax.device_put(x, d)
h = jax.device_put(a, SingleDeviceSharding(d, memory_kind="pinned_host"))
assert h.sharding.memory_kind == "pinned_host"
assert np.array_equal(np.asarray(h), x), "device -> pinned_host bytes"
b = jax.device_put(h, SingleDeviceSharding(d, memory_kind="device"))
assert np.array_equal(np.asarray(b), x), "pinned_host -> device bytes"
if "unpinned_host" in kinds:
    u = jax.device_put(a, SingleDeviceSharding(d, memory_kind="unpinned_host"))
    assert np.array_equal(np.asarray(u), x)
# numpy straight to pinned host
h2 = jax.device_put(x, SingleDeviceSharding(d, memory_kind="pinned_host"))
assert np.array_equal(np.asarray(h2), x)
out_s = SingleDeviceSharding(d, memory_kind="pinned_host")
f = jax.jit(lambda v: v, out_shardings=out_s)
o = f(a); o.block_until_ready()
assert o.sharding.memory_kind == "pinned_host"
assert np.array_equal(np.asarray(o), x), "jit output to pinned_host"
for _ in range(20):
    h = jax.device_put(b, SingleDeviceSharding(d, memory_kind="pinned_host"))
    b = jax.device_put(h, SingleDeviceSharding(d, memory_kind="device"))
assert np.array_equal(np.asarray(b), x)
print("OK pinned_host")
