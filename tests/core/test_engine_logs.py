"""vLLM's logs on standard error when the library imports vLLM, unless the user chose where they go.

(With a real engine: tests/vllm/test_close_quiet.py, whose scripts' standard output holds their own lines only.)
"""

from __future__ import annotations

import pytest

from asyncbackends._engine_logs import route_vllm_logs_to_stderr


def test_by_default_vllm_logs_to_stderr() -> None:
    env = {"PATH": "/bin"}
    route_vllm_logs_to_stderr(env)
    assert env == {"PATH": "/bin", "VLLM_LOGGING_STREAM": "ext://sys.stderr"}


@pytest.mark.parametrize(
    "chosen",
    [
        {"VLLM_LOGGING_STREAM": "ext://sys.stdout"},  # asked for stdout
        {"VLLM_LOGGING_CONFIG_PATH": "/etc/vllm-logging.json"},  # a config file decides
        {"VLLM_CONFIGURE_LOGGING": "0"},  # vLLM leaves logging to the application
    ],
)
def test_a_users_choice_is_kept(chosen: dict[str, str]) -> None:
    env = dict(chosen)
    route_vllm_logs_to_stderr(env)
    assert env == chosen
