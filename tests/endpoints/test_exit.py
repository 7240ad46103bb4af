"""At interpreter exit, an endpoint still open gets its on_close action, within close_timeout."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

from asyncbackends.testing.fake_endpoints import FakeEndpointsAPI

from .conftest import TOKEN

ROOT = Path(__file__).resolve().parents[2]

# Builds an endpoint with on_close="delete" and exits without closing it.
SCRIPT = """
import sys
from huggingface_hub import constants
constants.ENDPOINT = sys.argv[1]
constants.INFERENCE_ENDPOINTS_ENDPOINT = sys.argv[1] + "/v2"
import asyncbackends as ab
ab.create_backend(
    "endpoints", name="ep", token=sys.argv[2], on_close="delete", poll_interval=0.02,
    close_timeout=float(sys.argv[3]),
)
print("built", flush=True)
"""


async def run_and_exit(api: FakeEndpointsAPI, close_timeout: float) -> tuple[float, str]:
    """Run the script; seconds from its "built" line to its exit, and its stderr."""
    env = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
    env["PYTHONPATH"] = str(ROOT)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", SCRIPT, api.url, TOKEN, str(close_timeout),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env, cwd=ROOT,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 90)
    built = time.monotonic()
    _, err = await asyncio.wait_for(proc.communicate(), 90)
    assert line == b"built\n" and proc.returncode == 0, err.decode()
    return time.monotonic() - built, err.decode()


@pytest.mark.asyncio
@pytest.mark.timeout(180)
async def test_delete_at_exit_gets_more_than_the_loops_five_seconds(api: FakeEndpointsAPI) -> None:
    api.action_latency = 6.0  # a delete slower than the 5 s the shared loop's shutdown gives a backend
    endpoint = api.add("ep")
    await run_and_exit(api, close_timeout=60)
    assert endpoint.actions == ["delete"] and ("tester", "ep") not in api.endpoints


@pytest.mark.asyncio
@pytest.mark.timeout(180)
async def test_the_wait_at_exit_is_bounded_by_close_timeout(api: FakeEndpointsAPI) -> None:
    api.action_latency = 30.0
    endpoint = api.add("ep")
    elapsed, err = await run_and_exit(api, close_timeout=0.5)
    assert elapsed < 20  # exits after close_timeout, without waiting the delete's 30 s
    assert "could not delete Inference Endpoint tester/ep within close_timeout=0.5 s" in err
    assert endpoint.actions == [] and TOKEN not in err
