from __future__ import annotations

import pickle

import pytest

import asyncbackends as ab


def test_tree() -> None:
    assert issubclass(ab.BackendNotFoundError, LookupError)
    assert issubclass(ab.LoopError, RuntimeError)
    assert issubclass(ab.InvalidRequestError, ValueError)
    assert issubclass(ab.BackendTimeoutError, TimeoutError)
    for cls in (
        ab.BackendUnavailableError,
        ab.RateLimitedError,
        ab.BackendTimeoutError,
        ab.RequestRejectedError,
        ab.BackendBrokenError,
        ab.BackendClosedError,
    ):
        assert issubclass(cls, ab.BackendError)
    assert issubclass(ab.BackendError, ab.AsyncBackendsError)
    assert not issubclass(ab.InvalidRequestError, ab.BackendError)


@pytest.mark.parametrize(
    ("cls", "retryable"),
    [
        (ab.BackendError, True),
        (ab.BackendUnavailableError, True),
        (ab.RateLimitedError, True),
        (ab.BackendTimeoutError, True),
        (ab.RequestRejectedError, False),
        (ab.AuthenticationError, False),
        (ab.BackendBrokenError, False),
        (ab.BackendClosedError, False),
    ],
)
def test_retryable_defaults_and_message_only_construction(
    cls: type[ab.BackendError], retryable: bool
) -> None:
    error = cls("went wrong")
    assert error.retryable is retryable
    assert str(error) == "went wrong"
    assert cls("x", retryable=not retryable).retryable is (not retryable)


def test_errors_pickle_with_their_attributes() -> None:
    error = ab.RateLimitedError("slow down", retry_after=2.5, backend="tgi", request_id="r1")
    clone = pickle.loads(pickle.dumps(error))
    assert type(clone) is ab.RateLimitedError
    assert (clone.message, clone.retry_after, clone.backend, clone.request_id, clone.retryable) == (
        "slow down",
        2.5,
        "tgi",
        "r1",
        True,
    )
    assert "tgi" in str(clone) and "r1" in str(clone)
    rejected = pickle.loads(pickle.dumps(ab.RequestRejectedError("bad", retryable=False)))
    assert rejected.retryable is False


def test_secret_is_masked_and_unpicklable() -> None:
    secret = ab.Secret("hf_supersecret")
    assert "hf_supersecret" not in repr(secret) and "hf_supersecret" not in str(secret)
    assert "hf_supersecret" not in repr({"token": secret})
    assert secret.get_secret_value() == "hf_supersecret"
    with pytest.raises(TypeError):
        pickle.dumps(secret)
