"""The persistent compilation cache: the first run (argv[1] a fresh
folder) writes it, a second process over the same folder reads it."""
import os, sys, subprocess, jax, jax.numpy as jnp
d = sys.argv[1]
jax.config.update("jax_compilation_cache_dir", d)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
f = jax.jit(lambda a: jnp.sin(a @ a).sum(axis=0))
f(jnp.ones((256, 256))).block_until_ready()
entries = len(os.listdir(d))
print("cache entries", entries)
assert entries > 0
if len(sys.argv) < 3:
    r = subprocess.run([sys.executable, __file__, d, "second"])
    assert r.returncode == 0, r.returncode
    print("OK compile_cache")
