"""`jaxlake fit`: traces per value, replays under the GPU's capacity (the
models), real runs on XLA's own allocators over a fake device of the GPU's
memory (real.py), the report (table, JSON, plot)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
import time
from typing import (Any, Callable, Dict, List, Optional, Sequence, TextIO,
                    Tuple)

from jaxlake._src.bench import pair as _pair
from jaxlake._src.bench import replay as _replay
from jaxlake._src.fit import engine as _engine
from jaxlake._src.fit import real as _real
from jaxlake._src.fit.search import (FIRST_JOB, FRAGMENTATION,
                                     OUT_OF_MEMORY,
                                     SHORTAGE, FitError, PolicyFit,
                                     Probe, Vary, classify, gain,
                                     search_policy, substitute)
from jaxlake._src.options import format_size
from jaxlake._src.trace import tracefile

JSON_FORMAT = "jaxlake-fit"
#: XLA's default share of device memory (XLA_CLIENT_MEM_FRACTION).
XLA_FRACTION = 0.75

#: Model policies of the fit beyond the replay's own: (replayed policy,
#: its PolicyOptions). bfc-prealloc is BFC as JAX runs it by default, one
#: region of the whole capacity taken at start (bench --preallocate).
_WHOLE_DEVICE = 1 << 60
MODEL_VARIANTS: Dict[str, Tuple[str, Dict[str, Any]]] = {
    "bfc-prealloc": ("bfc", {"bfc_initial_region": _WHOLE_DEVICE}),
}

#: One line per model policy, for the report's legend.
MODEL_DOCS: Dict[str, str] = {
    "jaxlake": "this allocator (a replay of the lake)",
    "bfc": "XLA's BFC with preallocation off "
           "(XLA_PYTHON_CLIENT_PREALLOCATE=false): regions that double",
    "bfc-prealloc": "XLA's BFC preallocated: one region of the whole "
                    "capacity",
    "torch": "PyTorch's caching allocator",
    "torch-expandable": "PyTorch's caching allocator, expandable segments",
    "gmlake": "GMLake as published",
    "xla-vmm": "XLA's VMM allocator (XLA_PYTHON_CLIENT_ALLOCATOR=vmm)",
    "bfc-growth": "XLA's growing BFC (XLA_PJRT_GPU_BFC_ALLOW_GROWTH, in "
                  "no supported jaxlib): one virtual range, 64 MiB steps",
}


def model_names() -> List[str]:
    """Every model policy: the replay's, then the fit's variants."""
    return list(_replay.policy_names()) + list(MODEL_VARIANTS)


def check_policies(names: Sequence[str]) -> List[str]:
    """`names` checked (order kept, duplicates dropped): models (the
    replay's and MODEL_VARIANTS) and real policies (real.POLICIES) the
    installed JAX can run. FitError naming a bad one."""
    out: List[str] = []
    replayed = [n for n in names if n not in MODEL_VARIANTS
                and not _real.is_real(n)]
    try:
        _replay.check_policies(replayed)
    except _replay.PolicyError as e:
        raise FitError(f"{e}; or {', '.join(MODEL_VARIANTS)}, or a real "
                       "run: " + ", ".join(_real.BY_NAME)) from None
    for name in names:
        if _real.is_real(name):
            policy = _real.BY_NAME.get(name)
            if policy is None:
                raise FitError(f"unknown real policy {name!r}: expected one "
                               "of " + ", ".join(_real.BY_NAME))
            why = _real.unavailable(policy)
            if why is not None:
                raise FitError(f"{name}: {why}")
        if name not in out:
            out.append(name)
    return out


def _granules(nbytes: int) -> int:
    """Down to whole 2 MiB granules (a capacity holds whole granules)."""
    return max(_replay.GRANULARITY,
               nbytes // _replay.GRANULARITY * _replay.GRANULARITY)


def lake_share(fraction: Optional[float] = None,
               lake_capacity: Optional[Any] = None) -> Optional[float]:
    """The jaxlake model's share of the device memory where it is not
    `fraction`'s: 1.0 (the whole device) when neither a fraction nor the
    lake's capacity option is given, as the lake runs then
    (integration.capacity_rule()); None otherwise."""
    return 1.0 if fraction is None and lake_capacity is None else None


def budgets(memory: int, policies: Sequence[str],
            fraction: Optional[float] = None,
            lake_capacity: Optional[Any] = None) -> Dict[str, int]:
    """Each policy's share of the device memory in bytes, before the memory
    outside the pool comes off: the device memory times `fraction` (XLA's
    0.75 when None); jaxlake's is the lake's own `capacity` option when
    given (bytes, or a fraction of the device memory), else `fraction`'s
    share when given, else the whole device (lake_share())."""
    share = XLA_FRACTION if fraction is None else fraction
    base = int(memory * share)
    whole = lake_share(fraction, lake_capacity)
    out: Dict[str, int] = {}
    for name in policies:
        nbytes = base
        if name == "jaxlake" and lake_capacity is not None:
            nbytes = int(memory * lake_capacity) if isinstance(
                lake_capacity, float) else int(lake_capacity)
        elif name == "jaxlake" and whole is not None:
            nbytes = int(memory * whole)
        out[name] = nbytes
    return out


def capacities(memory: int, policies: Sequence[str],
               fraction: Optional[float] = None,
               lake_capacity: Optional[Any] = None,
               outside: int = 0) -> Dict[str, int]:
    """Each policy's capacity in bytes: its budget (budgets()) less the
    memory XLA takes outside its pool, down to whole granules."""
    return {name: _granules(nbytes - outside) for name, nbytes in
            budgets(memory, policies, fraction, lake_capacity).items()}


@dataclasses.dataclass
class TraceInfo:
    value: int
    path: str
    seconds: float            # recording time (0: reused from --traces)
    events: int
    peak_live: int            # the largest device's
    outside_pool: Optional[int]


class Fitter:
    """Makes each value's trace once and replays it for any policy."""

    def __init__(self, make_trace: Callable[[int], str],
                 budget: Dict[str, int], reserve: int = 0) -> None:
        self.make_trace = make_trace
        # Each policy's bytes before what lies outside the pool comes off:
        # `reserve`, and the memory outside XLA's pool that the value's own
        # trace reports.
        self.budget = budget
        self.reserve = reserve
        self.traces: Dict[int, tracefile.Trace] = {}
        self.info: Dict[int, TraceInfo] = {}
        self.probes: Dict[str, Dict[int, Probe]] = {}
        self.replays = 0
        # Values whose recording ran out of the fake device's memory.
        self.too_large: Dict[int, _engine.OutOfFakeMemory] = {}

    def trace(self, value: int) -> tracefile.Trace:
        if value in self.too_large:
            raise self.too_large[value]
        if value not in self.traces:
            start = time.monotonic()
            try:
                path = self.make_trace(value)
            except _engine.OutOfFakeMemory as e:
                self.too_large[value] = e
                raise
            seconds = time.monotonic() - start
            trace = tracefile.read_trace(path)
            devices = [d for d, n in enumerate(trace.core.device_events())
                       if n] or [0]
            live = max(int(trace.core.peak_live(d)) for d in devices)
            self.traces[value] = trace
            self.info[value] = TraceInfo(
                value, path, seconds, len(trace), live,
                _engine.outside_pool(trace.meta))
        return self.traces[value]

    def capacity(self, policy: str, value: int) -> int:
        """The policy's capacity for this value's trace."""
        try:
            self.trace(value)
        except _engine.OutOfFakeMemory:
            pass
        info = self.info.get(value)
        outside = (info.outside_pool or 0) if info else 0
        return _granules(self.budget[policy] - self.reserve - outside)

    def probe(self, policy: str, value: int) -> Probe:
        done = self.probes.setdefault(policy, {})
        if value in done:
            return done[value]
        cap = self.capacity(policy, value)
        if value in self.too_large:
            # More than the fake device held, which is several times any
            # capacity on the GPU: a shortage for every policy.
            e = self.too_large[value]
            done[value] = Probe(value=value, fits=False, capacity=cap,
                                peak_live=0, peak_reserved=0,
                                reason=SHORTAGE, request_size=e.request,
                                beyond=e.device_memory)
            return done[value]
        trace = self.trace(value)
        live = self.info[value].peak_live
        first = self.first_failure(policy)
        if first is not None:
            done[value] = Probe(value=value, fits=False, capacity=cap,
                                peak_live=live, peak_reserved=0,
                                reason=FIRST_JOB, message=first)
            return done[value]
        self.replays += 1
        replayed, options = self.replay_options(policy, cap)
        result = _replay.replay(trace, replayed, cap, timeline_points=0,
                                timing=False, options=options)
        # Per device: the largest device's reserved bytes, as its peak
        # live bytes are the fullest device's (the replay's figures are
        # sums over the devices).
        by_device = result.capped_peak_reserved_by_device
        reserved = max(by_device.values()) if by_device else \
            result.capped_peak_reserved \
            if result.capped_peak_reserved is not None \
            else result.peak_reserved
        p = Probe(value=value, fits=result.oom is None, capacity=cap,
                  peak_live=live, peak_reserved=int(reserved))
        if result.oom is not None:
            p.reason = classify(live, cap)
            if p.reason == FRAGMENTATION:
                oom = result.oom
                p.request_size = oom.size
                p.request_kind = _kind_at(trace, oom.event)
                p.live_at_failure = oom.live
                p.reserved_at_failure = oom.reserved
        done[value] = p
        return p

    def replay_options(self, policy: str, capacity: int
                       ) -> Tuple[str, Optional[Dict[str, Any]]]:
        """The replayed policy and its options for a model `policy`."""
        return MODEL_VARIANTS.get(policy, (policy, None))

    def first_failure(self, policy: str) -> Optional[str]:
        """Why no value fits under `policy` whatever the value (a first
        job that does not fit alone: PairFitter), or None."""
        return None


class PairFitter(Fitter):
    """`jaxlake fit --beside`'s models: each value's trace is the second
    job's, replayed beside the first job's trace (bench/pair.py): the
    first holds what the policy holds for it alone under its budget (its
    peak reserved; bfc-prealloc, JAX's default, its whole budget, the
    device times XLA's 0.75), and the second's capacity is its budget cut
    to what the first leaves of the device."""

    def __init__(self, make_trace: Callable[[int], str],
                 budget: Dict[str, int], reserve: int,
                 first: tracefile.Trace, memory: int) -> None:
        super().__init__(make_trace, budget, reserve)
        self.first = first
        self.memory = memory
        self.holds: Dict[str, Tuple[int, Optional[str]]] = {}

    def hold(self, policy: str) -> Tuple[int, Optional[str]]:
        """(bytes the first job holds, why it fails alone or None)."""
        if policy not in self.holds:
            outside = _engine.outside_pool(self.first.meta) or 0
            share = _granules(self.budget[policy] - self.reserve - outside)
            replayed, options = MODEL_VARIANTS.get(policy, (policy, None))
            result = _replay.replay(self.first, replayed, share,
                                    timeline_points=0, timing=False,
                                    options=options)
            pre = _pair.preallocating(replayed, options)
            if result.oom is not None:
                self.holds[policy] = (0, (
                    f"alone, it does not fit its capacity "
                    f"{format_size(share)}: {result.oom.describe()}"))
            else:
                held = result.capped_peak_reserved \
                    if result.capped_peak_reserved is not None \
                    else result.peak_reserved
                self.holds[policy] = (
                    _pair.up(self.budget[policy]) if pre
                    else _pair.up(held), None)
        return self.holds[policy]

    def first_failure(self, policy: str) -> Optional[str]:
        return self.hold(policy)[1]

    def capacity(self, policy: str, value: int) -> int:
        own = super().capacity(policy, value)
        room = _pair.down(self.memory - self.hold(policy)[0])
        return max(0, min(own, room))

    def replay_options(self, policy: str, capacity: int
                       ) -> Tuple[str, Optional[Dict[str, Any]]]:
        replayed, options = MODEL_VARIANTS.get(policy, (policy, None))
        return replayed, _pair.second_options(
            replayed, options, self.budget[policy])


class RealRuns:
    """Real runs (real.py) for the real policies: one program run per
    configuration and value, shared by the policies of the same
    configuration; a value whose recording ran out of the (larger) fake
    device is out of memory without a run."""

    def __init__(self, fitter: Fitter,
                 run: Callable[[_real.RealPolicy, int, str], _real.Outcome],
                 fraction: Optional[float], device: int,
                 progress: Optional[TextIO]) -> None:
        self.fitter = fitter
        self.run = run
        self.fraction = fraction
        self.device = device
        self.progress = progress
        self.outcomes: Dict[Any, _real.Outcome] = {}
        self.first: Dict[Any, str] = {}
        self.runs = 0
        self.seconds = 0.0

    def probe(self, name: str, value: int) -> Probe:
        done = self.fitter.probes.setdefault(name, {})
        if value in done:
            return done[value]
        too_large = self.fitter.too_large.get(value)
        if too_large is not None:
            done[value] = Probe(value=value, fits=False,
                                capacity=self.device, peak_live=0,
                                peak_reserved=0, reason=SHORTAGE,
                                request_size=too_large.request,
                                beyond=too_large.device_memory, real=True)
            return done[value]
        policy = _real.BY_NAME[name]
        key = (policy.key(self.fraction), value)
        if key in self.outcomes:
            if self.progress is not None:
                self.progress.write(f"  {name} at {value}: the run of "
                                    f"{self.first[key]} (the same "
                                    "settings)\n")
        else:
            outcome = self.run(policy, value, f"{name} at {value}")
            self.outcomes[key] = outcome
            self.first[key] = name
            self.runs += 1
            self.seconds += outcome.seconds
        outcome = self.outcomes[key]
        done[value] = Probe(
            value=value, fits=outcome.fits, capacity=self.device,
            peak_live=0, peak_reserved=0,
            reason=None if outcome.fits else (
                FIRST_JOB if outcome.first_failed else OUT_OF_MEMORY),
            request_size=outcome.request, real=True,
            message=outcome.message or None)
        return done[value]


def _kind_at(trace: tracefile.Trace, event: int) -> Optional[str]:
    try:
        return trace.events()[event].kind
    except IndexError:
        return None


@dataclasses.dataclass
class FitReport:
    gpu: _engine.Gpu
    vary: Vary
    values: List[int]
    engine: str
    command: List[str]
    fraction: float
    capacity: Dict[str, int]
    outside_pool: Optional[int]
    fits: List[PolicyFit]
    traces: List[TraceInfo]
    replays: int
    seconds: float
    # The jaxlake model's share of the device where it is not `fraction`'s
    # (lake_share(): 1.0 when no fraction or lake capacity was given).
    lake_share: Optional[float] = None
    # JAX's default for the installed jax: which model and which real run
    # stand for it.
    jax_default: _real.JaxDefault = dataclasses.field(
        default_factory=_real.jax_default)
    real_runs: int = 0
    real_seconds: float = 0.0
    # --beside: the first job's command, and what it holds under each
    # model (bytes).
    beside: Optional[List[str]] = None
    first_holds: Dict[str, int] = dataclasses.field(default_factory=dict)

    def policy(self, name: str) -> Optional[PolicyFit]:
        return next((f for f in self.fits if f.policy == name), None)

    def is_default(self, name: str) -> bool:
        """Whether `name` stands for JAX's default (the real run or the
        model of it)."""
        return name in (self.jax_default.real, self.jax_default.model)

    @staticmethod
    def kind(name: str) -> str:
        return "real run" if _real.is_real(name) else "model"

    def lake_for(self, name: str) -> Optional[PolicyFit]:
        """The lake's fit of the same kind as `name`: its real run
        (real:jaxlake) for a real run, its model (jaxlake) for a model. A
        real run and a replay of a trace recorded on a larger device are
        not compared: XLA adapts what it allocates to the device's size."""
        return self.policy(_real.LAKE if _real.is_real(name) else "jaxlake")

    def gains(self) -> Dict[str, Optional[float]]:
        """The lake's gain over each other policy of the same kind (real
        runs against real:jaxlake, models against jaxlake), in percent:
        JAX's default first (its real run, then its model), then the rest
        in order."""
        order = [self.jax_default.real, self.jax_default.model] + [
            f.policy for f in self.fits]
        out: Dict[str, Optional[float]] = {}
        for name in order:
            f = self.policy(name)
            lake = self.lake_for(name)
            if f is None or lake is None or name in out or \
                    name in ("jaxlake", _real.LAKE):
                continue
            out[name] = gain(lake.largest, f.largest)
        return out

    def to_json(self) -> Dict[str, Any]:
        policies: Dict[str, Any] = {}
        for f in self.fits:
            a = f.at_largest
            real = _real.is_real(f.policy)
            nf = f.next_failure
            next_failure: Optional[Dict[str, Any]] = None
            if nf is not None:
                next_failure = {"value": nf.value, "reason": nf.reason,
                                "peak_live": None if real else nf.peak_live}
                if nf.reason == FRAGMENTATION:
                    next_failure["request"] = {
                        "size": nf.request_size, "kind": nf.request_kind,
                        "live": nf.live_at_failure,
                        "reserved": nf.reserved_at_failure}
                if nf.reason == OUT_OF_MEMORY:
                    next_failure["request"] = {"size": nf.request_size}
                    next_failure["message"] = nf.message
                if nf.reason == FIRST_JOB:
                    next_failure["message"] = nf.message
            shown = a if not real else None
            policies[f.policy] = {
                "kind": self.kind(f.policy),
                "jax_default": self.is_default(f.policy),
                "description": describe(f.policy, self.jax_default),
                "largest": f.largest, "capacity": f.capacity,
                "peak_live": shown.peak_live if shown else None,
                "peak_reserved": shown.peak_reserved if shown else None,
                "utilisation": shown.utilisation if shown else None,
                "headroom": shown.headroom if shown else None,
                "next_value": f.next_value, "next_failure": next_failure,
                "probes": [self._probe(f.policy, v).to_json()
                           for v in sorted(f.probed)]}
        jd = self.jax_default
        return {
            "format": JSON_FORMAT, "version": 2,
            "gpu": {"name": self.gpu.name, "memory": self.gpu.memory,
                    "devices": self.gpu.count},
            "vary": {"name": self.vary.name, "lo": self.vary.lo,
                     "hi": self.vary.hi, "values": self.values},
            "engine": self.engine, "command": self.command,
            "fraction": self.fraction, "lake_share": self.lake_share,
            "outside_pool": self.outside_pool,
            "jax_default": {"jax": jd.jax, "checked": jd.known,
                            "allocator": jd.text, "model": jd.model,
                            "real": jd.real},
            "policies": policies,
            "gain_percent": self.gains(),
            "traces": [dataclasses.asdict(t) for t in self.traces],
            "replays": self.replays, "real_runs": self.real_runs,
            "seconds": self.seconds,
            "beside": None if self.beside is None else {
                "command": self.beside, "first_holds": self.first_holds}}

    _probes: Dict[str, Dict[int, Probe]] = dataclasses.field(
        default_factory=dict)

    def _probe(self, policy: str, value: int) -> Probe:
        return self._probes[policy][value]


def describe(name: str, default: Optional[_real.JaxDefault] = None) -> str:
    """One line on what a policy is, saying whether it is JAX's default."""
    jd = default or _real.jax_default()
    if _real.is_real(name):
        text = _real.BY_NAME[name].doc
    else:
        text = MODEL_DOCS.get(name, name)
    if name in (jd.real, jd.model):
        return (f"{text}; JAX's default (jax {jd.jax}: {jd.text}), "
                + ("run for real" if _real.is_real(name) else "modelled"))
    if _real.is_real(name) and _real.BY_NAME[name].key(None) == \
            _real.BY_NAME[jd.real].key(None):
        return (f"{text}; the allocator JAX's default picks, named (it "
                f"shares {jd.real}'s runs)")
    if name in ("bfc", "bfc-growth", "xla-vmm") or (
            _real.is_real(name) and name != _real.LAKE):
        return text + "; not JAX's default"
    return text


def _prober(fitter: Fitter, policy: str) -> Callable[[int], Probe]:
    return lambda value: fitter.probe(policy, value)


def _real_prober(runs: RealRuns, policy: str) -> Callable[[int], Probe]:
    return lambda value: runs.probe(policy, value)


def fit(argv: Sequence[str], vary: Vary, values: Sequence[int],
        gpu: _engine.Gpu, policies: Sequence[str], engine: str = "fake-gpu",
        fraction: Optional[float] = None, lake_capacity: Any = None,
        reserve: int = 0, traces_dir: Optional[str] = None,
        progress: Optional[TextIO] = None,
        make_trace: Optional[Callable[[int], str]] = None,
        real_run: Optional[Callable[[_real.RealPolicy, int, str],
                                    _real.Outcome]] = None,
        beside: Optional[Sequence[str]] = None, beside_ready: int = 2,
        beside_wait: float = 30.0,
        first_trace: Optional[str] = None) -> FitReport:
    """Searches each policy's largest value. `make_trace(value)` -> path
    replaces the engine (tests), and `real_run(policy, value, label)` ->
    Outcome the real runs; `traces_dir` keeps the traces (and the real
    runs' logs) and reuses the traces of the same command. `reserve`:
    bytes outside the pool to subtract from every model's capacity,
    besides what the traces report.

    `beside`: the command runs beside this first job on one shared fake
    device (--beside): real runs run both (real.run_beside(); the first
    is under way once its {READY} file holds `beside_ready` lines, or
    after `beside_wait` seconds without {READY}); models replay each
    value's trace beside the first job's (PairFitter), recorded once
    until it is under way, or read from `first_trace`."""
    start = time.monotonic()
    substitute(argv, vary, values[0])  # FitError when {NAME} is missing
    names = check_policies(policies)
    models = [n for n in names if not _real.is_real(n)]
    reals = [n for n in names if _real.is_real(n)]
    if reals and engine != "fake-gpu" and real_run is None:
        raise FitError(f"{', '.join(reals)}: real runs run the command on "
                       "the fake GPU: use --engine fake-gpu (the default)")
    if beside is not None:
        check_beside(beside, engine, gpu, beside_ready, beside_wait)
    folder = traces_dir or tempfile.mkdtemp(prefix="jaxlake-fit-")
    if traces_dir:
        os.makedirs(traces_dir, exist_ok=True)

    def engine_trace(value: int) -> str:
        command = substitute(argv, vary, value)
        # The fake GPU's model is part of its trace; the recorder's traces
        # are the same for every GPU (its compile is an H100's).
        model = gpu.fake_model if engine == "fake-gpu" else ""
        # (the device count is part of a fake-GPU run's key, its default
        # left out so that traces made before it keep their names)
        count = [gpu.count] if gpu.count != 1 else []
        key = hashlib.sha1(json.dumps([engine, model, command] + count)
                           .encode()).hexdigest()[:12]
        path = os.path.join(folder, f"{vary.name}-{value}-{key}.jsonl")
        label = f"{vary.name}={value}"
        if traces_dir and os.path.isfile(path) and os.path.getsize(path):
            if progress is not None:
                progress.write(f"  {label}: trace reused ({path})\n")
            return path
        _engine.record(engine, command, path, gpu, label, progress)
        return path

    def engine_run(policy: _real.RealPolicy, value: int,
                   label: str) -> _real.Outcome:
        command = substitute(argv, vary, value)
        count = [gpu.count] if gpu.count != 1 else []
        key = hashlib.sha1(json.dumps([policy.name, gpu.memory, command]
                                      + count + ([list(beside)] if beside
                                                 else [])).encode()
                           ).hexdigest()[:12]
        tag = f"{policy.name[len(_real.PREFIX):]}-{vary.name}-{value}-{key}"
        if beside is not None:
            return _real.run_beside(command, beside, gpu, policy, fraction,
                                    folder, tag, label, progress,
                                    beside_ready, beside_wait)
        log = os.path.join(folder, f"{tag}.log")
        return _real.run_once(command, gpu, policy, fraction, log, label,
                              progress)

    # Each value's replays have the capacity less the memory outside XLA's
    # pool that its own trace reports; the report's capacities are the
    # first value's. Real runs have the fake device of the GPU's memory,
    # of which XLA takes its own share.
    budget = budgets(gpu.memory, models, fraction, lake_capacity)
    fitter: Fitter
    if beside is not None and models:
        path = first_trace or record_first(
            beside, os.path.join(folder, "first-" + hashlib.sha1(
                json.dumps([gpu.fake_model, list(beside)]).encode()
            ).hexdigest()[:12] + ".jsonl"), gpu, beside_ready, beside_wait,
            progress, reuse=bool(traces_dir))
        fitter = PairFitter(make_trace or engine_trace, budget, reserve,
                            tracefile.read_trace(path, lenient=True),
                            gpu.memory)
    else:
        fitter = Fitter(make_trace or engine_trace, budget, reserve)
    runs = RealRuns(fitter, real_run or engine_run, fraction, gpu.memory,
                    progress)
    cap = {name: fitter.capacity(name, values[0]) for name in models}
    cap.update({name: gpu.memory for name in reals})
    found = {name: search_policy(values, _prober(fitter, name), name,
                                 cap[name]) for name in models}
    for name in reals:
        found[name] = search_policy(values, _real_prober(runs, name), name,
                                    cap[name])
    fits = [found[name] for name in names]
    infos = [fitter.info[v] for v in sorted(fitter.info)]
    outs = [i.outside_pool for i in infos if i.outside_pool is not None]
    report = FitReport(
        gpu=gpu, vary=vary, values=list(values), engine=engine,
        command=list(argv),
        fraction=XLA_FRACTION if fraction is None else fraction,
        lake_share=(lake_share(fraction, lake_capacity)
                    if "jaxlake" in models else None),
        capacity=cap, outside_pool=(max(outs) if outs else None),
        fits=fits, traces=infos, replays=fitter.replays,
        seconds=time.monotonic() - start, real_runs=runs.runs,
        real_seconds=runs.seconds)
    report._probes = fitter.probes
    if isinstance(fitter, PairFitter):
        report.beside = list(beside or [])
        report.first_holds = {n: fitter.hold(n)[0] for n in models}
    elif beside is not None:
        report.beside = list(beside)
    return report


def check_beside(first: Sequence[str], engine: str, gpu: _engine.Gpu,
                 ready: int, wait: float) -> None:
    """FitError naming what makes --beside impossible."""
    if not first:
        raise FitError("--beside: give the first job's command, e.g. "
                       "--beside 'python train.py --steps 100000 "
                       "--log-json {READY}'")
    if engine != "fake-gpu":
        raise FitError(f"--beside: the {engine} engine runs no program on "
                       "a device; two jobs share one fake device only "
                       "under --engine fake-gpu (the default)")
    if gpu.count != 1:
        raise FitError(f"--beside with --devices {gpu.count}: the shared "
                       "device is one device; give --devices 1")
    if ready < 1:
        raise FitError(f"--beside-steps {ready}: give 1 or more lines")
    if wait <= 0:
        raise FitError(f"--beside-wait {wait:g}: give a positive number "
                       "of seconds")


def record_first(first: Sequence[str], path: str, gpu: _engine.Gpu,
                 ready: int, wait: float, progress: Optional[TextIO],
                 reuse: bool = False) -> str:
    """Records the first job's trace for the models: on a large fake
    device (the fit's recording device), until it is under way (as
    beside.wait_ready() says), then interrupted (SIGINT: the program ends
    through Python's own exit, and the shim writes the trace's last
    lines). FitError when it fails before; FakeGpuUnavailable when the
    fake cannot start."""
    import signal
    import subprocess
    from jaxlake._src.fit import beside
    if reuse and os.path.isfile(path) and os.path.getsize(path):
        if progress is not None:
            progress.write(f"  the first job: trace reused ({path})\n")
        return path
    log = path + ".log"
    ready_file = path + ".ready"
    for f in (path, ready_file):
        if os.path.exists(f):
            os.unlink(f)
    argv = beside.with_ready(first, ready_file)
    cmd = _engine.fake_gpu_command(argv, path, gpu)
    env = _engine.fresh_compile(dict(os.environ))
    env.setdefault("PYTHONUNBUFFERED", "1")
    platforms = env.get("JAX_PLATFORMS", "")
    if platforms and not any(p.strip() in ("cuda", "gpu")
                             for p in platforms.split(",")):
        env.pop("JAX_PLATFORMS")
    with _engine.Progress(progress, "the first job") as p:
        with open(log, "w", encoding="utf-8") as out:
            # SIGINT as by default in the job, even where this process was
            # started with it ignored (a shell's background job), which
            # the job would inherit.
            job = subprocess.Popen(
                cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=lambda: signal.signal(signal.SIGINT,
                                                 signal.SIG_DFL) and None)
            under_way = beside.wait_ready(
                job, ready_file if beside.has_ready(first) else None, ready,
                wait, 3600.0, None)
            code = job.poll()
            if under_way:
                job.send_signal(signal.SIGINT)
                try:
                    job.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    job.kill()
                    job.wait()
            elif code is None:
                job.kill()
                job.wait()
        output = _engine.tail(log, 200)
        if not under_way and code != 0:
            p.finish("failed")
            problem = _engine.fake_gpu_problem(output)
            if problem is not None:
                raise _engine.FakeGpuUnavailable(problem)
            raise FitError(
                f"--beside: the first job failed alone (exit status {code}):"
                " " + " ".join(cmd) + f"\nits last lines (all of it in "
                f"{log}):\n"
                + "\n".join(output.splitlines()[-_engine.TAIL_LINES:]))
        if not os.path.isfile(path) or os.path.getsize(path) == 0:
            p.finish("no trace")
            raise FitError(f"--beside: the first job wrote no trace at "
                           f"{path}; its output is in {log}")
        p.finish("recorded")
    return path


# -- the report for people -------------------------------------------------

LIMITS = (
    "limits: the fake GPU runs no kernel, so workspaces cuBLAS, cuDNN or "
    "NCCL size at run time are not in the trace; memory outside XLA's pool "
    "is what the shim passed on to the driver, not what the driver takes "
    "for itself (contexts, modules); the recorder sees only what its "
    "recorded functions allocate (docs/design.md, `jaxlake fit`)")


def outside_line(report: FitReport) -> str:
    """What the traces say of the memory XLA took outside its pool."""
    if report.outside_pool is None:
        return ("memory outside XLA's pool: not reported by the traces (the "
                "recorder's do not say); not subtracted")
    figures = sorted({t.outside_pool for t in report.traces
                      if t.outside_pool is not None})
    each = (size_range(figures[0], figures[-1]) if len(figures) > 1
            else format_size(figures[0]))
    return (f"memory outside XLA's pool: {each} (the peak of the device "
            "memory the program took through the shim outside the lake: "
            "cuMemAlloc, cuMemCreate, other pools); subtracted from every "
            "capacity, each value its own trace's")


def size_range(lo: int, hi: int) -> str:
    return f"{format_size(lo)} to {format_size(hi)}"


def label(report: FitReport, name: str) -> str:
    """A policy's name as the table shows it: JAX's default says so."""
    return f"{name} (JAX's default)" if report.is_default(name) else name


def gain_lines(report: FitReport) -> List[str]:
    """jaxlake's gain against JAX's default first, then the others."""
    gains = report.gains()
    fitted = {f.policy for f in report.fits}
    if not gains and not fitted & {report.jax_default.real,
                                   report.jax_default.model}:
        return []
    v = report.vary.name
    jd = report.jax_default

    def text(name: str) -> str:
        g = gains[name]
        return "n/a (fits nothing)" if g is None else f"{g:+.0f}%"

    lines: List[str] = []
    default = [n for n in (jd.real, jd.model) if n in gains]
    head = (f"jaxlake's largest {v} against JAX's default (jax {jd.jax}: "
            f"{jd.text}): ")

    def versus(n: str) -> str:
        lake = report.lake_for(n)
        assert lake is not None
        return f"{text(n)} ({lake.policy} against {n})"

    if default:
        lines.append(head + ", ".join(versus(n) for n in default))
    else:
        lines.append(head + f"not compared (add --policies {_real.LAKE},"
                     f"{jd.real} for real runs of both, or jaxlake,"
                     f"{jd.model} for their models: a real run is compared "
                     "with a real run, a model with a model)")
    rest = [n for n in gains if n not in default]
    if rest:
        lines.append("against the others (real runs against real:jaxlake, "
                     "models against jaxlake): " + ", ".join(
                         f"{n} {text(n)}" for n in rest))
    return lines


def format_report(report: FitReport) -> str:
    from jaxlake._src.table import format_table
    size = format_size
    v = report.vary.name
    models = {n: c for n, c in report.capacity.items()
              if not _real.is_real(n)}
    reals = [n for n in report.capacity if _real.is_real(n)]
    devices = (f", {report.gpu.count} devices a run (every device must "
               "fit; the figures are the fullest device's)"
               if report.gpu.count > 1 else "")
    lines = [
        f"jaxlake fit: largest {v} on {report.gpu.name} "
        f"({size(report.gpu.memory)}; capacity {report.fraction:g} of it"
        + ((", jaxlake all of it" if report.lake_share == 1.0 else
            f", jaxlake {report.lake_share:g} of it")
           + " (no fraction set: the lake grows into the device as XLA's "
           "cuda_async pool does)" if report.lake_share is not None else "")
        + (", less the memory XLA takes outside its pool"
           if report.outside_pool is not None else "")
        + ")" + devices + ", engine " + report.engine]
    if models:
        lines.append(outside_line(report))
        lines.append("capacity: " + ", ".join(
            f"{n} {size(c)}" for n, c in models.items()))
    if report.beside is not None:
        lines.append(
            "beside the first job " + " ".join(report.beside) + ": each "
            "value runs on the same device while it runs (real runs: both "
            "programs on one shared fake device, under the same allocator; "
            "models: the first job's trace holds what the policy holds for "
            "it alone, the capacities above are the second's, cut to what "
            "it leaves" + ("; the first holds " + ", ".join(
                f"{n} {size(h)}" for n, h in report.first_holds.items())
                if report.first_holds else "") + ")")
    if reals:
        each = (f"{report.gpu.count} fake devices of" if report.gpu.count > 1
                else "a fake device of")
        lines.append(f"real runs: the program on XLA's own allocator over "
                     f"{each} {size(report.gpu.memory)}, which XLA "
                     "shares as it does on the GPU; XLA's out-of-memory "
                     "error is the verdict")
    lines.append("")
    header = ("policy", "kind", f"largest {v}", "peak live", "peak reserved",
              "U", "headroom", f"next {v}: why it fails")
    rows: List[List[str]] = []
    for f in report.fits:
        a = f.at_largest if not _real.is_real(f.policy) else None
        why = "(the range's end fits)" if f.next_failure is None else (
            f"{f.next_value}: {f.next_failure.describe_failure()}")
        rows.append([label(report, f.policy), report.kind(f.policy),
                     "none" if f.largest is None else str(f.largest),
                     size(a.peak_live) if a else "-",
                     size(a.peak_reserved) if a else "-",
                     f"{a.utilisation:.3f}" if a else "-",
                     size(a.headroom) if a else "-", why])
    lines.append(format_table(rows, header))
    gains = gain_lines(report)
    if gains:
        lines.append("")
        lines.extend(gains)
    lines.append("")
    lines.append("policies:")
    for f in report.fits:
        lines.append(f"  {f.policy}: {describe(f.policy, report.jax_default)}")
    rec = sum(t.seconds for t in report.traces)
    lines.append(f"{len(report.traces)} traces ({rec:.1f}s making them), "
                 f"{report.replays} replays, {report.real_runs} real runs "
                 f"({report.real_seconds:.1f}s), {report.seconds:.1f}s in "
                 "all")
    lines.append(LIMITS)
    return "\n".join(lines)


def plot(report: FitReport, path: str) -> None:
    """The varied value against each policy's peak reserved bytes, with
    each policy's capacity line and its out-of-memory values crossed."""
    from jaxlake._src.bench.plot import (COLOURS, _matplotlib, _save,
                                         image_format)
    from jaxlake._src.options import byte_unit
    fmt = image_format(path)
    Figure, Canvas = _matplotlib()
    fig = Figure(figsize=(8, 4.8), layout="constrained")
    Canvas(fig)
    ax = fig.add_subplot(1, 1, 1)
    peak = [p.peak_reserved for d in report._probes.values()
            for p in d.values()] + [c for n, c in report.capacity.items()
                                    if not _real.is_real(n)]
    unit, scale = byte_unit(max(peak, default=1))
    for name, probes in report._probes.items():
        if _real.is_real(name):
            continue  # a real run has a verdict, not a peak
        colour = COLOURS.get(name, "#444444")
        vals = sorted(probes)
        ax.plot(vals, [probes[x].peak_reserved / scale for x in vals],
                marker="o", color=colour, label=name,
                linewidth=2.4 if name == "jaxlake" else 1.2,
                linestyle="-" if name == "jaxlake" else "--")
        oom = [x for x in vals if not probes[x].fits]
        ax.scatter(oom, [probes[x].peak_reserved / scale for x in oom],
                   marker="x", s=70, color=colour, zorder=6)
    for cap in sorted({c for n, c in report.capacity.items()
                       if not _real.is_real(n)}):
        ax.axhline(cap / scale, color="#000000", linewidth=0.8,
                   linestyle=":")
    live = sorted(report.traces, key=lambda t: t.value)
    ax.plot([t.value for t in live], [t.peak_live / scale for t in live],
            color="#777777", linewidth=0.8, label="peak live")
    ax.set_xscale("log", base=2)
    ax.set_xlabel(report.vary.name)
    ax.set_ylabel(f"peak reserved ({unit})")
    ax.set_title(f"jaxlake fit on {report.gpu.name}: capacity dotted, "
                 "out of memory crossed")
    ax.legend(loc="upper left", fontsize="small")
    _save(fig, path, fmt)
