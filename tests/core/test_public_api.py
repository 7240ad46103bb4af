from __future__ import annotations

import inspect
import re
from pathlib import Path

import asyncbackends as ab

# The names DESIGN.md's public API promises (code outside the project calls exactly these).
CONTRACT = {
    "SamplingParams", "GenerationRequest", "GenerationResult", "Completion", "LoglikelihoodRequest",
    "LoglikelihoodResult", "AsyncBackend", "Capabilities", "create_backend", "acreate_backend",
    "register_backend", "available_backends", "gather", "as_completed", "run_batch", "RetryPolicy",
    "RateLimit", "get_loop_manager", "LoopManager", "AsyncBackendsError", "BackendNotFoundError", "LoopError",
    "InvalidRequestError", "BackendError", "BackendUnavailableError", "RateLimitedError", "BackendTimeoutError",
    "RequestRejectedError", "BackendBrokenError", "BackendClosedError", "pool", "limited", "Timeouts",
    "ContextLengthError",
}  # fmt: skip


def test_all_equals_the_public_names() -> None:
    public = {
        name
        for name, value in vars(ab).items()
        if (not name.startswith("_") or name == "__version__") and not inspect.ismodule(value)
    }
    assert set(ab.__all__) == public
    assert callable(ab.gather) and not inspect.ismodule(ab.gather)  # not shadowed by the submodule
    assert len(ab.__all__) == len(set(ab.__all__))


def test_contract_names_are_exported() -> None:
    assert set(ab.__all__) >= CONTRACT


def test_defaults_match_the_design() -> None:
    assert ab.RetryPolicy() == ab.RetryPolicy(max_attempts=3, initial_delay=0.5, max_delay=30.0, jitter=True)
    assert ab.RateLimit() == ab.RateLimit(requests_per_second=None, tokens_per_minute=None)
    assert ab.Timeouts() == ab.Timeouts(total=None, idle=120)
    assert issubclass(ab.ContextLengthError, ab.RequestRejectedError)
    params = ab.SamplingParams()
    assert (params.max_tokens, params.temperature, params.top_p, params.top_k, params.stop, params.n) == (
        256, 0.0, 1.0, None, (), 1,
    )  # fmt: skip
    assert (params.seed, params.logprobs) == (None, False)


def test_changelog_has_an_unreleased_section() -> None:
    text = (Path(__file__).parents[2] / "CHANGELOG.md").read_text()
    assert re.search(r"^## \[Unreleased\]$", text, re.M)


# Modules a user may import by path; every other module of the package is private by name.
PUBLIC_MODULES = ("asyncbackends", "asyncbackends.abc", "asyncbackends.errors")
PUBLIC_PACKAGES = ("asyncbackends.adapters.", "asyncbackends.integrations.", "asyncbackends.testing.")
FACADES = {
    "asyncbackends",
    "asyncbackends.abc",
    "asyncbackends.adapters.endpoints",
    "asyncbackends.adapters.openai",
    "asyncbackends.adapters.ray",
    "asyncbackends.adapters.tgi",
    "asyncbackends.adapters.vllm",
    "asyncbackends.testing",
    "asyncbackends.testing.contract",
    "asyncbackends.testing.tiny_model",
}
PACKAGE = Path(ab.__file__).parent


def _modules() -> list[str]:
    names = []
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names.append(".".join(parts))
    return sorted(names)


def test_every_module_outside_the_public_ones_is_private_by_name() -> None:
    public = [
        m
        for m in _modules()
        if not any(part.startswith("_") for part in m.split(".")[1:])
        and m not in PUBLIC_MODULES
        and not m.startswith(PUBLIC_PACKAGES)
        and m not in ("asyncbackends.adapters", "asyncbackends.integrations", "asyncbackends.testing")
    ]
    assert public == []


def test_each_name_has_one_all_home_outside_the_facades() -> None:
    import ast

    homes: dict[str, list[str]] = {}
    for name in _modules():
        if name in FACADES:
            continue
        path = PACKAGE.parent.joinpath(*name.split("."))
        tree = ast.parse((path / "__init__.py" if path.is_dir() else path.with_suffix(".py")).read_text())
        own, from_package = set(), set()
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                own |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            elif isinstance(node, ast.ImportFrom) and (
                node.level or (node.module or "").startswith("asyncbackends")
            ):
                from_package |= {a.asname or a.name for a in node.names}
        exported = next(
            (ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
             and any(getattr(t, "id", None) == "__all__" for t in n.targets)),
            [],
        )  # fmt: skip
        # A module exports its own names; re-exporting another module's is the facades' job.
        assert not set(exported) & from_package, f"{name} re-exports {set(exported) & from_package}"
        for n in exported:
            homes.setdefault(n, []).append(name)
    shared = {n: ms for n, ms in homes.items() if len(ms) > 1 and n != "main"}
    assert shared == {}


def _classes_in(annotation: object) -> list[type]:
    import typing

    found: list[type] = []
    if inspect.isclass(annotation) and not typing.get_args(annotation):
        found.append(annotation)
    for arg in typing.get_args(annotation):
        found += _classes_in(arg)
    origin = typing.get_origin(annotation)
    if inspect.isclass(origin):
        found.append(origin)
    return found


def test_every_type_a_public_name_returns_is_importable_from_the_package() -> None:
    import typing

    import asyncbackends.abc as abc_module

    importable = {id(getattr(ab, n)) for n in ab.__all__} | {
        id(getattr(abc_module, n)) for n in abc_module.__all__
    }
    callables = []
    for name in ab.__all__:
        value = getattr(ab, name)
        if inspect.isfunction(value):
            callables.append((name, value))
        elif inspect.isclass(value) and value.__module__.startswith("asyncbackends"):
            callables += [
                (f"{name}.{m}", f)
                for m, f in vars(value).items()
                if not m.startswith("_") and inspect.isfunction(f)
            ]
    missing = {}
    for name, function in callables:
        returned = typing.get_type_hints(function).get("return")
        for cls in _classes_in(returned):
            if cls.__module__.startswith("asyncbackends") and id(cls) not in importable:
                missing[name] = cls.__qualname__
    assert missing == {}
    assert isinstance(ab.pool([ab.create_backend("mock")]), ab.PoolBackend)
    assert isinstance(ab.limited(ab.create_backend("mock"), concurrency=2), ab.LimitedBackend)


def test_the_extension_surface_names_what_it_exports() -> None:
    import asyncbackends.abc as abc_module

    public = {n for n, v in vars(abc_module).items() if not n.startswith("_") and not inspect.ismodule(v)}
    assert set(abc_module.__all__) == public
    assert abc_module.AsyncBackend is ab.AsyncBackend and abc_module.ReplicaStats is ab.ReplicaStats


def test_public_names_report_the_package_as_their_module() -> None:
    import pickle

    named = {
        n: getattr(ab, n)
        for n in ab.__all__
        if inspect.isclass(getattr(ab, n)) or inspect.isfunction(getattr(ab, n))
    }
    assert len(named) > 40
    assert {n: v.__module__ for n, v in named.items() if v.__module__ != "asyncbackends"} == {}
    assert repr(ab.GenerationRequest) == "<class 'asyncbackends.GenerationRequest'>"
    # Pickles name the public path, so moving a private module breaks no stored pickle.
    request = ab.GenerationRequest("x", request_id="r")
    error = ab.RateLimitedError("slow down", backend="b", retry_after=2.0)
    for value in (request, error):
        blob = pickle.dumps(value)
        assert b"asyncbackends._" not in blob
        back = pickle.loads(blob)
        assert type(back) is type(value) and repr(back) == repr(value)
