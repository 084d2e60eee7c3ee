"""Eight Python threads dispatching jitted work at once (each its own
shapes and a shared function), creating and dropping arrays, with
block_until_ready in every thread."""
import threading, numpy as np, jax, jax.numpy as jnp
f = jax.jit(lambda a, b: jnp.tanh(a @ b) + 1)
errors = []
def work(k):
    try:
        rng = np.random.default_rng(k)
        for i in range(40):
            n = 64 * (1 + (k + i) % 4)
            a = jax.device_put(rng.standard_normal((n, n)).astype(np.float32))
            y = f(a, a)
            if i % 5 == 0:
                back = np.asarray(a)
                assert back.shape == (n, n)
            y.block_until_ready()
            del a, y
    except Exception as e:  # noqa
        errors.append(repr(e))
ts = [threading.Thread(target=work, args=(k,)) for k in range(8)]
for t in ts: t.start()
for t in ts: t.join()
assert not errors, errors
print("OK threads_dispatch")
