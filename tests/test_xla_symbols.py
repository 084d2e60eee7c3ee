"""The shim's symbol list (cc/shim/cuda_symbols.txt) against the name
tables of the supported CUDA plugins and the installed one, and the built
shim's exports."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

from jaxlake._src.xla import integration as xla
from xla_util import NEEDS_SHIM, NO_JAX, REPO, plugin_library, run_python

jax = pytest.importorskip("jax", reason=NO_JAX)


# -- defect: symbol coverage against the pinned plugin ----------------------------


def _gen_symbols() -> Any:
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "gen_symbols", REPO / "cc" / "shim" / "gen_symbols.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_symbol_list_covers_the_plugins_name_table() -> None:
    gen = _gen_symbols()
    names = gen.plugin_names(plugin_library())
    # jax-cuda12-pjrt 0.10.2 resolves 638 driver names, 0.12.0.1 645.
    assert len(names) >= 600, len(names)
    assert "cuMemAllocFromPoolAsync" in names and "cuInit" in names
    listed = gen.read_list(REPO / "cc" / "shim" / "cuda_symbols.txt")
    assert sorted(names - listed) == []
    for name in ("cuLaunchHostFunc_v2", "cuLaunchHostFunc_v2_ptsz",
                 "cudbgApiInit", "cudbgReportDriverApiError"):
        assert name in listed


#: The plugins whose name tables the repository keeps: jax 0.10, 0.11 and
#: 0.12, CUDA 12 and 13 (cc/shim/plugin_symbols/, from the PJRT wheels).
SUPPORTED_PLUGINS = [f"jax-cuda{c}-pjrt-{v}" for c in (12, 13)
                     for v in ("0.10.2", "0.11.2", "0.12.0.1")]


def test_every_supported_plugin_has_a_name_table() -> None:
    tables = {t.stem: t for t in _gen_symbols().tables()}
    assert sorted(tables) == sorted(SUPPORTED_PLUGINS)


@pytest.mark.parametrize("plugin", SUPPORTED_PLUGINS)
def test_symbol_list_covers_each_supported_plugin(plugin: str) -> None:
    gen = _gen_symbols()
    table = gen.read_list(gen.TABLES / f"{plugin}.txt")
    assert len(table) >= 600, len(table)
    assert "cuMemAllocFromPoolAsync" in table and "cuInit" in table
    # A table holds driver names only: no fragment like cuF or cuO.
    assert all(gen.NAME.match(n) and len(n) >= 6 for n in table), \
        sorted(n for n in table if len(n) < 6)
    listed = gen.read_list(REPO / "cc" / "shim" / "cuda_symbols.txt")
    assert sorted(table - listed) == []
    if "0.12" in plugin:
        assert "cuDevSmResourceSplit" in table


@NEEDS_SHIM
def test_the_built_shim_exports_every_supported_plugins_names() -> None:
    gen = _gen_symbols()
    names = sorted(set().union(*(gen.read_list(t) for t in gen.tables())))
    assert "cuDevSmResourceSplit" in names
    result = run_python(f"""
        import ctypes
        shim = ctypes.CDLL({xla.shim_path()!r})
        missing = [n for n in {names!r} if not hasattr(shim, n)]
        print("MISSING", len(missing), missing[:5])
    """)
    assert "MISSING 0 []" in result.stdout, result.stdout + result.stderr


def test_the_scan_skips_fragments_and_tails() -> None:
    gen = _gen_symbols()
    data = (b"\x00cuF\x00cuO\x00cuInit\x00xcuMemFree\x00cuMemAlloc_v2\x00"
            b"cudbgApiInit\x00cuDevSmResourceSplit\x00")
    assert gen.plugin_names(data) == {
        "cuInit", "cuMemAlloc_v2", "cudbgApiInit", "cuDevSmResourceSplit"}


def test_a_table_is_made_from_a_wheel(tmp_path: pathlib.Path) -> None:
    import zipfile
    wheel = tmp_path / "jax_cuda13_pjrt-9.9.9-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("jax_plugins/xla_cuda13/xla_cuda_plugin.so",
                   b"\x7fELF\x00cuInit\x00cuK\x00cuMemFreeAsync\x00")
        z.writestr("jax_cuda13_pjrt-9.9.9.dist-info/METADATA",
                   "Metadata-Version: 2.1\nName: jax-cuda13-pjrt\n"
                   "Version: 9.9.9\n")
    out = tmp_path / "list.txt"
    out.write_text("cuExisting\n")
    gen = _gen_symbols()
    assert gen.main(["--wheel", str(wheel), "--out", str(out),
                     "--tables-dir", str(tmp_path / "tables")]) == 0
    table = tmp_path / "tables" / "jax-cuda13-pjrt-9.9.9.txt"
    assert gen.read_list(table) == {"cuInit", "cuMemFreeAsync"}
    assert gen.read_list(out) >= {"cuExisting", "cuInit", "cuMemFreeAsync"}
    assert "cuK" not in gen.read_list(out)


@NEEDS_SHIM
def test_the_built_shim_exports_the_plugins_names() -> None:
    names = sorted(_gen_symbols().plugin_names(plugin_library()))
    result = run_python(f"""
        import ctypes
        shim = ctypes.CDLL({xla.shim_path()!r})
        missing = [n for n in {names!r} if not hasattr(shim, n)]
        print("MISSING", len(missing), missing[:5])
    """)
    assert "MISSING 0 []" in result.stdout, result.stdout + result.stderr
