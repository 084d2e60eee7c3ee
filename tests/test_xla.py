"""The XLA integration without a GPU or a driver: XLA_FLAGS handling, the
plugin's names and versions, configure() where no driver is found, the
start-up hook, and `jaxlake doctor`. The same over the shim and the fake
driver is in test_xla_fake_driver.py; the shim's symbol coverage of the
plugins in test_xla_symbols.py.

configure() acts once per process, so each scenario runs in a fresh Python
process.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
from typing import Any

import pytest

import jaxlake
from jaxlake._src.xla import integration as xla
from jaxlake._src.xla import cli as xla_cli
from xla_util import HAS_DRIVER, NO_JAX, plugin_library, run_python

jax = pytest.importorskip("jax", reason=NO_JAX)


# -- pure functions -----------------------------------------------------------


def test_split_xla_flags_keeps_other_flags_intact() -> None:
    kept, ours = xla.split_xla_flags(
        "--xla_gpu_autotune_level=0 --jaxlake_capacity=4GiB "
        "--xla_dump_to='/tmp/a b' --jaxlake --jaxlake_stitch=false "
        "--xla_force_host_platform_device_count=8")
    assert ours == {"capacity": "4GiB", "enable": "true", "stitch": "false"}
    assert kept == ("--xla_gpu_autotune_level=0 '--xla_dump_to=/tmp/a b' "
                    "--xla_force_host_platform_device_count=8")
    assert xla.split_xla_flags("") == ("", {})
    assert xla.split_xla_flags("--xla_a=1") == ("--xla_a=1", {})


def test_strip_xla_flags_removes_only_jaxlake_entries() -> None:
    env = {"XLA_FLAGS": "--xla_a=1 --jaxlake_capacity=1GiB --xla_b"}
    assert xla.strip_xla_flags(env) == {"capacity": "1GiB"}
    assert env["XLA_FLAGS"] == "--xla_a=1 --xla_b"
    env = {"XLA_FLAGS": "--jaxlake"}
    xla.strip_xla_flags(env)
    assert "XLA_FLAGS" not in env


def test_shim_environment_normalises_values() -> None:
    env = xla.shim_environment(
        {"capacity": 0.5, "stitch": False, "stitch_min": 1 << 29,
         "small_limit": 1 << 20}, "/usr/lib/libcuda.so.1", None)
    assert env["JAXLAKE_CAPACITY_FRACTION"] == "0.5"
    assert env["JAXLAKE_STITCH"] == "0"
    assert env["JAXLAKE_STITCH_MIN"] == str(1 << 29)
    assert env["JAXLAKE_REAL_LIBCUDA"] == "/usr/lib/libcuda.so.1"


def test_setting_warnings_name_the_bypass() -> None:
    modes = xla_cli.update_modes()
    other = [m for m in modes if m != "ALWAYS_UPDATE"]
    assert other, modes
    warn = xla_cli.setting_warnings({
        "XLA_FLAGS": f"--xla_gpu_command_buffer_update_mode={other[0]}",
        "XLA_PYTHON_CLIENT_ALLOCATOR": "bfc",
        "XLA_PYTHON_CLIENT_PREALLOCATE": "true"})
    assert len(warn) == 3, warn
    assert other[0] in warn[0] and "own VMM allocator" in warn[0]
    assert "docs/benchmarks.md" in warn[0]
    assert "bfc" in warn[1]
    assert "preallocation" in warn[2]
    warn = xla_cli.setting_warnings({"XLA_PYTHON_CLIENT_ALLOCATOR": "vmm"})
    assert len(warn) == 1 and "own VMM allocator instead of the lake" in warn[0]
    # A value XLA does not know is named as such, not as a bypass.
    warn = xla_cli.setting_warnings({
        "XLA_FLAGS": "--xla_gpu_command_buffer_update_mode=RECONSTRUCT"})
    assert len(warn) == 1 and "not one of XLA's values" in warn[0]
    assert not xla_cli.setting_warnings({
        "XLA_FLAGS": "--xla_gpu_command_buffer_update_mode=ALWAYS_UPDATE"})
    assert not xla_cli.setting_warnings({"XLA_FLAGS": "--xla_gpu_autotune_level=0"})


def test_routing_flags_are_named_and_checked_against_the_plugin() -> None:
    from jaxlake._src.xla import plugin
    known = plugin.PluginInfo("fake.so", frozenset({
        "xla_gpu_temp_buffer_use_separate_color",
        "xla_gpu_enable_nccl_user_buffers",
        "xla_gpu_command_buffer_update_mode"}), ("ALWAYS_UPDATE", "SKIP_TEMP"))
    warn = plugin.routing_warnings({}, {
        "xla_gpu_temp_buffer_use_separate_color": "true",
        "xla_gpu_enable_nccl_user_buffers": "true",
        "xla_gpu_experimental_enable_nccl_symmetric_buffers": "true",
        "xla_gpu_command_buffer_update_mode": "NEVER_UPDATE"}, known)
    assert len(warn) == 4, warn
    assert "not one of XLA's values (ALWAYS_UPDATE, SKIP_TEMP)" in warn[0]
    assert "second cuda_async allocator" in warn[1]
    assert "NCCL" in warn[2]
    assert "symmetric" in warn[3] and "does not know" in warn[3]
    assert not plugin.routing_warnings({}, {
        "xla_gpu_temp_buffer_use_separate_color": "false"}, known)


def test_enum_values_read_a_serialized_descriptor() -> None:
    from jaxlake._src.xla import plugin
    def value(name: bytes, n: int) -> bytes:
        body = b"\n" + bytes([len(name)]) + name + b"\x10" + bytes([n])
        return b"\x12" + bytes([len(body)]) + body
    data = (b"junk\n\x17CommandBufferUpdateMode" + value(b"ALWAYS_UPDATE", 0)
            + value(b"SKIP_TEMP", 1) + b'"\x10\n\x0eCUDNN_NEXT_ENUM')
    assert plugin.enum_values(data, "CommandBufferUpdateMode") == (
        "ALWAYS_UPDATE", "SKIP_TEMP")
    assert plugin.enum_values(data, "Missing") == ()


def test_version_mismatches_are_warned() -> None:
    from jaxlake._src.xla import plugin
    same = {"jax": "0.12.0.1", "jaxlib": "0.12.0.1",
            "jax-cuda12-plugin": "0.12.0.1", "jax-cuda12-pjrt": "0.12.0.1"}
    assert plugin.version_warnings(same) == []
    warn = plugin.version_warnings({**same, "jax-cuda12-plugin": "0.10.2",
                                    "jax-cuda12-pjrt": "0.10.2"})
    assert len(warn) == 1 and "jax-cuda12-plugin 0.10.2" in warn[0]
    assert "pip install 'jax-cuda12-plugin==0.12.0.1' " \
        "'jax-cuda12-pjrt==0.12.0.1'" in warn[0]
    warn = plugin.version_warnings({"jax": "0.13.0", "jaxlib": "0.12.0.1"})
    assert any("same release" in w for w in warn)
    assert any("jax 0.13.0 is outside the range" in w for w in warn)
    warn = plugin.version_warnings({"jax": "0.9.2", "jaxlib": "0.9.2",
                                    "jax-cuda13-plugin": "0.9.2",
                                    "jax-cuda13-pjrt": "0.9.2"})
    assert len(warn) == 2 and all("outside the range" in w for w in warn)


def test_doctor_names_a_version_mismatch(monkeypatch: Any) -> None:
    import io
    from jaxlake._src.xla import plugin
    monkeypatch.setattr(plugin, "installed_versions", lambda: {
        "jax": "0.12.0.1", "jaxlib": "0.12.0.1",
        "jax-cuda12-plugin": "0.10.2", "jax-cuda12-pjrt": "0.10.2"})
    out = io.StringIO()
    xla_cli.doctor(out, start_jax=False)
    assert "warning: jax-cuda12-plugin 0.10.2, jax-cuda12-pjrt 0.10.2 " \
        "with jaxlib 0.12.0.1" in out.getvalue(), out.getvalue()
    assert "tested jax:" in out.getvalue()


def test_update_modes_are_the_plugins_own() -> None:
    """The update modes the doctor knows are those of the installed CUDA
    plugin's CommandBufferUpdateMode enum, and no other."""
    import re
    data = plugin_library().read_bytes()
    assert b"xla_gpu_command_buffer_update_mode" in data
    # The enum's serialized descriptor: its name (23 bytes), then its
    # values, each a field-2 record up to the next enum (field 4, '"').
    at = data.index(b"\n\x17CommandBufferUpdateMode") + 25
    end = data.index(b'"', at)
    values = re.findall(rb"[A-Z][A-Z_]{4,}", data[at:end])
    assert set(xla_cli.update_modes()) == {v.decode() for v in values}
    assert "ALWAYS_UPDATE" in xla_cli.update_modes()


# -- configure() without a driver ------------------------------------------------


@pytest.mark.skipif(HAS_DRIVER, reason="a CUDA driver is installed here")
def test_no_driver_inactive_and_jax_runs_on_cpu() -> None:
    result = run_python("""
        import jax, jaxlake
        status = jaxlake.configure(capacity="1GiB")
        assert not status.active and not status
        print("REASON", status.reason)
        print("SUM", float(jax.numpy.arange(4.0).sum()))
    """)
    assert result.returncode == 0, result.stderr
    assert "REASON no CUDA driver found" in result.stdout
    assert "SUM 6.0" in result.stdout


@pytest.mark.skipif(HAS_DRIVER, reason="a CUDA driver is installed here")
def test_required_raises_when_inactive() -> None:
    result = run_python("""
        import jaxlake
        try:
            jaxlake.configure(required=True)
        except jaxlake.ConfigurationError as e:
            print("RAISED", e)
    """)
    assert "RAISED jaxlake.configure(required=True): no CUDA driver" in \
        result.stdout, result.stderr


def test_configure_after_backends_exist_raises() -> None:
    result = run_python("""
        import jax, jaxlake
        jax.devices()
        try:
            jaxlake.configure()
        except jaxlake.ConfigurationError as e:
            print("RAISED", e)
    """)
    assert "RAISED JAX has already initialised its backends" in \
        result.stdout, result.stderr
    assert "before the first jax.devices()" in result.stdout


def test_bad_option_values_name_the_option() -> None:
    result = run_python("""
        import jaxlake
        for kwargs in ({"capacity": "lots"}, {"stich": True},
                       {"granularity": 4096}, {"stitch_cache": -1}):
            try:
                jaxlake.configure(**kwargs)
            except jaxlake.ConfigurationError as e:
                print("RAISED", e)
    """)
    lines = [l for l in result.stdout.splitlines() if l.startswith("RAISED")]
    assert len(lines) == 4, result.stdout + result.stderr
    assert "capacity" in lines[0] and "'lots'" in lines[0]
    assert "stich" in lines[1] and "did you mean" in lines[1]
    assert "host and sim" in lines[2]
    assert "stitch_cache" in lines[3]


def test_bad_xla_flags_entry_is_named() -> None:
    # The start-up hook sees the entry first and reports it on stderr.
    result = run_python("import os; print('FLAGS', os.environ['XLA_FLAGS'])",
                        {"XLA_FLAGS": "--xla_a=1 --jaxlake_capcity=1GiB"})
    assert "jaxlake: XLA_FLAGS entry --jaxlake_capcity" in result.stderr
    assert "did you mean 'capacity'" in result.stderr
    assert "FLAGS --xla_a=1" in result.stdout
    # configure() itself, when the hook is not installed or was bypassed.
    env = {"XLA_FLAGS": "--jaxlake_stitch_min=lots"}
    flags = xla.split_xla_flags(env["XLA_FLAGS"])[1]
    with pytest.raises(jaxlake.ConfigurationError, match="stitch_min"):
        jaxlake.resolve_options(flags)


# -- the start-up hook -------------------------------------------------------------


def test_startup_hook_is_inert_without_jaxlake() -> None:
    result = run_python("""
        import sys, os
        print("LOADED", "jaxlake._src.xla.integration" in sys.modules)
        print("FLAGS", os.environ.get("XLA_FLAGS"))
    """, {"XLA_FLAGS": "--xla_a=1"})
    assert "LOADED False" in result.stdout, result.stderr
    assert "FLAGS --xla_a=1" in result.stdout
    assert result.stderr == ""


def test_startup_hook_acts_with_jaxlake_1() -> None:
    result = run_python("""
        import sys, os
        print("LOADED", "jaxlake._src.xla.integration" in sys.modules)
        print("FLAGS", os.environ.get("XLA_FLAGS"))
        import jax
        print("SUM", float(jax.numpy.arange(3.0).sum()), len(jax.devices()))
    """, {"JAXLAKE": "1",
          "XLA_FLAGS": "--xla_force_host_platform_device_count=2 "
                       "--jaxlake_capacity=2GiB --xla_dump_hlo_as_text"})
    assert "LOADED True" in result.stdout, result.stderr
    # XLA would abort on the unknown flag: the hook removed it, nothing else.
    assert ("FLAGS --xla_force_host_platform_device_count=2 "
            "--xla_dump_hlo_as_text") in result.stdout
    assert "SUM 3.0 2" in result.stdout
    if not HAS_DRIVER:
        assert "jaxlake: lake inactive: no CUDA driver found" in result.stderr


def test_startup_hook_acts_on_xla_flags_alone() -> None:
    result = run_python("""
        import sys
        print("LOADED", "jaxlake._src.xla.integration" in sys.modules)
    """, {"XLA_FLAGS": "--jaxlake"})
    assert "LOADED True" in result.stdout, result.stderr


def test_startup_hook_required_stops_the_program() -> None:
    if HAS_DRIVER:
        pytest.skip("a CUDA driver is installed here")
    result = run_python("print('RAN')", {"JAXLAKE": "1",
                                         "JAXLAKE_REQUIRED": "1"})
    assert result.returncode == 1
    assert "RAN" not in result.stdout


# -- jaxlake doctor, the public names ------------------------------------------


def test_doctor_reports(tmp_path: pathlib.Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAXLAKE")}
    env["JAX_PLATFORMS"] = "cpu"
    # A mode of the installed plugin's other than ALWAYS_UPDATE (0.10:
    # NEVER_UPDATE, 0.11 and 0.12: SKIP_TEMP).
    mode = [m for m in xla_cli.update_modes() if m != "ALWAYS_UPDATE"][0]
    env["XLA_FLAGS"] = f"--xla_gpu_command_buffer_update_mode={mode}"
    result = subprocess.run([sys.executable, "-m", "jaxlake", "doctor"],
                            env=env, capture_output=True, text=True,
                            timeout=180, cwd="/")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for key in ("jaxlake:", "jax:", "shim:", "CUDA driver:", "lake:",
                "hooks live:"):
        assert key in out, out
    assert "own VMM allocator" in out
    if not HAS_DRIVER:
        assert "inactive: no CUDA driver found" in out


def test_public_names() -> None:
    for name in ("configure", "stats", "memory_report", "trace"):
        assert callable(getattr(jaxlake, name))
