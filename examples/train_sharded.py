"""Train the LM of train_lm.py over a jax.sharding.Mesh, in one of three
layouts, on one or several processes.

    python examples/train_sharded.py --layout fsdp            # 8 CPU devices
    python examples/train_sharded.py --layout tp --mesh 2x4
    # two processes of two CPU devices each, one 4-device mesh:
    python examples/train_sharded.py --cpu-devices 2 --num-processes 2 \\
        --process-id 0 --coordinator 127.0.0.1:12355 &
    python examples/train_sharded.py --cpu-devices 2 --num-processes 2 \\
        --process-id 1 --coordinator 127.0.0.1:12355

Layouts (the mesh has axes data x model):
  data  parameters and optimizer state replicated, batch split over data
  fsdp  parameters and optimizer state sharded over data as well (each
        tensor along its largest dimension that divides evenly)
  tp    tensor parallel: attention heads and MLP columns split over model
        (Megatron style), batch over data
The mesh is jax.make_mesh's; parameters and optimizer state get a
NamedSharding from the layout's rules (jit out_shardings), activations a
with_sharding_constraint. A scanned model's stacked layer axis stays whole.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402


def mesh_shape(text: str) -> tuple:
    parts = text.lower().split("x")
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        shape = ()
    if len(shape) != 2 or min(shape) < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a mesh: give DATAxMODEL, e.g. 8x1 or 4x2")
    return shape


def parser() -> argparse.ArgumentParser:
    import _lm
    p = argparse.ArgumentParser(
        prog="train_sharded.py", description=__doc__,
        formatter_class=_lm.Formatter)
    s = p.add_argument_group("sharding")
    s.add_argument("--layout", default="fsdp", choices=list(_lm.LAYOUTS),
                   help="how parameters and activations are laid out "
                        "(default: fsdp)")
    s.add_argument("--mesh", type=mesh_shape, default=None,
                   metavar="DATAxMODEL",
                   help="mesh shape (default: all devices on data; tp puts "
                        "2 or 4 on model)")
    s.add_argument("--cpu-devices", type=_lm.positive_int, default=8,
                   help="virtual CPU devices per process on the CPU "
                        "(default: 8)")
    s.add_argument("--num-processes", type=_lm.positive_int, default=1,
                   help="processes of one jax.distributed run, gloo "
                        "collectives on the CPU (default: 1)")
    s.add_argument("--process-id", type=int, default=0,
                   help="this process's index (default: 0)")
    s.add_argument("--coordinator", default="127.0.0.1:12355",
                   metavar="HOST:PORT",
                   help="jax.distributed coordinator, served by process 0 "
                        "(default: 127.0.0.1:12355)")
    _lm.add_args(p)
    return p


def valid_meshes(devices: int) -> str:
    return ", ".join(f"{d}x{devices // d}" for d in range(devices, 0, -1)
                     if devices % d == 0)


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    import _lm
    _lm.check_args(p, args)
    if args.mesh is not None and args.layout == "tp" and args.mesh[1] == 1:
        p.error(f"--layout tp --mesh {args.mesh[0]}x1 has a model axis of "
                "1, so it splits nothing and is the data layout: give the "
                "model axis 2 or more (e.g. --mesh "
                f"{max(1, args.mesh[0] // 2)}x2) or use --layout data")
    if not 0 <= args.process_id < args.num_processes:
        p.error(f"--process-id {args.process_id} is not below "
                f"--num-processes {args.num_processes}: use 0 to "
                f"{args.num_processes - 1}")
    status = _common.start(args.jaxlake, args.jaxlake_option)
    if args.trace_per_tensor:
        # XLA reads its dump flags once, when jax starts, and this script
        # starts jax to build its mesh before the recorder exists.
        import jaxlake
        jaxlake.enable_per_tensor_dumps()
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = (
            f"{flags} --xla_force_host_platform_device_count="
            f"{args.cpu_devices}").strip()
    import jax
    if args.num_processes > 1:
        if jax.config.jax_platforms in (None, "", "cpu"):
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address=args.coordinator,
                                   num_processes=args.num_processes,
                                   process_id=args.process_id)
    devices = _lm.start_backends()
    count = len(devices)
    shape = args.mesh
    if shape is None:
        model = 1
        if args.layout == "tp":
            model = next((m for m in (4, 2) if count % m == 0), 1)
        shape = (count // model, model)
    if shape[0] * shape[1] != count:
        p.error(f"--mesh {shape[0]}x{shape[1]} needs {shape[0] * shape[1]} "
                f"devices, but there are {count}: use a mesh whose sizes "
                f"multiply to {count}: {valid_meshes(count)}")
    preset = _lm.PRESETS[args.preset]
    if args.layout == "tp" and (preset.heads % shape[1]
                                or preset.d_ff % shape[1]):
        fits = [m for m in range(1, count + 1) if count % m == 0
                and preset.heads % m == 0 and preset.d_ff % m == 0]
        p.error(f"--layout tp splits {preset.heads} heads and an MLP of "
                f"{preset.d_ff} over the model axis, and a model axis of "
                f"{shape[1]} does not divide them: use a --mesh whose model "
                f"size is one of {fits}")
    if args.layout == "tp" and shape[1] == 1:
        p.error(f"--layout tp needs a model axis of 2 or more, and "
                f"{count} device(s) give none: use --layout data")
    mesh = jax.make_mesh(shape, ("data", "model"),
                         axis_types=(jax.sharding.AxisType.Auto,) * 2)
    main_process = jax.process_index() == 0
    if main_process:
        print(f"mesh data={shape[0]} x model={shape[1]} over {count} "
              f"{devices[0].platform} devices in {jax.process_count()} "
              f"process(es); layout {args.layout}")
    setup = _lm.Setup(
        mesh=mesh, layout=args.layout, is_main=main_process,
        trace_extra=(args.layout, f"{count}dev"),
        meta={"layout": args.layout, "processes": args.num_processes,
              "trace_device": 0})
    summary = _lm.train(args, setup)
    if "trace" in summary:
        print(summary["trace"])
    _common.finish(status, args.log_json if main_process else None)
    if args.num_processes > 1:
        jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
