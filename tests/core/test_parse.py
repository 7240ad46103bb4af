"""One ``key=value`` parser for the CLI and the pytest plugin; the plugin does not import the CLI."""

from __future__ import annotations

import subprocess
import sys

import pytest

import asyncbackends as ab
from asyncbackends._parse import parse_option_value, parse_options
from asyncbackends.testing.plugin import parse_backend_options


def test_values_are_json_else_words_else_text() -> None:
    assert parse_options(["a=8", " b = 0.5", "c=True", "d=[1, 2]", 'e="8"', "f=float32", "g=None"]) == {
        "a": 8,
        "b": 0.5,
        "c": True,
        "d": [1, 2],
        "e": "8",
        "f": "float32",
        "g": None,
    }
    assert parse_option_value(" NULL ") is None


@pytest.mark.parametrize("bad", ["novalue", "=x", " =x"])
def test_a_pair_without_a_key_is_refused_naming_the_flag(bad: str) -> None:
    with pytest.raises(ab.InvalidRequestError, match="--option must look like key=value"):
        parse_options([bad])
    with pytest.raises(pytest.UsageError, match="--backend-option must look like key=value"):
        parse_backend_options([bad])
    assert parse_backend_options(["x=1"]) == {"x": 1}


def test_the_plugin_does_not_import_the_cli() -> None:
    code = "import sys, asyncbackends.testing.plugin; sys.exit('asyncbackends._cli.main' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
