"""A program that exits with arrays live on the device and work in flight:
threads enqueue jitted steps and copies without waiting for them, and the
main thread returns as soon as they have enqueued, deleting nothing."""
import threading, numpy as np, jax, jax.numpy as jnp
live = [jnp.full((1 << 20,), i, jnp.float32) for i in range(16)]
f = jax.jit(lambda a, b: jnp.tanh(a @ b) * 2)
out = []
def enqueue(k):
    x = jax.device_put(np.full((512, 512), k, np.float32))
    for _ in range(20):
        x = f(x, x)
    out.append(x)                        # not waited for
    out.append(jax.device_put(np.ones(1 << 22, np.float32)))
ts = [threading.Thread(target=enqueue, args=(k,)) for k in range(4)]
for t in ts: t.start()
for t in ts: t.join()
print("OK exit_live (exiting with", len(live) + len(out), "arrays live, work enqueued)")
