"""A process that uses JAX and then starts children that use JAX too:
multiprocessing with 'spawn' and 'forkserver' (a fresh interpreter each),
and an os.fork() child that leaves at once with os._exit, as
multiprocessing's fork children do. JAX is not fork-safe: a forked child
that runs JAX, or that exits through the interpreter's shutdown, is not a
supported program (the latter dies of SIGSEGV on JAX's CPU backend too)."""
import multiprocessing as mp, os, sys, jax, jax.numpy as jnp
def child(q):
    import jax, jax.numpy as jnp
    y = jax.jit(lambda a: a * 2)(jnp.ones(1 << 20)).block_until_ready()
    q.put((os.getpid(), jax.devices()[0].platform, int(y.shape[0])))
if __name__ == "__main__":
    x = jax.jit(lambda a: a + 1)(jnp.ones(1 << 20)); x.block_until_ready()
    for method in ("spawn", "forkserver"):
        ctx = mp.get_context(method)
        q = ctx.Queue(); p = ctx.Process(target=child, args=(q,))
        p.start(); r = q.get(timeout=240); p.join(60)
        print(method, "child", r, "exit", p.exitcode)
        assert p.exitcode == 0 and r[1] == jax.devices()[0].platform
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    _, st = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(st) == 0
    (x + 1).block_until_ready()
    print("OK multiproc")
