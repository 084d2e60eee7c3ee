"""The public API and the agreement between Python and the C++ lists."""

from __future__ import annotations

import ast
import dataclasses
import pathlib
from typing import Any, Dict, List

import pytest

import jaxlake
from jaxlake import _core
from jaxlake._src import errors
from jaxlake._src import options


def test_public_names_are_pinned() -> None:
    assert jaxlake.__all__ == [
        "ConfigurationError",
        "ConfigurationWarning",
        "DriverError",
        "InvariantError",
        "JaxlakeError",
        "Lake",
        "Option",
        "OutOfMemoryError",
        "Recorder",
        "RecorderError",
        "Stats",
        "Status",
        "TraceEvent",
        "__version__",
        "check",
        "configure",
        "empty_cache",
        "enable_per_tensor_dumps",
        "hook_counts",
        "memory_report",
        "option_table",
        "parse_size",
        "resolve_options",
        "stats",
        "status",
        "trace",
        "view",
    ]
    for name in jaxlake.__all__:
        assert hasattr(jaxlake, name), name
    assert jaxlake.__version__ == "0.1.0"


def test_package_ships_type_information() -> None:
    package = pathlib.Path(jaxlake.__file__).parent
    assert (package / "py.typed").is_file()
    assert (package / "_core.pyi").is_file()


def test_exception_hierarchy() -> None:
    assert issubclass(jaxlake.OutOfMemoryError, MemoryError)
    assert issubclass(jaxlake.ConfigurationError, ValueError)
    for error in (jaxlake.OutOfMemoryError, jaxlake.ConfigurationError,
                  jaxlake.DriverError, jaxlake.InvariantError):
        assert issubclass(error, jaxlake.JaxlakeError)


def test_stats_fields_follow_the_cpp_declaration() -> None:
    expected: List[str] = []
    for name, _ in _core.gauge_names():
        expected += [name, name + "_peak"]
    expected += [name for name, _ in _core.counter_names()]
    expected.append("driver_calls")
    assert [f.name for f in dataclasses.fields(jaxlake.Stats)] == expected


def test_every_status_has_one_exception() -> None:
    kinds = {name: type(errors.status_error(name, "message"))
             for name in _core.status_names() if name != "ok"}
    assert kinds.pop("out_of_memory") is jaxlake.OutOfMemoryError
    assert set(kinds.values()) == {jaxlake.DriverError}
    assert "ok" in _core.status_names()


def test_option_table_matches_the_cpp_options() -> None:
    cpp = _core.LakeOptions()
    cpp_fields = {n for n in dir(cpp) if not n.startswith("_")}
    lake_rows = {o.name for o in options.OPTIONS if o.lake}
    assert lake_rows == cpp_fields
    for option in options.OPTIONS:
        if option.lake and option.name != "capacity":
            assert option.default == getattr(cpp, option.name), option.name
    names = [o.name for o in jaxlake.option_table()]
    assert len(names) == len(set(names))
    assert all(o.env == "JAXLAKE_" + o.name.upper()
               for o in jaxlake.option_table())


def test_name_lists_come_from_the_cpp_headers() -> None:
    assert _core.alloc_state_names() == [
        "small", "fit", "split", "stitch_reuse", "stitch", "stitch_grow",
        "grow"]
    assert "map" in _core.call_names() and "create" in _core.call_names()
    assert set(_core.backend_names()) == {"host", "sim"}
    assert all(doc for _, doc in _core.gauge_names() + _core.counter_names())


def _params(signature: str) -> List[str]:
    """Parameter names of a nanobind signature "def f(a: T, b: U) -> R"."""
    inner = signature[signature.index("(") + 1:signature.rindex(")")]
    return [p.split(":")[0].strip() for p in inner.split(",") if p.strip()]


def _describe(name: str, obj: object) -> str:
    """name(params) of a compiled function or method, else name."""
    signatures = getattr(obj, "__nb_signature__", None)
    if signatures is None:
        return name
    return f"{name}({', '.join(_params(signatures[0][0]))})"


def _stub_describe(node: ast.FunctionDef) -> str:
    if any(isinstance(d, ast.Name) and d.id == "property"
           for d in node.decorator_list):
        return node.name
    return f"{node.name}({', '.join(a.arg for a in node.args.args)})"


def test_core_stub_matches_the_module() -> None:
    """Names and parameters of jaxlake/_core.pyi agree with the module."""
    stub_path = pathlib.Path(jaxlake.__file__).parent / "_core.pyi"
    stub: Dict[str, List[str]] = {}
    for node in ast.parse(stub_path.read_text()).body:
        if isinstance(node, ast.FunctionDef):
            stub[node.name] = [_stub_describe(node)]
        elif isinstance(node, ast.ClassDef):
            members = []
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and \
                        item.name != "__init__":
                    members.append(_stub_describe(item))
                elif isinstance(item, ast.AnnAssign):
                    assert isinstance(item.target, ast.Name)
                    members.append(item.target.id)
            stub[node.name] = sorted(members)

    module: Dict[str, List[str]] = {}
    for name in dir(_core):
        if name.startswith("_"):
            continue
        obj = getattr(_core, name)
        if isinstance(obj, type):
            module[name] = sorted(
                _describe(n, getattr(obj, n)) for n in dir(obj)
                if not n.startswith("_"))
        else:
            module[name] = [_describe(name, obj)]
    problems = [f"{name}: stub {stub.get(name)} != module {module.get(name)}"
                for name in sorted(set(stub) | set(module))
                if stub.get(name) != module.get(name)]
    assert not problems, ("jaxlake/_core.pyi disagrees with the compiled "
                          "module; update the stub:\n" + "\n".join(problems))


def test_version_is_the_distribution_version() -> None:
    from importlib import metadata
    assert metadata.version("jaxlake") == jaxlake.__version__


def test_recorder_names_the_record_extra(monkeypatch: Any) -> None:
    from importlib import metadata

    from jaxlake._src.trace import gpu, recorder
    versions = {"jaxlib": "0.10.2"}

    def version(dist: str) -> str:
        if dist in versions:
            return versions[dist]
        raise metadata.PackageNotFoundError(dist)

    monkeypatch.setattr(metadata, "version", version)
    monkeypatch.setattr(gpu, "_TOPOLOGIES", {})
    with pytest.raises(recorder.RecorderError) as info:
        recorder.gpu_devices(1)
    assert "pip install 'jaxlake[record]'" in str(info.value)
    assert "jax-cuda12-plugin" in str(info.value)
    versions.update({"jax-cuda12-plugin": "0.10.1",
                     "jax-cuda12-pjrt": "0.10.2"})
    problem = recorder.plugin_problem() or ""
    assert "jax-cuda12-plugin 0.10.1" in problem
    assert "must be jaxlib's version" in problem
    versions["jax-cuda12-plugin"] = "0.10.2"
    assert recorder.plugin_problem() is None


def test_inactive_status_is_one_short_line() -> None:
    from jaxlake._src.xla import integration as xla
    reason = ("no CUDA driver found: libcuda.so.1 is in none of /usr/lib, "
              "/usr/lib64 nor in the linker cache (set JAXLAKE_REAL_LIBCUDA "
              "to its absolute path)")
    text = str(xla.Status(False, reason))
    assert text == ("jaxlake: lake inactive: no CUDA driver found "
                    "(`jaxlake doctor` says more)")
    assert xla.Status(False, reason).reason == reason  # the whole of it
    short = "cuInit failed with CUDA error 100"
    assert str(xla.Status(False, short)) == f"jaxlake: lake inactive: {short}"


PUBLIC_CLASSES = [name for name in jaxlake.__all__
                  if isinstance(getattr(jaxlake, name), type)]


@pytest.mark.parametrize("name", PUBLIC_CLASSES)
def test_public_classes_carry_their_public_name(name: str) -> None:
    cls = getattr(jaxlake, name)
    assert cls.__module__ == "jaxlake"
    assert f"{cls.__module__}.{cls.__qualname__}" == f"jaxlake.{name}"


def test_exceptions_print_and_pickle_under_their_public_name() -> None:
    import pickle
    import traceback
    try:
        jaxlake.resolve_options({"capacity": "banana"})
    except jaxlake.ConfigurationError as error:
        text = "".join(traceback.format_exception_only(type(error), error))
    assert text.startswith("jaxlake.ConfigurationError: ")
    assert "_src" not in text
    for error in (jaxlake.ConfigurationError("bad"),
                  jaxlake.OutOfMemoryError("no room", 4096, 2),
                  jaxlake.DriverError("failed", "invalid_value"),
                  jaxlake.InvariantError("broken"),
                  jaxlake.RecorderError("no plugin")):
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is type(error) and str(back) == str(error)
        assert back.__dict__ == error.__dict__
    stats = jaxlake.Lake(backend="sim").stats()
    assert pickle.loads(pickle.dumps(stats)) == stats
    option = jaxlake.option_table()[0]
    assert pickle.loads(pickle.dumps(option)) == option
