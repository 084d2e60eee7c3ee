"""Keras 3 with the JAX backend and keras-hub: a GPT-2 built from a config
(no weights: nothing is downloaded), then `model.fit` on synthetic tokens.
It knows nothing of jaxlake; the compatibility table runs it unmodified
under `jaxlake run --fake-gpu`.

    KERAS_BACKEND=jax python keras_gpt2.py --steps 4 --batch 4 --seq 128
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras  # noqa: E402
import keras_hub  # noqa: E402
import numpy as np  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    args = p.parse_args()

    vocab = 50257
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=vocab, num_layers=args.layers, num_heads=12,
        hidden_dim=768, intermediate_dim=3072, max_sequence_length=1024)
    lm = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    lm.compile(
        optimizer=keras.optimizers.AdamW(learning_rate=1e-4),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        weighted_metrics=["accuracy"])

    rng = np.random.default_rng(0)
    n = args.steps * args.batch
    tokens = rng.integers(0, vocab, size=(n, args.seq + 1), dtype=np.int32)
    x = {"token_ids": tokens[:, :-1],
         "padding_mask": np.ones((n, args.seq), dtype=bool)}
    y = tokens[:, 1:]
    history = lm.fit(x, y, batch_size=args.batch, epochs=1, verbose=2)
    print("loss", history.history["loss"][-1])
    print("backend", keras.backend.backend())
    print("done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
