"""jax.live_arrays() and device.memory_stats() read from a second thread
while the main thread trains; figures are checked to be consistent."""
import threading, time, jax, jax.numpy as jnp
d = jax.devices()[0]
stop = threading.Event(); reads = []; errors = []
def watch():
    try:
        while not stop.is_set():
            s = d.memory_stats() or {}
            live = jax.live_arrays()
            nbytes = sum(a.nbytes for a in live if not a.is_deleted())
            reads.append((s.get("bytes_in_use", -1), nbytes, len(live)))
            time.sleep(0.01)
    except Exception as e:  # noqa
        errors.append(repr(e))
t = threading.Thread(target=watch); t.start()
f = jax.jit(lambda w, x: w - 0.01 * jax.grad(lambda w: jnp.tanh(x @ w).sum())(w))
w = jnp.ones((1024, 1024)); keep = []
for i in range(30):
    w = f(w, jnp.ones((64, 1024)) * i)
    if i % 3 == 0:
        keep.append(w + 0)
    w.block_until_ready()
stop.set(); t.join()
assert not errors, errors
s = d.memory_stats()
print("reads", len(reads), "final stats", {k: s[k] for k in sorted(s) if "bytes" in k})
live = sum(a.nbytes for a in jax.live_arrays())
assert s["bytes_in_use"] >= live, (s["bytes_in_use"], live)
assert s["peak_bytes_in_use"] >= s["bytes_in_use"]
print("OK live_stats")
