"""jax.distributed over two processes on one machine, one fake device
each (the layout of one process per GPU): the parent starts the second
process itself, both join at a local coordinator, and a jit over a global
mesh all-gathers across them. argv[1] is the coordinator's port."""
import os, subprocess, sys
port = sys.argv[1]
rank = int(sys.argv[2]) if len(sys.argv) > 2 else 0
if rank == 0:
    child = subprocess.Popen([sys.executable, __file__, port, "1"])
import numpy as np, jax, jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2,
                           process_id=rank, initialization_timeout=120)
assert jax.process_count() == 2 and jax.device_count() == 2
mesh = Mesh(np.array(jax.devices()), ("p",))
local = np.full((4,), rank + 1, np.float32)
x = jax.make_array_from_single_device_arrays(
    (8,), NamedSharding(mesh, P("p")),
    [jax.device_put(local, jax.local_devices()[0])])
g = jax.jit(lambda a: a, out_shardings=NamedSharding(mesh, P()))(x)
got = np.asarray(g.addressable_data(0))
print(f"rank {rank}: gathered {got.tolist()}", flush=True)
ok = np.array_equal(got, np.repeat(np.float32([1, 2]), 4))
jax.distributed.shutdown()
if rank == 0:
    assert child.wait(timeout=120) == 0, "rank 1 failed"
assert ok, "the gathered bytes differ"
if rank == 0:
    print("OK distributed")
