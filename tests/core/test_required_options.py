"""Required adapter options: named by `required_options`, refused by `create_backend` before anything starts."""

from __future__ import annotations

import re
from typing import Any

import pytest

import asyncbackends as ab
from asyncbackends._cli.main import main
from asyncbackends._registry import required_options


class _NeedsTwo:
    """A stand-in adapter class whose constructor requires ``url`` and ``model``."""

    def __init__(self, url: str, *, model: str, timeout: float = 1.0) -> None:
        raise AssertionError("never built: the options are refused first")


class _CreatesAsync:
    """A stand-in adapter built by an async ``create`` that takes anything beside ``model``."""

    @classmethod
    async def create(cls, model: str, **engine_args: Any) -> Any:
        raise AssertionError("never built: the options are refused first")


class _CreatesForTheConstructor(_NeedsTwo):
    """A stand-in whose async ``create`` names no option: it passes them to the constructor."""

    @classmethod
    async def create(cls, **options: Any) -> Any:
        raise AssertionError("never built: the options are refused first")


def test_required_options_reads_the_factory() -> None:
    assert required_options(f"{__name__}:_NeedsTwo") == ("url", "model")
    assert required_options(f"{__name__}:_CreatesAsync") == ("model",)
    assert required_options(f"{__name__}:_CreatesForTheConstructor") == ("url", "model")
    assert required_options("mock") == ()
    assert required_options("tgi") == ("url",)


@pytest.mark.parametrize(
    ("target", "options", "message"),
    [
        ("_NeedsTwo", {"model": "m"}, "needs option(s) 'url'"),
        ("_NeedsTwo", {}, "needs option(s) 'url', 'model'"),
        ("_CreatesAsync", {"dtype": "float32"}, "needs option(s) 'model'"),
        ("_NeedsTwo", {"ulr": "x", "model": "m"}, "'ulr' (did you mean 'url'?)"),  # the typo is named first
        ("_CreatesForTheConstructor", {"url": "x"}, "needs option(s) 'model'"),
        ("_CreatesForTheConstructor", {"url": "x", "model": "m", "timeot": 1}, "'timeot' (did you mean"),
    ],
)
def test_create_backend_refuses_missing_options(target: str, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ab.InvalidRequestError, match=re.escape(message)):
        ab.create_backend(f"{__name__}:{target}", **options)


def test_cli_names_the_missing_option_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "examples/demo.jsonl", "--backend", f"{__name__}:_NeedsTwo", "--option", "url=x"])
    assert code == 2
    err = capsys.readouterr().err
    assert err == f"asyncbackends run: backend '{__name__}:_NeedsTwo' needs 'model': add --option model=...\n"
