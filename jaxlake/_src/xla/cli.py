"""`jaxlake run` and `jaxlake doctor`."""

from __future__ import annotations

import argparse
import os
import platform
import sys
from importlib import metadata
from typing import Any, Dict, List, Optional, TextIO, Tuple

from jaxlake._src.xla import fakegpu
from jaxlake._src.xla import integration as xla
from jaxlake._src.xla import plugin
from jaxlake._src.xla import startup
from jaxlake._src import options as _options
from jaxlake._src.errors import ConfigurationError

JAX_DISTRIBUTIONS = ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt",
                     "jax-cuda13-plugin", "jax-cuda13-pjrt", "flax", "optax",
                     "orbax-checkpoint")


def register(commands: Any) -> None:
    """Adds the subcommands to the `jaxlake` parser."""
    run = commands.add_parser(
        "run", help="run a program with the lake preloaded (LD_PRELOAD)",
        description="Runs COMMAND with jaxlake's libcuda.so.1 preloaded, so "
                    "every JAX process it starts allocates device memory "
                    "from the lake. Options come from JAXLAKE_<OPTION> "
                    "variables and --jaxlake_<option> entries in XLA_FLAGS "
                    "(see `jaxlake options`).")
    run.add_argument("--required", action="store_true",
                     help="fail (exit status 1, the program not run) instead "
                          "of running without the lake when it cannot be "
                          "active: a bad option, no CUDA driver")
    run.add_argument("--trace", metavar="PATH",
                     help="write the allocation trace (JSON lines; gzip "
                          "when PATH ends in .gz) to PATH")
    run.add_argument("--quiet", action="store_true",
                     help="no lake report at exit (by default each process "
                          "that allocated from a device's pool prints, on "
                          "stderr as it exits, per device: allocations "
                          "served, forwarded and captured, peak in use, "
                          "peak reserved, U and stitches)")
    run.add_argument("--fake-gpu", nargs="?", const="h100", metavar="MODEL",
                     help="run on XLA's real GPU client over jaxlake's fake "
                          "GPU, with no GPU here: h100 (default) or h200; "
                          "kernels do not run (docs/fakegpu.md)")
    run.add_argument("--fake-gpu-count", metavar="N", default="1",
                     help="fake devices (default 1)")
    run.add_argument("--fake-gpu-memory", metavar="SIZE",
                     help="memory of each fake device (default: the "
                          "model's, 80GiB or 141GiB)")
    run.add_argument("--fake-gpu-shared", metavar="NAME",
                     help="with --fake-gpu: the fake devices' memory "
                          "accounting is shared with every other process "
                          "run with the same NAME (POSIX shared memory), "
                          "as processes sharing one GPU see it: free "
                          "memory and out-of-memory count every process's "
                          "bytes; each process's memory contents stay its "
                          "own. Every process must give the same model, "
                          "count and memory")
    run.add_argument("--no-lake", action="store_true",
                     help="with --fake-gpu: leave the lake out and run on "
                          "XLA's own allocator as the program's settings "
                          "choose it (XLA_PYTHON_CLIENT_ALLOCATOR, "
                          "_PREALLOCATE, XLA_CLIENT_MEM_FRACTION, XLA_FLAGS; "
                          "JAX's default when none is set): nothing is "
                          "forced, and the shim only forwards")
    run.add_argument("argv", nargs=argparse.REMAINDER, metavar="COMMAND",
                     help="the program and its arguments (after --)")
    run.set_defaults(func=_run)
    doctor = commands.add_parser(
        "doctor", help="check versions, the driver, VMM support and hooks",
        description="Prints what the lake needs and what it finds: the "
                    "versions of jaxlake, Python, JAX and its CUDA plugins, "
                    "Flax, Optax and Orbax; the shim; the CUDA driver and "
                    "whether each device supports virtual memory management; "
                    "settings that would take allocations away from the "
                    "lake; whether it is active and, by running one small "
                    "JAX operation, whether XLA's allocations reach it.")
    doctor.add_argument("--no-jax", action="store_true",
                        help="do not start JAX to check the hooks")
    doctor.add_argument("--fake-gpu", nargs="?", const="h100",
                        metavar="MODEL",
                        help="check over jaxlake's fake GPU (h100 or h200), "
                             "as `jaxlake run --fake-gpu` runs a program")
    doctor.set_defaults(func=_doctor)


#: Set to 1 by `jaxlake run` (0 with --quiet): the shim prints its report
#: per device on stderr when a process exits (cc/shim/options.h).
EXIT_REPORT_ENV = "JAXLAKE_EXIT_REPORT"


def no_lake_environment(environ: Dict[str, str], fake: Dict[str, str]
                        ) -> Dict[str, str]:
    """The environment of `jaxlake run --fake-gpu --no-lake`: the fake GPU
    under XLA's own allocator, configured as the program's environment
    configures it (nothing forced). The shim stays libcuda.so.1 in the
    fake's folder, forwarding every call (JAXLAKE_SHIM_HOOKS=0); the lake's
    own settings (JAXLAKE=1, --jaxlake_* entries of XLA_FLAGS, which XLA
    would refuse) are taken out."""
    env = dict(environ)
    env.update(fake)
    xla.strip_xla_flags(env)
    env.pop(xla.ENABLE_ENV, None)
    env.pop(xla.TRACE_ENV, None)
    env[xla.HOOKS_ENV] = "0"
    return env


def run_environment(environ: Dict[str, str], trace: Optional[str],
                    fake: Optional[Dict[str, str]] = None,
                    report: bool = True) -> Dict[str, str]:
    """The environment `jaxlake run` gives the program (over the fake GPU
    when `fake` holds its variables, fakegpu.environment()); `report`: the
    report at exit. Raises ConfigurationError for a bad option or when no
    driver is found."""
    env = dict(environ)
    if fake is not None:
        env.update(fake)
    resolved, trace, _ = xla.resolve_settings(env, {}, trace, False)
    xla.capacity_rule(resolved, env)  # a bad or doubled XLA memory fraction
    driver, why = xla.find_real_driver(env)
    if driver is None:
        raise ConfigurationError(why)
    shim = xla.shim_path()
    if not os.path.isfile(shim):
        raise ConfigurationError(f"this build of jaxlake has no CUDA shim "
                                 f"({shim} is missing)")
    shim_env = xla.shim_environment(resolved, driver, trace)
    if xla.FRACTION_ENV not in shim_env:
        env.pop(xla.FRACTION_ENV, None)
    env.update(shim_env)
    preload = env.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = shim + (" " + preload if preload else "")
    env[xla.ALLOCATOR_ENV] = "cuda_async"
    env[xla.PREALLOCATE_ENV] = "false"
    env[xla.ENABLE_ENV] = "1"
    env[EXIT_REPORT_ENV] = "1" if report else "0"
    env["XLA_FLAGS"] = xla.with_memory_limit(env.get("XLA_FLAGS", ""),
                                             resolved, env)
    return env


def _run(args: argparse.Namespace) -> int:
    argv: List[str] = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        print("jaxlake run: give the program to run, e.g. "
              "`jaxlake run -- python train.py`", file=sys.stderr)
        return 2
    fake: Optional[Dict[str, str]] = None
    notice = ""
    if args.fake_gpu is not None or args.fake_gpu_memory is not None:
        try:
            fake, notice = fakegpu.environment(
                dict(os.environ), fakegpu.parse_model(args.fake_gpu or "h100"),
                fakegpu.parse_count(args.fake_gpu_count),
                fakegpu.parse_memory(args.fake_gpu_memory)
                if args.fake_gpu_memory is not None else None,
                shared=fakegpu.parse_shared(args.fake_gpu_shared)
                if args.fake_gpu_shared is not None else None)
        except ConfigurationError as error:
            # Without the fake there is no GPU to run on: never run anyway.
            print(f"jaxlake run: error: {error}", file=sys.stderr)
            return 1
    elif args.fake_gpu_count != "1":
        print("jaxlake run: --fake-gpu-count needs --fake-gpu",
              file=sys.stderr)
        return 2
    elif args.fake_gpu_shared is not None:
        print("jaxlake run: --fake-gpu-shared needs --fake-gpu",
              file=sys.stderr)
        return 2
    if args.no_lake:
        if fake is None:
            print("jaxlake run: --no-lake needs --fake-gpu (without the "
                  "fake GPU and the lake, run the program directly)",
                  file=sys.stderr)
            return 2
        if args.trace is not None:
            print("jaxlake run: --trace needs the lake (the lake writes the "
                  "trace); leave out --no-lake or --trace", file=sys.stderr)
            return 2
        env = no_lake_environment(dict(os.environ), fake)
        return _exec(argv, env, notice + "jaxlake run: no lake: XLA's own "
                     "allocator, as the program's settings choose it\n")
    try:
        env = run_environment(dict(os.environ), args.trace, fake,
                              report=not args.quiet)
    except ConfigurationError as error:
        if fake is not None:
            print(f"jaxlake run: error: {error}", file=sys.stderr)
            return 1
        if args.required:
            print(f"jaxlake run: error: {error}\njaxlake run: --required: "
                  "the program was not run", file=sys.stderr)
            return 1
        sys.stderr.write(f"jaxlake run: {error}\n" + startup.without_lake(
            "jaxlake run", "--required"))
        return _run_without_lake(argv, str(error))
    return _exec(argv, env, notice)


def _exec(argv: List[str], env: Dict[str, str], notice: str) -> int:
    """Replaces this process by the program (127 when it cannot start)."""
    sys.stderr.write(notice)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as error:
        print(f"jaxlake run: cannot run {argv[0]!r}: {error}",
              file=sys.stderr)
        return 127
    return 0  # not reached


def _run_without_lake(argv: List[str], reason: str) -> int:
    """Runs the program as a child (not exec: the warning is said again
    when it ends) and returns its exit status (128 + N when signal N ended
    it, as a shell reports)."""
    import signal
    import subprocess
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        child = subprocess.Popen(argv)
    except OSError as error:
        print(f"jaxlake run: cannot run {argv[0]!r}: {error}",
              file=sys.stderr)
        return 127
    # Ctrl-C reaches the child from the terminal; this process waits for it.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        code = child.wait()
    finally:
        signal.signal(signal.SIGINT, previous)
    sys.stderr.write(startup.reminder(reason))
    return 128 - code if code < 0 else code


#: The values of XLA's xla_gpu_command_buffer_update_mode when no CUDA
#: plugin is installed to read them from (jax 0.11 and 0.12); any but
#: ALWAYS_UPDATE makes XLA switch the allocator to its own VMM allocator.
#: update_modes() gives the installed plugin's own.
UPDATE_MODES = plugin.DEFAULT_UPDATE_MODES


def update_modes() -> Tuple[str, ...]:
    """The installed CUDA plugin's CommandBufferUpdateMode values."""
    return plugin.update_modes()


def setting_warnings(environ: Dict[str, str]) -> List[str]:
    """Settings that take allocations away from the lake, each XLA flag
    checked against the installed plugin's flags and update modes."""
    _, flags = xla._xla_flag_values(  # pylint: disable=protected-access
        environ.get("XLA_FLAGS", ""))
    return plugin.routing_warnings(environ, flags,
                                   allocator_env=xla.ALLOCATOR_ENV,
                                   preallocate_env=xla.PREALLOCATE_ENV)


def _size(n: int) -> str:
    return _options.format_bytes(n)


def doctor(out: TextIO, start_jax: bool = True) -> int:
    """Prints what a user needs to know to get the lake working."""
    def line(key: str, value: object) -> None:
        out.write(f"{key + ':':<22} {value}\n")

    import jaxlake  # the installed package's version
    line("jaxlake", f"{jaxlake.__version__} ({os.path.dirname(jaxlake.__file__)})")
    line("python", f"{platform.python_version()} ({sys.executable})")
    line("machine", f"{platform.system()} {platform.machine()}")
    for dist in JAX_DISTRIBUTIONS:
        try:
            line(dist, metadata.version(dist))
        except metadata.PackageNotFoundError:
            if dist in ("jax", "jaxlib"):
                line(dist, "not installed")
    library = plugin.plugin_library()
    if library is not None:
        line("CUDA plugin", library)
    line("tested jax", f"{plugin.TESTED_JAX[0]} to {plugin.TESTED_JAX[1]}")
    for text in plugin.version_warnings():
        out.write(f"warning: {text}\n")
    shim = xla.shim_path()
    line("shim", shim if os.path.isfile(shim) else f"missing ({shim})")
    driver, why = xla.find_real_driver()
    line("CUDA driver", driver or f"not found: {why}")
    for text in setting_warnings(dict(os.environ)):
        out.write(f"warning: {text}\n")
    if xla.jax_backends_initialised():
        line("lake", "not checked: JAX is already running in this process")
        return 0
    try:
        status = xla.configure()
    except ConfigurationError as error:
        line("lake", f"cannot be configured here: {error}")
        return 0
    if status.driver_version:
        major, minor = divmod(status.driver_version // 10, 100)
        line("driver version", f"{status.driver_version} (CUDA {major}.{minor})")
    devices: List[xla.Device] = []
    loaded = xla._loaded_shim()  # pylint: disable=protected-access
    if status.active and loaded is not None:
        # doctor may initialise CUDA (configure() itself does not).
        devices, problem = xla.probe_devices(loaded)
        if problem:
            line("devices", problem)
    nbytes, fraction, source = xla.capacity_rule(status.options)
    rule = _size(nbytes) if nbytes is not None else \
        f"{fraction:g} of each device's memory"
    line("capacity", f"{rule} (from {source})" if source != xla.WHOLE_DEVICE
         else "the whole device (no capacity or memory fraction set: the "
         "lake grows on demand as XLA's cuda_async pool does)")
    for dev in devices:
        cap = xla.effective_capacity(status.options, dev.total_memory)
        line(f"device {dev.ordinal}",
             f"{_size(dev.total_memory)}, virtual memory management "
             f"{'supported' if dev.vmm else 'NOT supported'}"
             + (f"; lake capacity {_size(cap)}" if dev.vmm else ""))
    line("lake", "active" if status.active else f"inactive: {status.reason}")
    if not status.active or not start_jax:
        line("hooks live", "no" if not status.active else "not checked")
        return 0
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        line("hooks live", "not checked (jax is not installed)")
        return 0
    try:
        gpus = jax.devices("gpu")
        jnp.ones((1024, 1024), device=gpus[0]).block_until_ready()
    except Exception as error:  # pylint: disable=broad-except
        line("hooks live", f"no: JAX found no usable GPU ({error})")
        return 0
    served = sum(c.get("served", 0) for name, c in xla.hook_counts().items()
                 if name.startswith("cuMemAllocFromPoolAsync"))
    line("hooks live", f"yes ({served} allocations served by the lake)"
         if served else "no: XLA's allocations did not reach the lake "
         "(check the warnings above)")
    for ordinal in xla.devices():
        stats = loaded.stats(ordinal) if loaded is not None else None
        if stats:
            line(f"lake {ordinal} capacity", _size(int(stats["capacity"])))
    if xla.status().reason:
        line("lake notes", xla.status().reason)
    return 0


def _doctor(args: argparse.Namespace) -> int:
    if args.fake_gpu is not None:
        # The doctor itself, run as `jaxlake run --fake-gpu` runs a program.
        import subprocess
        # The launcher that ran this command (`python -m jaxlake` would
        # import a jaxlake source folder in the current directory first).
        me = [sys.argv[0]] if os.path.isfile(sys.argv[0]) and \
            os.access(sys.argv[0], os.X_OK) else [sys.executable, "-m",
                                                  "jaxlake"]
        # (--quiet: the doctor says what the hooks did itself.)
        command = me + ["run", f"--fake-gpu={args.fake_gpu}", "--quiet",
                        "--", *me,
                        "doctor"] + (["--no-jax"] if args.no_jax else [])
        sys.stdout.flush()
        return subprocess.call(command)
    return doctor(sys.stdout, start_jax=not args.no_jax)
