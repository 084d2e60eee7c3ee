"""The option table: parsing, environment variables and errors."""

from __future__ import annotations

import warnings

import pytest

import jaxlake
from jaxlake import resolve_options

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30


@pytest.mark.parametrize("text, nbytes", [
    ("4096", 4096), ("4GiB", 4 * GIB), ("512 MiB", 512 * MIB),
    ("2mib", 2 * MIB), ("1.5GiB", 3 * GIB // 2), ("64KiB", 64 * KIB),
    ("1KB", 1000), ("2MB", 2_000_000), ("3GB", 3_000_000_000), ("7B", 7),
    (" 1TiB ", 1 << 40),
])
def test_parse_size(text: str, nbytes: int) -> None:
    assert jaxlake.parse_size(text) == nbytes


@pytest.mark.parametrize("text", ["", "GiB", "4 GiBs", "-1", "1.5", "abc",
                                  "4 parsecs", "1.0000001KiB"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        jaxlake.parse_size(text)


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
