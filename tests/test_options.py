"""The option table: parsing, environment variables and errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from typing import Dict

import pytest

import jaxlake
from jaxlake import resolve_options

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30


@pytest.mark.parametrize("text, nbytes", [
    ("4096", 4096), ("4GiB", 4 * GIB), ("512 MiB", 512 * MIB),
    ("2mib", 2 * MIB), ("1.5GiB", 3 * GIB // 2), ("64KiB", 64 * KIB),
    ("1KB", 1000), ("2MB", 2_000_000), ("3GB", 3_000_000_000), ("7B", 7),
    (" 1TiB ", 1 << 40),
    # GNU-style single letters are powers of 1024, as in dd and numfmt
    ("16G", 16 * GIB), ("16g", 16 * GIB), ("512M", 512 * MIB),
    ("4k", 4 * KIB), ("2Ti", 2 << 40), ("16gb", 16 * 10**9),
    # exponents, as long as the bytes are whole
    ("1e9", 10**9), ("1E9", 10**9), ("2.5e3KB", 2_500_000),
    ("1e3KiB", 1000 * KIB), ("+8", 8), ("0", 0),
])
def test_parse_size(text: str, nbytes: int) -> None:
    assert jaxlake.parse_size(text) == nbytes


@pytest.mark.parametrize("text, why", [
    ("", "not a size"), ("GiB", "not a size"), ("4 GiBs", "not a size"),
    ("-1", "negative"), ("-1GiB", "negative"), ("1.5", "whole number"),
    ("abc", "not a size"), ("4 parsecs", "not a size"),
    ("1.0000001KiB", "whole number"), ("1e-3", "whole number"),
    ("1e30TiB", "2**64"), ("1e999", "out of range")])
def test_parse_size_rejects(text: str, why: str) -> None:
    with pytest.raises(ValueError) as info:
        jaxlake.parse_size(text)
    assert why in str(info.value) and repr(text) in str(info.value)


def test_parse_size_lists_the_forms() -> None:
    with pytest.raises(ValueError) as info:
        jaxlake.parse_size("4 parsecs")
    for form in ("16G", "512MiB", "1e9", "KB/MB/GB/TB"):
        assert form in str(info.value)


@pytest.mark.parametrize("nbytes, text", [
    (0, "0 B"), (1023, "1023 B"), (1024, "1.00 KiB"), (1536, "1.50 KiB"),
    (10**6, "977 KiB"), (9.13 * MIB, "9.13 MiB"), (886 * KIB, "886 KiB"),
    ((1 << 30) - 1, "1.00 GiB"), (36.4 * GIB, "36.4 GiB"),
    (5 << 40, "5.00 TiB")])
def test_format_bytes_picks_the_unit(nbytes: float, text: str) -> None:
    from jaxlake._src.options import format_bytes
    assert format_bytes(nbytes) == text


def test_capacity_zero_is_an_error_that_says_what_to_do() -> None:
    with pytest.raises(jaxlake.ConfigurationError) as info:
        resolve_options(environ={"JAXLAKE_CAPACITY": "0"})
    assert "leave JAXLAKE_CAPACITY unset" in str(info.value)
    with pytest.raises(jaxlake.ConfigurationError) as info:
        resolve_options(environ={"JAXLAKE_CAPACITY": "-1GiB"})
    assert "negative" in str(info.value)


def test_defaults_come_from_the_table() -> None:
    resolved = resolve_options(environ={})
    assert resolved == {o.name: o.default for o in jaxlake.option_table()}
    assert resolved["stitch"] is True and resolved["small_limit"] == 0


def test_keyword_arguments_are_checked() -> None:
    resolved = resolve_options({"capacity": "4GiB", "stitch": False,
                                "small_limit": "64KiB", "stitch_cache": 3,
                                "granularity": None}, environ={})
    assert resolved["capacity"] == 4 * GIB
    assert resolved["stitch"] is False
    assert resolved["small_limit"] == 64 * KIB
    assert resolved["stitch_cache"] == 3
    assert resolved["granularity"] is None  # None: not given


def test_environment_values_are_forgiving() -> None:
    env = {"JAXLAKE_CAPACITY": "512MiB", "JAXLAKE_STITCH": "off",
           "JAXLAKE_STITCH_GROW": "Yes", "JAXLAKE_RECORD_TRACE": "1",
           "JAXLAKE_STITCH_MIN": "1 GB", "JAXLAKE_MAX_PIECES": "8"}
    resolved = resolve_options(environ=env)
    assert resolved["capacity"] == 512 * MIB
    assert resolved["stitch"] is False
    assert resolved["stitch_grow"] is True
    assert resolved["record_trace"] is True
    assert resolved["stitch_min"] == 10**9
    assert resolved["max_pieces"] == 8


@pytest.mark.parametrize("text, value", [
    ("0.5", 0.5), ("1.0", 1.0), (".25", 0.25), ("3", 3), ("2GiB", 2 * GIB)])
def test_capacity_from_environment(text: str, value: object) -> None:
    resolved = resolve_options(environ={"JAXLAKE_CAPACITY": text})
    assert resolved["capacity"] == value
    assert type(resolved["capacity"]) is type(value)


def test_keyword_arguments_win_over_the_environment() -> None:
    env = {"JAXLAKE_STITCH": "0", "JAXLAKE_CAPACITY": "1GiB"}
    resolved = resolve_options({"stitch": True, "capacity": 2 * GIB},
                               environ=env)
    assert resolved["stitch"] is True
    assert resolved["capacity"] == 2 * GIB


def test_lake_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAXLAKE_CAPACITY", "32MiB")
    monkeypatch.setenv("JAXLAKE_RECORD_TRACE", "true")
    lake = jaxlake.Lake("sim")
    assert lake.capacity == 32 * MIB
    assert lake.options["record_trace"] is True
    assert jaxlake.Lake("sim", capacity="16MiB").capacity == 16 * MIB


def test_misspelt_option_names_the_valid_ones() -> None:
    with pytest.raises(jaxlake.ConfigurationError) as info:
        jaxlake.Lake("sim", stich=False)
    message = str(info.value)
    assert "'stich'" in message and "did you mean 'stitch'" in message
    for option in jaxlake.option_table():
        assert option.name in message
    with pytest.raises(ValueError):  # ConfigurationError is a ValueError
        resolve_options({"capcity": 1}, environ={})


@pytest.mark.parametrize("name, value, expected", [
    ("stitch", "yes", "a bool"),          # keyword booleans must be bools
    ("stitch", 1, "a bool"),
    ("small_limit", -1, "a size in bytes >= 0"),
    ("small_limit", 1.5, "a size in bytes >= 0"),
    ("small_limit", True, "a size in bytes >= 0"),
    ("small_limit", "lots", "a size in bytes >= 0"),
    ("granularity", 3 * MIB, "power of two"),
    ("granularity", 1024, "page size"),
    ("alignment", 300, "power of two"),
    ("max_pieces", "1MiB", "an int >= 0"),
    ("capacity", 0, "a size in bytes > 0"),
    ("capacity", 1.5, "in (0, 1]"),
    ("capacity", -2, "a size in bytes > 0"),
    ("capacity", [1], "a size in bytes > 0"),
])
def test_bad_values_name_option_value_and_expectation(
        name: str, value: object, expected: str) -> None:
    with pytest.raises(jaxlake.ConfigurationError) as info:
        resolve_options({name: value}, environ={})
    message = str(info.value)
    assert f"option {name}" in message
    assert repr(value) in message
    assert expected in message


@pytest.mark.parametrize("var, value", [
    ("JAXLAKE_STITCH", "maybe"), ("JAXLAKE_CAPACITY", "lots"),
    ("JAXLAKE_CAPACITY", "2.5"), ("JAXLAKE_MAX_PIECES", "-3"),
    ("JAXLAKE_SMALL_LIMIT", "1.5 parsecs")])
def test_bad_environment_values_name_the_variable(var: str,
                                                  value: str) -> None:
    with pytest.raises(jaxlake.ConfigurationError) as info:
        resolve_options(environ={var: value})
    message = str(info.value)
    assert var in message and repr(value) in message and "expected" in message


def test_unknown_environment_variable_warns() -> None:
    with pytest.warns(jaxlake.ConfigurationWarning) as record:
        resolve_options(environ={"JAXLAKE_STICH": "1"})
    message = str(record[0].message)
    assert "JAXLAKE_STICH" in message
    assert "did you mean 'JAXLAKE_STITCH'" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resolve_options(environ={"JAXLAKE_STITCH": "1", "OTHER": "x"})


def test_option_docs_and_expectations_are_written() -> None:
    for option in jaxlake.option_table():
        assert option.doc and option.expected


# -- Python and the shim agree on sizes ---------------------------------------
# parse_size is the one size parser: every path that starts the shim
# resolves the options in Python and hands the shim plain decimal bytes
# (see the note in jaxlake/_src/options.py). These tests hold both halves of
# that contract: what Python writes the shim reads as the same number, and a
# spelling Python did not normalise is refused by the shim, never read as
# another size.

SPELLINGS = {
    "JAXLAKE_CAPACITY": "1.5G", "JAXLAKE_SMALL_LIMIT": "1e6",
    "JAXLAKE_SMALL_SLAB": "4M", "JAXLAKE_STITCH_MIN": "2.5e3KB",
    "JAXLAKE_ALIGNMENT": "512", "JAXLAKE_MAX_PIECES": "8",
    "JAXLAKE_STITCH_CACHE": "3", "JAXLAKE_STITCH": "off",
}


def _shim_python(code: str, env: Dict[str, str]) -> str:
    full = {k: v for k, v in os.environ.items()
            if not k.startswith("JAXLAKE") and k != "XLA_FLAGS"}
    full["JAX_PLATFORMS"] = "cpu"
    full.update(env)
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)],
                            env=full, capture_output=True, text=True,
                            timeout=180, cwd="/")
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _shim_missing() -> bool:
    from jaxlake._src.xla import integration as xla
    return not os.path.isfile(xla.shim_path())


@pytest.mark.skipif(_shim_missing(), reason="this build of jaxlake has no "
                    "CUDA shim (x86-64 Linux only)")
def test_shim_reads_what_python_parsed(fake_driver: str) -> None:
    out = _shim_python("""
        import json
        import jaxlake
        from jaxlake._src.xla import integration as xla
        status = jaxlake.configure()
        print("STATUS", status.active, status.reason)
        print("SHIM", json.dumps(xla._loaded_shim().status()["options"]))
        print("PY", json.dumps(jaxlake.resolve_options()))
    """, dict(SPELLINGS, JAXLAKE_REAL_LIBCUDA=fake_driver))
    assert "STATUS True" in out, out
    shim = json.loads(out.split("SHIM ", 1)[1].splitlines()[0])
    python = json.loads(out.split("PY ", 1)[1].splitlines()[0])
    assert python["capacity"] == 3 * GIB // 2
    assert python["small_limit"] == 10**6
    assert python["stitch_min"] == 2_500_000
    for name in ("capacity", "small_limit", "small_slab", "stitch_min",
                 "alignment", "max_pieces", "stitch_cache", "stitch"):
        assert shim[name] == python[name], name


@pytest.mark.skipif(_shim_missing(), reason="this build of jaxlake has no "
                    "CUDA shim (x86-64 Linux only)")
def test_shim_refuses_spellings_python_did_not_write(fake_driver: str
                                                     ) -> None:
    # The shim loaded directly, without Python resolving the options first.
    out = _shim_python("""
        from jaxlake._src.xla import integration as xla
        shim = xla._Shim(xla.shim_path())
        print("ACTIVE", shim.active)
        print("REASON", shim.reason())
    """, {"JAXLAKE_REAL_LIBCUDA": fake_driver, "JAXLAKE_CAPACITY": "16G"})
    assert "ACTIVE False" in out
    assert "JAXLAKE_CAPACITY='16G'" in out


@pytest.mark.parametrize("option", [o for o in jaxlake.option_table()
                                    if o.kind != "bool"],
                         ids=lambda o: o.name)
def test_environment_errors_offer_only_what_a_variable_can_hold(
        option: jaxlake.Option) -> None:
    """A variable holds a string: never "None", never "an int"."""
    with pytest.raises(jaxlake.ConfigurationError) as info:
        resolve_options(environ={option.env: "banana"})
    message = str(info.value)
    assert option.env in message and "'banana'" in message
    assert "None" not in message and "an int" not in message
    # The keyword argument may be None (the default), and its error says so.
    if option.kind == "capacity":
        with pytest.raises(jaxlake.ConfigurationError,
                           match="or None for the whole device"):
            resolve_options({option.name: "banana"})
        with pytest.raises(jaxlake.ConfigurationError) as zero:
            resolve_options(environ={option.env: "0"})
        assert "leave JAXLAKE_CAPACITY unset" in str(zero.value)
        assert "None" not in str(zero.value)
