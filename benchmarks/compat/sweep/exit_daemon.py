"""A program that exits with arrays live on the device and daemon threads
still dispatching jitted work, without joining them or deleting anything.
Under Python 3.11 this aborts at interpreter shutdown on JAX's CPU backend
too, without jaxlake: a daemon thread inside a jitted call is ended by a
forced unwind that meets C++ code that cannot pass it on."""
import threading, time, jax, jax.numpy as jnp
live = [jnp.full((1 << 20,), i, jnp.float32) for i in range(16)]
f = jax.jit(lambda a: jnp.tanh(a) * 2)
def spin(k):
    x = jnp.ones((256, 256)) * k
    while True:
        x = f(x)
ts = [threading.Thread(target=spin, args=(k,), daemon=True) for k in range(4)]
for t in ts: t.start()
time.sleep(2.0)
print("OK exit_daemon (exiting with", len(live), "arrays live and 4 threads running)")
