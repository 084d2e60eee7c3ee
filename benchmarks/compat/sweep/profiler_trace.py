"""jax.profiler: a trace of jitted steps (context manager, then
start/stop), annotations, and a device memory profile."""
import os, sys, tempfile, jax, jax.numpy as jnp
d = tempfile.mkdtemp(prefix="jaxprof")
f = jax.jit(lambda a: jnp.tanh(a @ a.T).sum())
x = jnp.ones((512, 512))
with jax.profiler.trace(d):
    for i in range(3):
        with jax.profiler.StepTraceAnnotation("step", step_num=i):
            f(x).block_until_ready()
jax.profiler.start_trace(d)
with jax.profiler.TraceAnnotation("again"):
    f(x + 1).block_until_ready()
jax.profiler.stop_trace()
prof = jax.profiler.device_memory_profile()
files = [os.path.join(r, n) for r, _, ns in os.walk(d) for n in ns]
print("trace files", len(files), "memory profile bytes", len(prof))
assert files and prof
print("OK profiler_trace")
