"""diffrax: an adaptive Tsit5 solve of a damped oscillator (a while loop
with a PID step-size controller), vmapped over initial conditions, saved
at 50 times, and its gradient (RecursiveCheckpointAdjoint). Kernels do not
run on the fake: the loop ends by the fake's loop guard."""
import jax, jax.numpy as jnp, diffrax
def f(t, y, args): return jnp.stack([y[1], -y[0] - args * y[1]])
term = diffrax.ODETerm(f)
def solve(y0, damp):
    return diffrax.diffeqsolve(
        term, diffrax.Tsit5(), t0=0.0, t1=10.0, dt0=0.1, y0=y0, args=damp,
        stepsize_controller=diffrax.PIDController(rtol=1e-5, atol=1e-5),
        saveat=diffrax.SaveAt(ts=jnp.linspace(0, 10, 50)), max_steps=4096,
        throw=False)
sol = jax.jit(jax.vmap(solve, in_axes=(0, None)))(jnp.ones((64, 2)), 0.1)
jax.block_until_ready(sol.ys)
print("ys", sol.ys.shape)
g = jax.jit(jax.grad(lambda d: solve(jnp.ones(2), d).ys.sum()))(0.1)
g.block_until_ready()
print("OK diffrax_ode")
