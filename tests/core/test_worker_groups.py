"""`tests.worker_groups`: the tests that share an engine-holding fixture land on one xdist worker.

A small suite is collected by pytest itself (pytester), so the fixture scopes are pytest's own, not ours;
each case is a sharing that, split across workers, would start its fixture twice (or two Ray clusters).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.worker_groups import group_names

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]

SUITE = {
    # The inner runs' own settings (pytest-asyncio warns when its loop scope is left unset).
    "pytest.ini": """
        [pytest]
        asyncio_default_fixture_loop_scope = function
    """,
    "conftest.py": """
        import pytest

        @pytest.fixture(scope="session")
        def engine():
            return object()

        @pytest.fixture(scope="session")
        def tiny_model():
            return "/a/path"
    """,
    "test_a.py": """
        import pytest

        @pytest.fixture(scope="module")
        def server():
            return object()

        def test_uses_engine(engine): pass
        def test_uses_server_1(server): pass
        def test_uses_server_2(server): pass
        def test_alone(tmp_path_factory): pass
        def test_cheap(tiny_model): pass

        class TestWithClassFixture:
            @pytest.fixture(scope="class")
            @classmethod
            def held(cls):
                return object()

            def test_1(self, held): pass
            def test_2(self, held): pass
    """,
    "test_b.py": """
        def test_also_engine(engine): pass
        def test_plain(): pass
    """,
    # Modules, not a package: a package named ray would meet the real one already imported in this process.
    "ray/test_cluster_1.py": "def test_one(): pass",
    "ray/test_cluster_2.py": "def test_two(): pass",
}


@pytest.fixture
def groups(pytester: pytest.Pytester) -> dict[str, str | None]:
    """Each collected test's group name (None: shares nothing), by test name."""
    for path, text in SUITE.items():
        target = pytester.path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(textwrap.dedent(text))
    items = pytester.getitems(pytester.path)
    names = group_names(items)
    return {item.name: names.get(id(item)) for item in items}


def test_a_session_fixture_ties_its_users_across_modules(groups: dict[str, str | None]) -> None:
    assert groups["test_uses_engine"] is not None
    assert groups["test_uses_engine"] == groups["test_also_engine"]


def test_a_module_or_class_fixture_ties_its_users_apart_from_others(groups: dict[str, str | None]) -> None:
    assert groups["test_uses_server_1"] is not None
    assert groups["test_uses_server_1"] == groups["test_uses_server_2"]
    assert groups["test_1"] is not None
    assert groups["test_1"] == groups["test_2"]
    assert len({groups["test_uses_engine"], groups["test_uses_server_1"], groups["test_1"]}) == 3


def test_pytests_own_and_cheap_fixtures_tie_nothing(groups: dict[str, str | None]) -> None:
    assert groups["test_alone"] is None
    assert groups["test_cheap"] is None
    assert groups["test_plain"] is None


def test_the_ray_directory_is_one_group(groups: dict[str, str | None]) -> None:
    assert groups["test_one"] is not None
    assert groups["test_one"] == groups["test_two"]


def test_under_xdist_each_group_runs_on_one_worker(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The markers reach xdist's scheduler: collection happens on the workers, whose options differ from
    the controller's (a check on the controller's ``--dist`` alone once marked nothing)."""
    pytest.importorskip("xdist")
    suite = {**SUITE, "conftest.py": SUITE["conftest.py"] + RECORDING_HOOKS}
    for path, text in suite.items():
        target = pytester.path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(textwrap.dedent(text))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    result = pytester.runpytest_subprocess("-p", "xdist", "-n", "2", "--dist", "loadgroup", "-q")
    result.assert_outcomes(passed=11)
    ran_on = dict(line.split(" ") for line in (pytester.path / "workers.txt").read_text().splitlines())
    assert ran_on["test_uses_engine"] == ran_on["test_also_engine"]
    assert ran_on["test_uses_server_1"] == ran_on["test_uses_server_2"]
    assert ran_on["test_1"] == ran_on["test_2"]
    assert ran_on["test_one"] == ran_on["test_two"]
    assert len(set(ran_on.values())) == 2  # the rest was spread: both workers ran tests


RECORDING_HOOKS = """
        import os

        from tests.worker_groups import mark_worker_groups

        @pytest.hookimpl(tryfirst=True)
        def pytest_collection_modifyitems(config, items):
            mark_worker_groups(config, items)

        @pytest.fixture(autouse=True)
        def _record_worker(request):
            with open(os.path.join(str(request.config.rootpath), "workers.txt"), "a") as out:
                out.write(f"{request.node.name} {os.environ['PYTEST_XDIST_WORKER']}\\n")
"""
