"""Checkpoints of the LM examples (orbax): a run's own (save, restore, the
model it records) and LoRA's frozen base weights."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any, Optional, Tuple

import jax
import numpy as np
from flax import nnx, traverse_util

from _lm_args import MODEL_FILE


def checkpoints(folder: str) -> Any:
    import orbax.checkpoint as ocp
    options = ocp.CheckpointManagerOptions(max_to_keep=3, create=True)
    return ocp.CheckpointManager(os.path.abspath(folder), options=options)


def write_model(args: argparse.Namespace) -> None:
    """Records the model in the checkpoint folder, so that a resume or a
    fine-tune need not repeat --preset and --scan-layers."""
    with open(os.path.join(args.ckpt_dir, MODEL_FILE), "w",
              encoding="utf-8") as f:
        json.dump({"preset": args.preset, "scan_layers": args.scan_layers},
                  f)
        f.write("\n")


def save(manager: Any, step: int, trainable: Any, opt_state: Any) -> None:
    import orbax.checkpoint as ocp
    manager.save(step, args=ocp.args.StandardSave(
        {"params": trainable, "opt_state": opt_state}))


def restore(manager: Any, step: int, params: Any, opt_state: Any,
             rec: Any) -> Tuple[Any, Any]:
    """Restores a step into arrays of the given shapes and shardings."""
    import orbax.checkpoint as ocp
    target = {"params": params, "opt_state": opt_state}
    state = manager.restore(step, args=ocp.args.StandardRestore(target))
    if rec is not None:
        rec.register(state["params"], "param")
        rec.register(state["opt_state"], "opt_state")
    return state["params"], state["opt_state"]


def load_base(folder: str, step: Optional[int], target: Any, rec: Any
               ) -> Any:
    """LoRA's frozen weights: the parameters of a train_lm.py checkpoint,
    placed with the shardings of `target` (abstract arrays)."""
    import orbax.checkpoint as ocp
    manager = ocp.CheckpointManager(os.path.abspath(folder))
    step = manager.latest_step() if step is None else step
    if step is None:
        raise SystemExit(f"error: no checkpoint in {folder}: train one with "
                         "examples/train_lm.py --ckpt-dir DIR --ckpt-every N")
    state = manager.restore(step, args=ocp.args.StandardRestore())
    manager.close()
    sep = "/"
    base = traverse_util.flatten_dict(state["params"], sep=sep)
    base = {k.removesuffix(sep + "value"): v for k, v in base.items()}
    wanted = traverse_util.flatten_dict(nnx.to_pure_dict(target))
    missing = [k for k in wanted if sep.join(map(str, k)) not in base]
    if missing:
        names = [sep.join(map(str, k)) for k in missing[:3]]
        raise SystemExit(
            f"error: the base checkpoint in {folder} does not match this "
            f"model: it lacks {names}{' ...' if len(missing) > 3 else ''}")
    values = {}
    for k, abstract in wanted.items():
        value = np.asarray(base[sep.join(map(str, k))])
        if value.shape != tuple(abstract.shape):
            raise SystemExit(
                f"error: base parameter {sep.join(map(str, k))} has shape "
                f"{value.shape}, this model wants {tuple(abstract.shape)}")
        if rec is not None:
            values[k] = rec.device_put(value, abstract.sharding, kind="param")
        else:
            values[k] = jax.make_array_from_callback(
                value.shape, abstract.sharding,
                lambda index, value=value: value[index])
    frozen = jax.tree.map(lambda x: x, target)  # a copy to fill in
    nnx.replace_by_pure_dict(frozen, traverse_util.unflatten_dict(values))
    return frozen
