"""GPU-faithful allocation traces of a JAX program, recorded without a GPU.

Design note
-----------
A trace needs two things: the size of every device buffer, and when each is
allocated and freed. On a machine without a GPU the recorder gets them from
two places:

* Sizes come from a *device-less CUDA compile*. With jax-cuda12-plugin and
  jax-cuda12-pjrt installed (no NVIDIA driver or library needed),
  `jax.experimental.topologies.get_topology_desc(platform="cuda",
  target_config=SPEC, topology="1x1xN")` gives compile-only H100 devices.
  Each recorded function is lowered and compiled for them with the same
  argument shapes, dtypes and shardings as the real call, and the compiled
  executable's memory_analysis() gives the GPU buffer assignment (temp,
  output and alias bytes). CPU memory_analysis() is no proxy: it hides
  rematerialisation entirely (a 4-layer LM: 352 MB temp on the CPU with and
  without remat, 240 MB vs 70 MB for the H100 compile).
* Order and lifetimes come from running the program on the CPU: every array
  a recorded function returns is watched with weakref.finalize, so its free
  lands exactly where the program drops its last reference, as it would on
  the GPU.

The per-execution model, which is how XLA's GPU runtime allocates: before a
launch, host arguments (numpy arrays, Python scalars) are copied to fresh
device buffers; the launch allocates one buffer per output that does not
alias a donated input, a small tuple table (8 bytes per output) when there
is more than one output, and one temp buffer (all of XLA's temporaries
packed together); at the end of the launch it frees the temp and the tuple
table, and the buffers of donated inputs that no output took over. An output
that aliases a donated input takes over that input's allocation: no event.

Two variants:

* compile-only (`compile_only=True`): for models too big to run on the CPU
  (1B parameters and more) nothing executes. Recorded functions return
  `Abstract` placeholders (shape, dtype, sharding) built from the compiled
  executable, and the program's own Python drives the step sequence, so the
  lifetimes are those the program would give its arrays.
* per-tensor (`per_tensor=True`): the temp buffer is split into XLA's
  logical buffers, each allocated and freed at the positions its live range
  gives in the compiled schedule (read from XLA's *-buffer-assignment.txt
  and *-live-range.txt dumps). That is the shape of an eager (PyTorch-like)
  workload: many tensors of many sizes instead of one slab per launch.

Limits: operations run outside recorded functions (eager jnp calls, jax's
own small transfers) are not seen; collective-memory pools, NCCL/cuBLAS
workspaces and module constants stay outside the trace, as they stay outside
the lake (docs/design.md section 3); the compile uses XLA's defaults where a
real GPU would autotune, so temp sizes can differ a little from a real run.
One device's view is recorded (device 0 of the mesh): every device of an
SPMD program allocates the same sequence, shard sizes aside.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
import weakref
from contextlib import nullcontext
from typing import (Any, Callable, Dict, List, Mapping, Optional, Sequence,
                    Set, Tuple)

from jaxlake._src.options import format_bytes
# The device-less compile and what is read from XLA's dumps live apart;
# their names are the recorder's too.
from jaxlake._src.trace.gpu import (  # noqa: F401
    DEFAULT_TARGET, PLUGINS, RecorderError, _enable_dumps,
    enable_per_tensor_dumps, gpu_devices, plugin_problem, target_config,
    target_names)
from jaxlake._src.trace.xladump import (  # noqa: F401
    Executable, LogicalBuffer, _align, _hlo_aliases, _hlo_output_shapes,
    parse_buffer_assignment, shard_bytes)

#: Bytes per entry of the output tuple table XLA's GPU runtime allocates.
_TUPLE_ENTRY_BYTES = 8


class Abstract:
    """A placeholder array returned by recorded functions in compile-only
    mode: shape, dtype and (GPU) sharding, no data."""

    __slots__ = ("shape", "dtype", "sharding", "weak_type", "__weakref__")

    def __init__(self, shape: Sequence[int], dtype: Any, sharding: Any,
                 weak_type: bool = False) -> None:
        self.shape = tuple(shape)
        self.dtype = dtype
        self.sharding = sharding
        self.weak_type = weak_type

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __repr__(self) -> str:
        return f"Abstract({self.shape}, {self.dtype})"


def _replicated() -> Any:
    from jax.sharding import PartitionSpec
    spec: Any = PartitionSpec
    return spec()


def _sds(shape: Any, dtype: Any, **kwargs: Any) -> Any:
    import jax
    make: Any = jax.ShapeDtypeStruct
    return make(shape, dtype, **kwargs)


def _on_gpu(sharding: Any) -> bool:
    try:
        device = next(iter(sharding.device_set))
    except (AttributeError, StopIteration, TypeError):
        return False
    return getattr(device, "platform", "") in ("cuda", "gpu", "rocm")


@dataclasses.dataclass
class _Live:
    alloc_id: int
    finalizer: Any
    size: int


class Recorder:
    """Records the device allocations of a JAX program as a trace
    (docs/traces.md), GPU-faithful without a GPU.

        rec = Recorder("run.jsonl.gz", "lm-tiny", mesh=mesh)
        step = rec.wrap(jax.jit(step_fn, donate_argnums=(0, 1)), "train_step",
                        out_kinds=("param", "opt_state", "output"))
        params = rec.register(params, "param")
        for batch in batches:
            params, opt, loss = step(params, opt, rec.device_put(batch, spec))
        rec.close()

    `mesh`: the program's jax.sharding.Mesh (None: one device). The GPU
    compile uses a mesh of the same shape and axis names over compile-only
    devices of `target`. Functions given to wrap() must be jax.jit
    functions whose shardings are PartitionSpecs resolved against the
    context mesh (jax.set_mesh), or that take their layout from their
    arguments, so that the same function lowers for the GPU mesh.
    """

    def __init__(self, path: str, name: str, *, mesh: Any = None,
                 compile_only: bool = False, per_tensor: bool = False,
                 target: str = DEFAULT_TARGET,
                 meta: Optional[Mapping[str, Any]] = None) -> None:
        from jaxlake._src.trace.tracefile import TraceWriter
        self.compile_only = compile_only
        self.per_tensor = per_tensor
        self.target = target
        self.mesh = mesh
        self._dump_dir: Optional[str] = None
        self._dumps_seen = False
        if per_tensor:
            self._dump_dir = _enable_dumps()
        import jax
        import numpy as np
        from jax.sharding import Mesh
        count = 1 if mesh is None else int(mesh.devices.size)
        devices = gpu_devices(count, target)
        shape = (1,) if mesh is None else mesh.devices.shape
        names = ("_record",) if mesh is None else tuple(mesh.axis_names)
        self.gpu_mesh = Mesh(np.array(devices, dtype=object).reshape(shape),
                             names)
        info = {"recorder": "jaxlake", "target": target,
                "mode": "compile-only" if compile_only else "run",
                "variant": "per-tensor" if per_tensor else "per-execution",
                "jax": jax.__version__, "mesh": dict(
                    zip(names, (int(s) for s in shape)))}
        info.update(meta or {})
        self._writer: Any = TraceWriter(path, name, devices=1,
                                        source="recorder", meta=info)
        self.path = path
        self._lock = threading.RLock()
        self._next_id = 0
        self._live: Dict[int, _Live] = {}     # id(object) -> live record
        self._executables: Dict[Any, Executable] = {}
        self.live_bytes = 0
        self.peak_bytes = 0
        self.launches = 0
        self.compiles = 0
        self.compile_seconds = 0.0

    # -- events ----------------------------------------------------------

    def _alloc(self, size: int, kind: str) -> Optional[int]:
        with self._lock:
            if self._writer is None or size <= 0:
                return None
            alloc_id = self._next_id
            self._next_id += 1
            self._writer.alloc(alloc_id, size, kind=kind)
            self.live_bytes += size
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
            return alloc_id

    def _free(self, alloc_id: Optional[int], size: int) -> None:
        # Finalizers can run on other threads (an async checkpoint letting
        # go of an array), hence the lock.
        with self._lock:
            if self._writer is None or alloc_id is None:
                return
            self._writer.free(alloc_id)
            self.live_bytes -= size

    def _track(self, obj: Any, alloc_id: Optional[int], size: int) -> None:
        if alloc_id is None:
            return
        key = id(obj)
        finalizer = weakref.finalize(obj, self._on_dead, key, alloc_id, size)
        finalizer.atexit = False
        self._live[key] = _Live(alloc_id, finalizer, size)

    def _on_dead(self, key: int, alloc_id: int, size: int) -> None:
        live = self._live.get(key)
        if live is not None and live.alloc_id == alloc_id:
            del self._live[key]
        self._free(alloc_id, size)

    def _untrack(self, obj: Any) -> Optional[_Live]:
        live = self._live.pop(id(obj), None)
        if live is not None:
            live.finalizer.detach()
        return live

    def _is_array(self, x: Any) -> bool:
        import jax
        return isinstance(x, (jax.Array, Abstract))

    # -- arrays ----------------------------------------------------------

    def gpu_sharding(self, sharding: Any) -> Any:
        """The GPU-mesh sharding that stands for a program sharding."""
        from jax.sharding import NamedSharding, PartitionSpec
        if isinstance(sharding, PartitionSpec):
            return NamedSharding(self.gpu_mesh, sharding)
        if isinstance(sharding, NamedSharding):
            if sharding.mesh.devices.shape != self.gpu_mesh.devices.shape \
                    or tuple(sharding.mesh.axis_names) != \
                    tuple(self.gpu_mesh.axis_names):
                if sharding.mesh.devices.size == 1 and \
                        self.gpu_mesh.devices.size == 1:
                    return NamedSharding(self.gpu_mesh, _replicated())
                raise RecorderError(
                    f"an argument is sharded over mesh "
                    f"{dict(sharding.mesh.shape)}, but the recorder was "
                    f"made for mesh {dict(self.gpu_mesh.shape)}: pass the "
                    "program's mesh as Recorder(mesh=...)")
            if sharding.mesh is self.gpu_mesh:
                return sharding
            return NamedSharding(self.gpu_mesh, sharding.spec)
        if sharding is not None and _on_gpu(sharding) and \
                len(sharding.device_set) == self.gpu_mesh.devices.size:
            return sharding
        return NamedSharding(self.gpu_mesh, _replicated())

    def _size_of(self, x: Any) -> int:
        if isinstance(x, Abstract):
            return shard_bytes(x.shape, x.dtype, x.sharding)
        return shard_bytes(x.shape, x.dtype, self.gpu_sharding(x.sharding))

    def register(self, tree: Any, kind: str = "input") -> Any:
        """Records an allocation for every array of `tree` not yet seen
        (arrays the program made itself: restored checkpoints, device_put
        results); returns `tree`."""
        import jax
        for leaf in jax.tree.leaves(tree):
            if self._is_array(leaf) and id(leaf) not in self._live:
                size = self._size_of(leaf)
                self._track(leaf, self._alloc(size, kind), size)
        return tree

    def device_put(self, tree: Any, sharding: Any = None,
                   kind: str = "input") -> Any:
        """jax.device_put that the trace sees. `sharding`: a Sharding, a
        PartitionSpec (resolved against the recorder's mesh), or None;
        a pytree prefix of `tree` is accepted too. In compile-only mode
        nothing is copied and placeholders come back."""
        import jax
        import numpy as np
        from jax.sharding import NamedSharding, PartitionSpec

        def put(s: Any, sub: Any) -> Any:
            def one(x: Any) -> Any:
                if self.compile_only:
                    x = np.asarray(x) if not isinstance(x, Abstract) else x
                    return Abstract(x.shape, x.dtype, self.gpu_sharding(s))
                target = s
                if isinstance(s, PartitionSpec):
                    target = NamedSharding(self.mesh, s) if self.mesh \
                        is not None else None
                if target is not None and not isinstance(x, jax.Array):
                    # Works across processes too: each process gives the
                    # shards of the (same) host array that it holds.
                    host = np.asarray(x)
                    return jax.make_array_from_callback(
                        host.shape, target, lambda index: host[index])
                return jax.device_put(x, target)
            return jax.tree.map(one, sub)

        if sharding is None or isinstance(sharding, PartitionSpec) or \
                isinstance(sharding, jax.sharding.Sharding):
            out = put(sharding, tree)
        else:
            out = jax.tree.map(put, sharding, tree,
                               is_leaf=lambda x: x is None or isinstance(
                                   x, (PartitionSpec, jax.sharding.Sharding)))
        return self.register(out, kind)

    # -- launches --------------------------------------------------------

    def _abstract(self, x: Any) -> Any:
        import jax
        import numpy as np
        if isinstance(x, Abstract):
            return _sds(
                x.shape, x.dtype, sharding=self.gpu_sharding(x.sharding),
                weak_type=x.weak_type)
        if isinstance(x, jax.Array):
            return _sds(
                x.shape, x.dtype, sharding=self.gpu_sharding(x.sharding),
                weak_type=getattr(x, "weak_type", False))
        if isinstance(x, (np.ndarray, np.generic)):
            return _sds(
                x.shape, x.dtype, sharding=self.gpu_sharding(None))
        return x

    def _key(self, fn: Any, flat: List[Any], treedef: Any) -> Any:
        parts: List[Any] = [id(fn), treedef]
        for a in flat:
            if hasattr(a, "shape") and hasattr(a, "dtype"):
                s = getattr(a, "sharding", None)
                parts.append((tuple(a.shape), str(a.dtype),
                              getattr(a, "weak_type", False),
                              str(getattr(s, "spec", None))))
            else:
                parts.append(("py", type(a).__name__))
        return tuple(parts)

    def _compile(self, fn: Any, name: str, abstract: Any,
                 kwargs: Mapping[str, Any]) -> Executable:
        import jax
        before = set(os.listdir(self._dump_dir)) if self._dump_dir else set()
        ctx = jax.set_mesh(self.gpu_mesh) if self.mesh is not None \
            else nullcontext()
        started = time.perf_counter()
        with ctx:
            compiled = fn.lower(*abstract, **kwargs).compile()
        self.compiles += 1
        self.compile_seconds += time.perf_counter() - started
        stats = compiled.memory_analysis()
        out_leaves = jax.tree.leaves(compiled.out_info)
        out_sizes = []
        for o in out_leaves:
            s = getattr(o, "sharding", None)
            s = getattr(s, "sharding", s)  # a Format: layout + sharding
            out_sizes.append(shard_bytes(o.shape, o.dtype,
                                         self.gpu_sharding(s)))
        header = compiled.as_text().split("\n", 1)[0]
        aliases: Dict[int, int] = {}
        pairs = _hlo_aliases(header)
        if pairs:
            # jax keeps constant outputs out of the executable: line the
            # executable's outputs up with jax's by shard shape.
            hlo_shapes = _hlo_output_shapes(header)
            jax_shapes = [self._shard_shape(o) for o in out_leaves]
            where = _align(hlo_shapes, jax_shapes)
            executable = getattr(compiled, "_executable", None)
            kept = sorted(getattr(executable, "_kept_var_idx", ()) or ())
            params = getattr(compiled, "_params", None)
            n_const = len(getattr(params, "const_args", ()) or ())
            for out_index, number in pairs:
                flat = kept[number] if number < len(kept) else number
                if out_index in where:
                    aliases[where[out_index]] = flat - n_const
        n_out = len(out_leaves)
        donated = tuple(i for i, a in enumerate(jax.tree.leaves(
            compiled.args_info)) if getattr(a, "donated", False))
        tensors = None
        if self._dump_dir:
            tensors = self._read_dump(
                before, name, int(getattr(stats, "temp_size_in_bytes", 0)))
        return Executable(
            name=name, temp=int(getattr(stats, "temp_size_in_bytes", 0)),
            out_sizes=out_sizes, aliases=aliases,
            tuple_bytes=_TUPLE_ENTRY_BYTES * n_out if n_out > 1 else 0,
            out_info=compiled.out_info, donated=donated, tensors=tensors,
            stats=stats)

    def _shard_shape(self, o: Any) -> Tuple[int, ...]:
        s = getattr(o, "sharding", None)
        s = self.gpu_sharding(getattr(s, "sharding", s))
        try:
            return tuple(s.shard_shape(tuple(o.shape)))
        except Exception:
            return tuple(o.shape)

    def _read_dump(self, before: Set[str], name: str, temp: int
                   ) -> List[LogicalBuffer]:
        assert self._dump_dir is not None
        new = sorted(set(os.listdir(self._dump_dir)) - before)
        assignments = [f for f in new if "gpu_after_optimizations-buffer-"
                       "assignment.txt" in f]
        if not assignments and (self._dumps_seen or not temp):
            return []  # nothing for XLA to run (no outputs, constants only)
        if not assignments:
            raise RecorderError(
                f"the per-tensor variant found no GPU buffer assignment dump "
                f"for {name} in {self._dump_dir}: XLA_FLAGS must carry "
                "--xla_dump_to before jax starts; create the Recorder (or "
                "call jaxlake.enable_per_tensor_dumps()) before the first "
                "jax operation")
        self._dumps_seen = True
        path = os.path.join(self._dump_dir, assignments[-1])
        with open(path, encoding="utf-8") as f:
            assignment = f.read()
        with open(path.replace("-buffer-assignment.txt", "-live-range.txt"),
                  encoding="utf-8") as f:
            live = f.read()
        for f_name in new:  # dumps are large: keep only what is needed
            try:
                os.remove(os.path.join(self._dump_dir, f_name))
            except OSError:
                pass
        return parse_buffer_assignment(assignment, live)

    def wrap(self, fn: Callable[..., Any], name: Optional[str] = None,
             out_kinds: Any = "output") -> Callable[..., Any]:
        """A function that calls `fn` (a jax.jit function) and records its
        launch. `out_kinds`: a kind string, or a pytree prefix of the
        outputs giving each output's kind (param, opt_state, grad, ...)."""
        label: str = name or str(getattr(fn, "__name__", "fn"))

        def recorded(*args: Any, **kwargs: Any) -> Any:
            return self._launch(fn, label, out_kinds, args, kwargs)

        recorded.__name__ = label
        recorded.__wrapped__ = fn  # type: ignore[attr-defined]
        return recorded

    def _launch(self, fn: Any, name: str, out_kinds: Any,
                args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        import jax
        flat, treedef = jax.tree.flatten((args, kwargs))
        key = self._key(fn, flat, treedef)
        exe = self._executables.get(key)
        if exe is None:
            abstract_args, abstract_kwargs = jax.tree.map(
                self._abstract, (args, kwargs))
            exe = self._compile(fn, name, abstract_args, abstract_kwargs)
            self._executables[key] = exe
        # Arguments the trace has not seen: host data is copied to the
        # device for this launch only; device arrays made outside recorded
        # functions are allocated now and live as long as their object.
        transient: List[Tuple[Optional[int], int]] = []
        for leaf in flat:
            if self._is_array(leaf):
                if id(leaf) not in self._live:
                    self.register(leaf, "input")
            elif hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
                size = shard_bytes(leaf.shape, leaf.dtype, None)
                transient.append((self._alloc(size, "input"), size))
        donated = set(exe.donated)
        if self.compile_only:
            outputs = jax.tree.map(
                lambda o: Abstract(o.shape, o.dtype, self.gpu_sharding(
                    getattr(o.sharding, "sharding", o.sharding))),
                exe.out_info)
        else:
            outputs = fn(*args, **kwargs)
        self.launches += 1
        out_flat = jax.tree.leaves(outputs)
        kinds = self._kinds(out_kinds, outputs, len(out_flat))
        # Outputs: aliased ones take over their donated input's buffer.
        taken = set()
        for i, out in enumerate(out_flat):
            size = exe.out_sizes[i] if i < len(exe.out_sizes) else \
                self._size_of(out)
            source = exe.aliases.get(i)
            if source is not None and 0 <= source < len(flat) and \
                    self._is_array(flat[source]):
                live = self._untrack(flat[source])
                if live is not None:
                    taken.add(source)
                    self.live_bytes += size - live.size
                    self.peak_bytes = max(self.peak_bytes, self.live_bytes)
                    self._track(out, live.alloc_id, size)
                    continue
            if self._is_array(out) and id(out) in self._live:
                continue  # a forwarded input: the same array object
            self._track(out, self._alloc(size, kinds[i]), size)
        table = self._alloc(exe.tuple_bytes, "other")
        if exe.tensors is None:
            temp = self._alloc(exe.temp, "temp")
            self._free(temp, exe.temp)
        else:
            self._emit_tensors(exe.tensors)
        self._free(table, exe.tuple_bytes)
        # Donated inputs that no output took over are freed with the launch
        # (in run mode jax has deleted them already).
        for index, leaf in enumerate(flat):
            if index in taken or not self._is_array(leaf):
                continue
            deleted = index in donated or (
                not self.compile_only and hasattr(leaf, "is_deleted")
                and leaf.is_deleted())
            if deleted:
                live = self._untrack(leaf)
                if live is not None:
                    self._free(live.alloc_id, live.size)
        for alloc_id, size in transient:
            self._free(alloc_id, size)
        return outputs

    def _emit_tensors(self, tensors: List[LogicalBuffer]) -> None:
        events: List[Tuple[int, int, int]] = []  # (position, 0 alloc/1 free, i)
        for i, t in enumerate(tensors):
            events.append((t.start, 0, i))
            events.append((t.end, 1, i))
        ids: Dict[int, Optional[int]] = {}
        for _, op, i in sorted(events):
            if op == 0:
                ids[i] = self._alloc(tensors[i].size, "activation")
            else:
                self._free(ids.pop(i), tensors[i].size)

    @staticmethod
    def _kinds(out_kinds: Any, outputs: Any, count: int) -> List[str]:
        import jax
        if isinstance(out_kinds, str):
            return [out_kinds] * count
        try:
            per_leaf = jax.tree.map(
                lambda kind, sub: [kind] * len(jax.tree.leaves(sub)),
                out_kinds, outputs, is_leaf=lambda x: x is None)
            kinds = [k for group in jax.tree.leaves(
                per_leaf, is_leaf=lambda x: isinstance(x, list)) for k in group]
        except (ValueError, TypeError):
            kinds = []
        if len(kinds) != count:
            kinds = ["output"] * count
        return kinds

    # -- end -------------------------------------------------------------

    def summary(self) -> str:
        """One line: events, launches, compiles, peak live bytes."""
        events = self._writer.events if self._writer is not None else 0
        return (f"trace {self.path}: {events} events, {self.launches} "
                f"launches, {self.compiles} GPU compiles ({self.target}, "
                f"{self.compile_seconds:.1f}s), "
                f"peak live {format_bytes(self.peak_bytes)}")

    def close(self) -> None:
        """Ends the trace: allocations still live stay unfreed in it."""
        with self._lock:
            writer, self._writer = self._writer, None
        for live in list(self._live.values()):
            live.finalizer.detach()
        self._live.clear()
        if writer is not None:
            writer.close()
        if self._dump_dir:
            for f_name in os.listdir(self._dump_dir):
                path = os.path.join(self._dump_dir, f_name)
                if os.path.isfile(path):
                    os.remove(path)

    def __enter__(self) -> "Recorder":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["Abstract", "DEFAULT_TARGET", "Executable", "LogicalBuffer",
           "Recorder", "RecorderError", "enable_per_tensor_dumps", "gpu_devices",
           "parse_buffer_assignment", "shard_bytes", "target_config",
           "target_names"]
