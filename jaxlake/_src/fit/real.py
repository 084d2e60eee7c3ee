"""`jaxlake fit`'s real runs: the program itself on one of XLA's own
allocators, over a fake device of the GPU's memory.

A model policy replays a recorded trace; a real policy runs the unmodified
command under `jaxlake run --fake-gpu --no-lake` with one allocator
configuration of XLA's GPU client (JAX's variables and XLA flags), on a
fake device holding exactly the GPU's memory. No model is involved: the
program either ends well (it fits) or XLA's own out-of-memory error ends
it. Each (configuration, value) costs one program run; configurations that
set the same variables and flags share their runs, and a value whose
recording already ran out of a fake device several times the GPU's is out
of memory for every policy without a run.

JAX's default GPU allocator, version by version, is in docs/xla_defaults.md;
jax_default() names it for the installed jax.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
from typing import (Dict, FrozenSet, List, Mapping, Optional, Sequence,
                    TextIO, Tuple)

from jaxlake._src.fit import engine as _engine
from jaxlake._src.fit.search import FitError

#: A real policy's name starts with this; the rest are models (replays).
PREFIX = "real:"

#: The variables through which JAX (0.10 to 0.12) and XLA configure the
#: GPU client's allocator. A real run removes them all from the program's
#: environment, then sets its own policy's.
ALLOCATOR_VARIABLES = (
    "XLA_PYTHON_CLIENT_ALLOCATOR", "XLA_PYTHON_CLIENT_PREALLOCATE",
    "XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "TF_GPU_ALLOCATOR", "TF_FORCE_UNIFIED_MEMORY",
    "JAXLAKE",
)

#: XLA flags that choose or shape the allocator: removed from the
#: program's XLA_FLAGS before a real policy adds its own.
ALLOCATOR_FLAGS = (
    "xla_gpu_enable_allocator_spatial_partitioning",
    "xla_gpu_memory_fraction_policy",
)


@dataclasses.dataclass(frozen=True)
class RealPolicy:
    """One allocator configuration of XLA's GPU client."""

    name: str
    env: Tuple[Tuple[str, str], ...]
    flags: Tuple[str, ...]
    doc: str
    # What the installed JAX must have for it: an XLA_PYTHON_CLIENT_
    # ALLOCATOR kind that jaxlib accepts, or an XLA flag the CUDA plugin
    # knows.
    allocator: Optional[str] = None
    flag: Optional[str] = None
    # A PJRT create option the plugin must know (found in its binary).
    option: Optional[str] = None
    # The lake serves XLA's pool (`jaxlake run --fake-gpu` without
    # --no-lake): the lake's own real run, against which the others'
    # real runs are compared.
    lake: bool = False
    # Driver entry points the allocator calls that the fake GPU must
    # implement (not only stub).
    fake_needs: Tuple[str, ...] = ()

    def key(self, fraction: Optional[float]) -> Tuple[object, ...]:
        """What its runs depend on: policies with the same key share them.
        XLA_PYTHON_CLIENT_ALLOCATOR=bfc is the allocator nothing set picks
        (the "default" kind is BFC on CUDA in every jax whose default was
        checked, jax_default()), so it shares JAX's default's runs there."""
        env = self.env
        if env == (("XLA_PYTHON_CLIENT_ALLOCATOR", "bfc"),) and \
                jax_default().known:
            env = ()
        return (env, self.flags, fraction, self.lake)


SPATIAL_FLAG = "--xla_gpu_enable_allocator_spatial_partitioning=true"

#: The lake's real run.
LAKE = "real:jaxlake"

POLICIES: Tuple[RealPolicy, ...] = (
    RealPolicy(LAKE, (), (),
               "the lake, run for real: `jaxlake run --fake-gpu` with the "
               "lake serving XLA's pool (capacity: the lake's capacity "
               "option, else XLA's fraction when given, else the whole "
               "device)", lake=True),
    RealPolicy("real:jax-default", (), (),
               "JAX's default: no allocator variable or flag set"),
    RealPolicy("real:bfc", (("XLA_PYTHON_CLIENT_ALLOCATOR", "bfc"),), (),
               "XLA's BFC, named (XLA_PYTHON_CLIENT_ALLOCATOR=bfc), "
               "preallocated as by default"),
    RealPolicy("real:bfc-growth",
               (("XLA_PYTHON_CLIENT_PREALLOCATE", "false"),), (),
               "XLA's BFC with preallocation off "
               "(XLA_PYTHON_CLIENT_PREALLOCATE=false): regions that grow "
               "on demand (its model is bfc, not bfc-growth)"),
    RealPolicy("real:cuda-async",
               (("XLA_PYTHON_CLIENT_ALLOCATOR", "cuda_async"),), (),
               "the driver's stream-ordered pool "
               "(XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async)",
               allocator="cuda_async"),
    RealPolicy("real:vmm", (("XLA_PYTHON_CLIENT_ALLOCATOR", "vmm"),), (),
               "XLA's VMM allocator (XLA_PYTHON_CLIENT_ALLOCATOR=vmm)",
               allocator="vmm", fake_needs=("cuStreamWriteValue64",)),
    RealPolicy("real:platform",
               (("XLA_PYTHON_CLIENT_ALLOCATOR", "platform"),), (),
               "no pool: each buffer from the driver "
               "(XLA_PYTHON_CLIENT_ALLOCATOR=platform)",
               allocator="platform"),
    RealPolicy("real:address",
               (("XLA_PYTHON_CLIENT_ALLOCATOR", "address"),), (),
               "XLA's synchronous pass-through allocator "
               "(XLA_PYTHON_CLIENT_ALLOCATOR=address)",
               allocator="address"),
    RealPolicy("real:spatial", (), (SPATIAL_FLAG,),
               "XLA's spatially partitioned BFC (--xla_gpu_enable_"
               "allocator_spatial_partitioning=true)",
               flag="xla_gpu_enable_allocator_spatial_partitioning"),
    RealPolicy("real:spatial-grow",
               (("JAX_PJRT_CLIENT_CREATE_OPTIONS",
                 "memory_fraction_policy:0.75+"),), (SPATIAL_FLAG,),
               "the spatial BFC preallocating 0.75 and growing to all "
               "memory (the create option memory_fraction_policy=0.75+, "
               "through JAX_PJRT_CLIENT_CREATE_OPTIONS)",
               flag="xla_gpu_enable_allocator_spatial_partitioning",
               option="memory_fraction_policy"),
)
BY_NAME: Dict[str, RealPolicy] = {p.name: p for p in POLICIES}


def is_real(name: str) -> bool:
    return name.startswith(PREFIX)


# -- what the installed JAX has ----------------------------------------------


def accepted_allocators() -> Optional[Tuple[str, ...]]:
    """The XLA_PYTHON_CLIENT_ALLOCATOR kinds the installed jaxlib accepts
    (read from its xla_client.py, which checks them), or None when jaxlib
    is not installed."""
    try:
        spec = importlib.util.find_spec("jaxlib.xla_client")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not os.path.isfile(spec.origin):
        return None
    with open(spec.origin, encoding="utf-8") as f:
        text = f.read()
    at = text.find("def generate_pjrt_gpu_plugin_options")
    body = text[at:at + 4000] if at >= 0 else ""
    kinds = ("default", "platform", "bfc", "cuda_async", "vmm", "address")
    return tuple(k for k in kinds if re.search(rf"['\"]{k}['\"]", body))


def plugin_flags() -> Optional[FrozenSet[str]]:
    """The XLA flags the installed CUDA plugin knows, or None."""
    from jaxlake._src.xla import plugin
    info = plugin.installed_plugin()
    return None if info is None else info.flags


def plugin_has(text: str) -> Optional[bool]:
    """Whether the installed CUDA plugin's binary holds `text` (a create
    option's name), or None without a plugin."""
    from jaxlake._src.xla import plugin
    path = plugin.plugin_library()
    if path is None:
        return None
    import mmap
    with open(path, "rb") as f, \
            mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return data.find(b"\x00" + text.encode()) >= 0


def fake_stubs(names: Sequence[str]) -> List[str]:
    """Those of `names` that the fake GPU only stubs (weak symbols of its
    library, which answer "not supported"), read with `nm -D`; none when
    nm or the library is missing."""
    import shutil
    import subprocess
    from jaxlake._src.xla import fakegpu
    nm, lib = shutil.which("nm"), fakegpu.library_path()
    if not names or nm is None or not os.path.isfile(lib):
        return []
    try:
        out = subprocess.run([nm, "-D", lib], capture_output=True, text=True,
                             timeout=60, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    kinds = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3:
            kinds[parts[2]] = parts[1]
    return [n for n in names if kinds.get(n) in ("W", "w")]


def unavailable(policy: RealPolicy,
                allocators: Optional[Sequence[str]] = None,
                flags: Optional[FrozenSet[str]] = None) -> Optional[str]:
    """Why the installed JAX cannot run `policy`, or None."""
    stubbed = fake_stubs(policy.fake_needs)
    if stubbed:
        return ("XLA's allocator calls " + ", ".join(stubbed) + ", which "
                "the fake GPU does not implement")
    if policy.option is not None and plugin_has(policy.option) is False:
        return f"the installed CUDA plugin has no create option " \
            f"{policy.option}"
    if policy.allocator is not None:
        kinds = accepted_allocators() if allocators is None else allocators
        if kinds is not None and policy.allocator not in kinds:
            return (f"the installed jaxlib has no "
                    f"XLA_PYTHON_CLIENT_ALLOCATOR={policy.allocator} (it "
                    "accepts " + ", ".join(kinds) + ")")
    if policy.flag is not None:
        known = plugin_flags() if flags is None else flags
        if known is not None and policy.flag not in known:
            return (f"the installed CUDA plugin has no --{policy.flag}")
    return None


def available_names() -> List[str]:
    """The real policies the installed JAX can run, in table order."""
    allocators, flags = accepted_allocators(), plugin_flags()
    return [p.name for p in POLICIES
            if unavailable(p, allocators, flags) is None]


@dataclasses.dataclass(frozen=True)
class JaxDefault:
    """JAX's default GPU allocator for one jax version, as read from its
    source and confirmed on the fake GPU (docs/xla_defaults.md)."""

    jax: str
    known: bool         # the version lies in the range that was read
    text: str           # for people
    model: str          # the model policy that replays it
    real: str = "real:jax-default"


#: jax 0.10.0 to 0.12.0.1: BFC, preallocated, a fixed 0.75 of the device
#: (docs/xla_defaults.md gives the sources).
DEFAULT_TEXT = "XLA's BFC, preallocated, a fixed 0.75 of the device"
MODEL = "bfc-prealloc"


def installed_jax() -> Optional[str]:
    from importlib import metadata
    try:
        return metadata.version("jax")
    except metadata.PackageNotFoundError:
        return None


def jax_default(version: Optional[str] = None) -> JaxDefault:
    """JAX's default GPU allocator for `version` (the installed jax's
    when None)."""
    from jaxlake._src.xla import plugin
    v = installed_jax() if version is None else version
    if v is None:
        return JaxDefault("none", False, DEFAULT_TEXT + " (as in jax 0.10 "
                          "to 0.12; jax is not installed)", MODEL)
    release = plugin._release(v)  # pylint: disable=protected-access
    lo = plugin._release(plugin.TESTED_JAX[0])  # pylint: disable=protected-access
    hi = plugin._release(plugin.TESTED_JAX[1])  # pylint: disable=protected-access
    if lo <= release <= hi:
        return JaxDefault(v, True, DEFAULT_TEXT, MODEL)
    return JaxDefault(v, False, DEFAULT_TEXT + f" (as in jax 0.10 to 0.12; "
                      f"jax {v} was not checked)", MODEL)


# -- one run ---------------------------------------------------------------------


def run_environment(environ: Mapping[str, str], policy: RealPolicy,
                    fraction: Optional[float]) -> Dict[str, str]:
    """The program's environment for a real run of `policy`: the
    allocator variables and flags of `environ` removed, the policy's set,
    and XLA_CLIENT_MEM_FRACTION when the fit has a fraction of its own."""
    env = {k: v for k, v in environ.items() if k not in ALLOCATOR_VARIABLES}
    env.update(dict(policy.env))
    if fraction is not None:
        env["XLA_CLIENT_MEM_FRACTION"] = repr(fraction)
    kept = [t for t in environ.get("XLA_FLAGS", "").split()
            if t.lstrip("-").partition("=")[0] not in ALLOCATOR_FLAGS]
    flags = kept + list(policy.flags)
    if flags:
        env["XLA_FLAGS"] = " ".join(flags)
    else:
        env.pop("XLA_FLAGS", None)
    platforms = env.get("JAX_PLATFORMS", "")
    if platforms and not any(p.strip() in ("cuda", "gpu")
                             for p in platforms.split(",")):
        env.pop("JAX_PLATFORMS")  # this shell's cpu would keep it off
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def command(argv: Sequence[str], gpu: _engine.Gpu,
            lake: bool = False) -> List[str]:
    """`jaxlake run` on fake devices of exactly the GPU's memory (as many
    as gpu.count), with XLA's own allocator (with the lake when `lake`)."""
    return [*_engine.jaxlake_command(), "run",
            *gpu.fake_gpu_options(gpu.memory),
            *([] if lake else ["--no-lake"]), "--", *argv]


_OOM_LINE = re.compile(r"RESOURCE_EXHAUSTED|CUDA_ERROR_OUT_OF_MEMORY|"
                       r"[Oo]ut of memory")


@dataclasses.dataclass
class Outcome:
    """One real run's verdict."""

    fits: bool
    request: Optional[int] = None     # the failed request, when XLA says
    message: str = ""                 # XLA's line, when out of memory
    seconds: float = 0.0
    # Beside a first job (run_beside()): the first failed while it ran.
    first_failed: bool = False


def out_of_memory(output: str) -> Optional[str]:
    """XLA's out-of-memory line in a failed run's output, or None when the
    failure was something else."""
    if "RESOURCE_EXHAUSTED" not in output and \
            "CUDA_ERROR_OUT_OF_MEMORY" not in output:
        return None
    for line in output.splitlines():
        if _OOM_LINE.search(line) and ("RESOURCE_EXHAUSTED" in line
                                       or "OUT_OF_MEMORY" in line):
            return line.strip()[:300]
    return "RESOURCE_EXHAUSTED"


#: XLA's VMM allocator's refusal: "Not enough PA budget for allocation:
#: pa_allocated=...B, rounded_size=...B, pa_budget=...B".
_VMM_OOM = re.compile(r"Not enough PA budget for allocation:.*?"
                      r"rounded_size=([0-9]+)B")


def request_size(output: str) -> Optional[int]:
    """The bytes of the request XLA's allocator could not serve, where its
    message gives them: BFC's "trying to allocate 384.00MiB", the VMM
    allocator's "rounded_size=...B"."""
    _, request = _engine.out_of_memory(output)
    if request is not None:
        return request
    match = _VMM_OOM.search(output)
    return int(match.group(1)) if match else None


def run_once(argv: Sequence[str], gpu: _engine.Gpu, policy: RealPolicy,
             fraction: Optional[float], log: str, label: str,
             progress: Optional[TextIO]) -> Outcome:
    """Runs the program once under `policy`. FitError when it fails for
    another reason than memory (FakeGpuUnavailable when the fake cannot
    start)."""
    cmd = command(argv, gpu, policy.lake)
    env = _engine.fresh_compile(run_environment(os.environ, policy,
                                                fraction))
    with _engine.Progress(progress, label) as p:
        code = _engine.run_command(cmd, log, env)
        output = _engine.tail(log, 400)
        if code == 0:
            p.finish("fits")
            return Outcome(True, seconds=p.elapsed)
        problem = _engine.fake_gpu_problem(output)
        if problem is not None:
            p.finish("fake GPU unavailable")
            raise _engine.FakeGpuUnavailable(problem)
        line = out_of_memory(output)
        if line is not None:
            p.finish("out of memory")
            return Outcome(False, request_size(output), line, p.elapsed)
        p.finish(f"failed (exit status {code})")
        raise FitError(
            f"{label}: the command failed with exit status {code}, not out "
            "of memory: " + " ".join(cmd) + "\nits last lines (all of it "
            f"in {log}):\n" + "\n".join(
                output.splitlines()[-_engine.TAIL_LINES:]))


# -- beside a first job (`jaxlake fit --beside`) -----------------------------


def run_beside(argv: Sequence[str], first: Sequence[str], gpu: _engine.Gpu,
               policy: RealPolicy, fraction: Optional[float], logdir: str,
               tag: str, label: str, progress: Optional[TextIO],
               ready_lines: int = 2, wait: float = 30.0,
               timeout: float = 3600.0) -> Outcome:
    """Runs the program `argv` beside the first job `first`, both under
    `policy` on one shared fake device of the GPU's memory (beside.py):
    the first starts alone, the program runs once the first is under way,
    then the first is stopped. It fits when the program ends well and the
    first has not failed. FitError when the first fails alone or the
    program fails for another reason than memory; FakeGpuUnavailable when
    the fake cannot start."""
    from jaxlake._src.fit import beside
    name = beside.shared_name("fit")
    shared = ["--fake-gpu-shared", name]

    def cmd(program: Sequence[str]) -> List[str]:
        return [*_engine.jaxlake_command(), "run",
                *gpu.fake_gpu_options(gpu.memory), *shared,
                *([] if policy.lake else ["--no-lake"]), "--", *program]

    env = _engine.fresh_compile(run_environment(os.environ, policy,
                                                fraction))
    with _engine.Progress(progress, label) as p:
        try:
            r = beside.run_pair(cmd(first), env, cmd(argv), env, logdir,
                                tag, ready_lines=ready_lines, settle=wait,
                                timeout=timeout)
        except beside.FirstFailed as e:
            problem = _engine.fake_gpu_problem(e.output)
            p.finish("the first job failed alone")
            if problem is not None:
                raise _engine.FakeGpuUnavailable(problem) from None
            raise
        finally:
            beside.remove_shared(name)
        if r.fits:
            p.finish("fits")
            return Outcome(True, seconds=p.elapsed)
        if r.second_code != 0:
            line = out_of_memory(r.second_output)
            if line is not None:
                p.finish("out of memory")
                return Outcome(False, request_size(r.second_output), line,
                               p.elapsed)
            problem = _engine.fake_gpu_problem(r.second_output)
            if problem is not None:
                p.finish("fake GPU unavailable")
                raise _engine.FakeGpuUnavailable(problem)
            p.finish(f"failed (exit status {r.second_code})")
            raise FitError(
                f"{label}: the command failed with exit status "
                f"{r.second_code}, not out of memory: " + " ".join(cmd(argv))
                + f"\nits last lines (all of it in {logdir}/{tag}-second"
                ".log):\n" + "\n".join(r.second_output.strip().splitlines()
                                        [-_engine.TAIL_LINES:]))
        p.finish("the first job failed")
        return Outcome(False, None, "first job: " + beside.why(
            r.first_output), p.elapsed, first_failed=True)
