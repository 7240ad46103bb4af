"""The suite catches broken adapters, each for the right reason, and catches a tampered-with suite.

broken_suite.py subclasses the contract once per adapter in broken_adapters.py; it runs here in a pytest
subprocess (a contract failure must not fail this session) and its JUnit report is checked test by test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

HERE = Path(__file__).parent

# (class, contract test) -> words its failure message must hold. Every other contract test must pass or skip.
EXPECTED_FAILURES = {
    ("TestSwapped", "test_results_in_order_exactly_once"): [
        "results[0] answers request 'order-gen-7', not 'order-gen-0'",
        "swapped, lost or repeated",
    ],
    ("TestNIgnored", "test_n_completions_exactly"): ["asked for n=2, got 1 completion(s)"],
    ("TestSwallowedCancel", "test_cancellation_is_prompt_and_harmless"): ["swallowed the cancellation"],
    ("TestSecretInRepr", "test_no_secret_in_repr"): ["a secret appears in repr(vars(backend))"],
    ("TestSecretInRepr", "test_credentials_held_in_secret"): [
        "backend.api_key holds the credential as a plain str"
    ],
    ("TestRawErrors", "test_refusals_are_library_errors"): [
        "rejected_requests[0]",
        "got builtins.ValueError: prompt too long (a raw exception leaked from the adapter)",
    ],
    ("TestRawErrors", "test_transport_failures_are_library_errors"): [
        "raised aiohttp.client_exceptions.ServerDisconnectedError",
        "raise ... from exc",
    ],
    ("TestPrivateLoop", "test_loop_bound_state_on_shared_loop"): [
        "backend._loop is an event loop other than the shared one"
    ],
    ("TestIgnoresClose", "test_aclose_idempotent_then_closed"): [
        "closed after being used: expected BackendClosedError, got a result"
    ],
    ("TestStopIgnored", "test_stop_respected"): ["with stop='h' expected 'T', got 'The capital of F'"],
    ("TestPositiveScore", "test_loglikelihood_is_sum_of_parts"): ["is positive: a probability above 1"],
    ("TestBlocking", "test_does_not_block_the_event_loop"): [
        "inside the adapter while it served 4 x 20 requests",
        "broken_adapters.py:",
        "in generate: time.sleep(0.05)  # noqa: ASYNC251",
        "await asyncio.to_thread(...)",
    ],
    ("TestRepeatedSample", "test_n_samples_vary"): [
        "all 6 samples were identical",
        "draw each sample independently",
    ],
    ("TestRepeatedSample", "test_seeded_n_samples_vary"): ["with seed=1234", "all 6 samples were identical"],
    ("TestSeededCopies", "test_seeded_n_samples_vary"): [
        "at temperature=1.0 with seed=1234, and for every one of",
        "all 6 samples were identical",
        "a seed per sample, seed + i",
    ],
    ("TestSecretInError", "test_no_secret_in_errors_or_logs"): [
        "generate on failing_backend: __cause__ ConnectionError str",
        "while driving errors: log record 'broken_adapters' WARNING",
    ],
    ("TestPlainCredentials", "test_credentials_held_in_secret"): [
        "backend.headers['X-API-Key'] is a credential ('X-API-Key') held as plain text",
        "backend.url is a URL with a password in its userinfo",
        "hold each in ab.Secret",
    ],
    ("TestResultsAfterClose", "test_aclose_ends_requests_in_flight"): [
        "in-flight-0 came back as a result after aclose()",
        "backend._session (a broken_adapters._Session) is still open",
    ],
    ("TestRetryableAtClose", "test_aclose_ends_requests_in_flight"): [
        "in-flight-0 raised asyncbackends.BackendUnavailableError: connection closed",
        "retryable=True: gather would retry it on a closed backend",
    ],
    ("TestQueued", "test_timeout_excludes_waiting_for_a_slot"): [
        "with the adapter's own limit of 2 slots",
        "ran out of time while waiting for a slot",
        "held_slot(semaphore)",
    ],
    ("TestOverrides", "test_no_overrides_DO_NOT_OVERRIDE"): [
        "test_greedy_deterministic (from GenerationContract) is overridden in TestOverrides without "
        "@pytest.mark.xfail(reason=...)",
        "test_stop_respected (from GenerationContract) was deleted in TestOverrides",
    ],
}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], tuple[str, str]]:
    report = tmp_path_factory.mktemp("broken") / "report.xml"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
    }
    command = [sys.executable, "-m", "pytest", str(HERE / "broken_suite.py"), "-q", "-p", "no:cacheprovider"]
    proc = subprocess.run(
        [*command, "-o", "timeout=60", f"--junitxml={report}"],
        cwd=HERE.parent.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    found: dict[tuple[str, str], tuple[str, str]] = {}
    for case in ET.parse(report).iter("testcase"):
        key = (case.get("classname", "").rpartition(".")[2], case.get("name", ""))
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                # A long message is cut in the attribute; the element's text holds the whole report.
                outcome, message = child.tag, child.get("message", "") + "\n" + (child.text or "")
        found[key] = (outcome, message)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(EXPECTED_FAILURES), ids=lambda case: f"{case[0]}-{case[1]}")
def test_broken_adapter_fails_its_contract(
    outcomes: dict[tuple[str, str], tuple[str, str]], case: tuple[str, str]
) -> None:
    outcome, message = outcomes[case]
    assert outcome == "failure", f"{case}: {outcome} {message}"
    for words in EXPECTED_FAILURES[case]:
        assert words in message, message


@pytest.mark.slow
def test_broken_adapters_fail_nothing_else(outcomes: dict[tuple[str, str], tuple[str, str]]) -> None:
    classes = {cls for cls, _ in EXPECTED_FAILURES}
    assert classes <= {cls for cls, _ in outcomes}, "a broken adapter's test class was not collected"
    unexpected = {
        case: result
        for case, result in outcomes.items()
        if case not in EXPECTED_FAILURES and result[0] not in ("passed", "skipped")
    }
    assert not unexpected
    for correct in ("TestClosingCorrectly", "TestHeldSlot"):  # the checks pass for adapters that do it right
        assert outcomes[(correct, "test_aclose_ends_requests_in_flight")][0] == (
            "passed" if correct == "TestClosingCorrectly" else "skipped"
        )
    assert outcomes[("TestHeldSlot", "test_timeout_excludes_waiting_for_a_slot")][0] == "passed"


@pytest.mark.slow
def test_allowed_override_runs_as_expected_failure(outcomes: dict[tuple[str, str], tuple[str, str]]) -> None:
    outcome, message = outcomes[("TestOverrides", "test_chat_prompt")]
    assert outcome == "skipped"  # JUnit files an xfail under skipped
    assert "demonstrates the allowed way to override" in message
    assert ("TestOverrides", "test_stop_respected") not in outcomes  # the deleted test did not run at all


@pytest.mark.slow
def test_pinned_contract_version_skips_newer_contracts(
    outcomes: dict[tuple[str, str], tuple[str, str]],
) -> None:
    outcome, message = outcomes[("TestPinnedToVersion1", "test_n_samples_vary")]
    assert outcome == "skipped"
    assert "added in contract version 2; this class pins contract_version = 1" in message
    assert outcomes[("TestPinnedToVersion1", "test_n_completions_exactly")][0] == "passed"
    outcome, message = outcomes[("TestPinnedToVersion1", "test_seeded_n_samples_vary")]
    assert outcome == "skipped"
    assert "added in contract version 3; this class pins contract_version = 1" in message


@pytest.mark.slow
def test_seeded_copies_pass_the_unseeded_check(outcomes: dict[tuple[str, str], tuple[str, str]]) -> None:
    # Without a seed its samples differ: only the seeded check can catch it.
    assert outcomes[("TestSeededCopies", "test_n_samples_vary")][0] == "passed"
    assert outcomes[("TestSeededCopies", "test_seeded_sampling_reproducible")][0] == "passed"
