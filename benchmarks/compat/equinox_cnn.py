"""A typical Equinox training script: a CNN classifier on synthetic
MNIST-shaped data, trained with optax, in the style of Equinox's own
"CNN on MNIST" example. It knows nothing of jaxlake; the compatibility
table runs it unmodified under `jaxlake run --fake-gpu`.

    python equinox_cnn.py --steps 20 --batch 64
"""

from __future__ import annotations

import argparse

import equinox as eqx
import jax
import jax.numpy as jnp
import optax


class CNN(eqx.Module):
    layers: list

    def __init__(self, key):
        k1, k2, k3, k4 = jax.random.split(key, 4)
        self.layers = [
            eqx.nn.Conv2d(1, 3, kernel_size=4, key=k1),
            eqx.nn.MaxPool2d(kernel_size=2),
            jax.nn.relu,
            jnp.ravel,
            eqx.nn.Linear(1728, 512, key=k2),
            jax.nn.sigmoid,
            eqx.nn.Linear(512, 64, key=k3),
            jax.nn.relu,
            eqx.nn.Linear(64, 10, key=k4),
            jax.nn.log_softmax,
        ]

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def loss(model, x, y):
    pred_y = jax.vmap(model)(x)
    return -jnp.mean(jnp.take_along_axis(pred_y, y[:, None], axis=1))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=64)
    args = p.parse_args()

    key = jax.random.PRNGKey(0)
    key, mkey = jax.random.split(key)
    model = CNN(mkey)
    optim = optax.adamw(3e-4)
    opt_state = optim.init(eqx.filter(model, eqx.is_array))

    @eqx.filter_jit
    def make_step(model, opt_state, x, y):
        value, grads = eqx.filter_value_and_grad(loss)(model, x, y)
        updates, opt_state = optim.update(
            grads, opt_state, eqx.filter(model, eqx.is_array))
        model = eqx.apply_updates(model, updates)
        return model, opt_state, value

    @eqx.filter_jit
    def accuracy(model, x, y):
        pred = jnp.argmax(jax.vmap(model)(x), axis=1)
        return jnp.mean(y == pred)

    for step in range(args.steps):
        key, xk, yk = jax.random.split(key, 3)
        x = jax.random.normal(xk, (args.batch, 1, 28, 28))
        y = jax.random.randint(yk, (args.batch,), 0, 10)
        model, opt_state, value = make_step(model, opt_state, x, y)
        if step % 10 == 0 or step == args.steps - 1:
            acc = accuracy(model, x, y)
            print(f"step {step} loss {float(value):.4f} acc {float(acc):.3f}")
    print("devices", jax.devices())
    print("done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
