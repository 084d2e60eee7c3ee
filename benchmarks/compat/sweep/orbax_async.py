"""orbax-checkpoint: a CheckpointManager saving a sharded pytree
asynchronously at several steps, then restoring the latest onto the device."""
import sys, tempfile, numpy as np, jax, jax.numpy as jnp
import orbax.checkpoint as ocp
d = tempfile.mkdtemp(prefix="orbax")
tree = {"w": jnp.arange(1 << 20, dtype=jnp.float32).reshape(1024, 1024),
        "b": jnp.ones((1024,), jnp.bfloat16), "step": jnp.int32(0)}
opts = ocp.CheckpointManagerOptions(max_to_keep=2, enable_async_checkpointing=True)
with ocp.CheckpointManager(d, options=opts) as mgr:
    for step in range(3):
        tree = jax.tree.map(lambda a: a + 1, tree)
        mgr.save(step, args=ocp.args.StandardSave(tree))
    mgr.wait_until_finished()
    latest = mgr.latest_step()
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)
    back = mgr.restore(latest, args=ocp.args.StandardRestore(abstract))
# kernels do not run on the fake: compare with what the device holds
same = all(np.array_equal(np.asarray(a), np.asarray(b))
           for a, b in zip(jax.tree.leaves(tree), jax.tree.leaves(back)))
print("latest", latest, "restored equal to saved:", same)
assert latest == 2 and same
print("OK orbax_async")
