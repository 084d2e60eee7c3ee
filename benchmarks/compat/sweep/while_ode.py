"""An adaptive-step ODE solve written as diffrax writes one: a
lax.while_loop whose trip count depends on computed values (RK4 with a
step-size controller), vmapped over initial conditions, and its gradient
through a fixed-step scan. Kernels do not run on the fake: the loop ends
when the predicate XLA reads back says so, bounded by max_steps."""
import jax, jax.numpy as jnp
def f(t, y): return jnp.stack([y[1], -y[0] - 0.1 * y[1]])
def rk4(t, y, h):
    k1 = f(t, y); k2 = f(t + h/2, y + h/2*k1); k3 = f(t + h/2, y + h/2*k2)
    k4 = f(t + h, y + h*k3); return y + h/6*(k1 + 2*k2 + 2*k3 + k4)
def solve(y0, t1=10.0, max_steps=4096):
    def cond(s): t, y, h, n = s; return (t < t1) & (n < max_steps)
    def body(s):
        t, y, h, n = s
        full = rk4(t, y, h); half = rk4(t + h/2, rk4(t, y, h/2), h/2)
        err = jnp.max(jnp.abs(full - half))
        ok = err < 1e-6
        t = jnp.where(ok, t + h, t); y = jnp.where(ok, half, y)
        h = jnp.clip(h * jnp.where(ok, 1.5, 0.5), 1e-4, 0.5)
        return t, y, h, n + 1
    return jax.lax.while_loop(cond, body, (0.0, y0, 0.1, 0))
ys = jax.jit(jax.vmap(solve))(jnp.ones((128, 2)))
jax.block_until_ready(ys)
print("steps taken (meaningless on the fake):", int(ys[3].max()))
def loss(y0):
    def step(y, _): return rk4(0.0, y, 0.01), None
    y, _ = jax.lax.scan(step, y0, None, length=200)
    return (y ** 2).sum()
g = jax.jit(jax.grad(loss))(jnp.ones(2)); g.block_until_ready()
print("OK while_ode")
