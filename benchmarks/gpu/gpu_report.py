"""The report of ``gpu_throughput.py``: rates per mode, ratios to offline, agreement with offline.

Pure functions over the children's JSON results, so they can be checked without a GPU. A suite whose mode
ran in several processes one after another (``compiled-abba``) pools them; ``dp`` merges the offline shards
that ran together, timed by the slowest.
"""

from __future__ import annotations

import statistics
from typing import Any


def _rate(part: dict[str, Any]) -> dict[str, float]:
    elapsed = part["elapsed_s"]
    rates = {"req_per_s": part["requests"] / elapsed, "elapsed_s": elapsed, "requests": part["requests"]}
    if "cpu_s" in part:  # the frontend process's CPU seconds per second of work
        rates["frontend_cpu"] = part["cpu_s"] / elapsed
    if "encode_s" in part:  # offline scoring: how much of elapsed_s went to encoding the texts
        rates["encode_s"] = part["encode_s"]
    if "monitor" in part:  # the GPU's and the host's means over the phase (gpu_monitor.py)
        rates["monitor"] = part["monitor"]
    if "output_tokens" in part:
        rates |= {
            "output_tokens": part["output_tokens"],
            "prompt_tokens": part["prompt_tokens"],
            "out_tok_per_s": part["output_tokens"] / elapsed,
            "total_tok_per_s": (part["output_tokens"] + part["prompt_tokens"]) / elapsed,
        }
    return rates


def _same_greedy(reference: list[list[int]], other: list[list[int]], count: int) -> dict[str, Any]:
    pairs = list(zip(reference[:count], other[:count], strict=False))
    diverge = [
        next((i for i, (a, b) in enumerate(zip(r, o, strict=False)) if a != b), min(len(r), len(o)))
        for r, o in pairs
        if r != o
    ]
    return {
        "compared": len(pairs),
        "identical": sum(r == o for r, o in pairs),
        "identical_tokens": sum(sum(a == b for a, b in zip(r, o, strict=False)) for r, o in pairs),
        "tokens": sum(len(r) for r, _ in pairs),
        "median_first_divergence": sorted(diverge)[len(diverge) // 2] if diverge else None,
    }


def _pooled(runs: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """One mode's processes run one after another (compiled-abba) as one run: rounds pooled in order.

    The first finished process's outputs stand for the mode (they are compared with offline's). The rates
    are the upper-median round's (of an even count, the faster of the two middle ones) and loglikelihood's
    the upper-median process's (of two, the faster), the same rule in every mode. Each process's rounds are
    kept in place, a failed one as ``None``, so that process k of one mode is compared with process k of
    the other, the one that ran next to it.
    """
    done = [r for r in runs if r]
    if not done or len(runs) == 1:
        return done[0] if done else None
    rounds = [r for run in done for r in run["generate"]["rounds"]]
    middle = sorted(rounds, key=lambda r: r["requests"] / r["elapsed_s"])[len(rounds) // 2]
    pooled = {**done[0], "init_s": [r["init_s"] for r in done], "processes": len(done)}
    pooled["generate"] = {**done[0]["generate"], **middle, "rounds": rounds}
    pooled["process_rounds"] = [r["generate"]["rounds"] if r else None for r in runs]
    scored = sorted(
        (r for r in done if "loglikelihood" in r),
        key=lambda r: r["loglikelihood"]["requests"] / r["loglikelihood"]["elapsed_s"],
    )
    if scored:
        pooled["loglikelihood"] = {**done[0]["loglikelihood"], **scored[len(scored) // 2]["loglikelihood"]}
        pooled["loglikelihood"]["logprobs"] = done[0]["loglikelihood"]["logprobs"]
    return pooled


def _paired_ratios(ours: list[list[float] | None], theirs: list[list[float] | None]) -> list[float]:
    """Process k against process k, round i against round i (the same prompts); failed processes skipped."""
    return [
        a / b
        for our_rounds, their_rounds in zip(ours, theirs, strict=False)
        if our_rounds and their_rounds
        for a, b in zip(our_rounds, their_rounds, strict=False)
    ]


def summarize(suite: str, outcomes: dict[str, list[dict[str, Any] | None]], compare: int) -> dict[str, Any]:
    """Rates per mode, ratios to offline, greedy equality and scoring agreement with offline."""
    summary: dict[str, Any] = {}
    if suite != "dp":  # several processes of a mode ran one after another: pool them
        outcomes = {mode: [_pooled(runs)] for mode, runs in outcomes.items()}
    shards = [o for o in outcomes.get("offline", []) if o]
    if len(outcomes.get("offline", [])) > 1:  # dp: the shards ran together; the slower one is the time
        if len(shards) == len(outcomes["offline"]):
            merged = {
                "elapsed_s": max(s["generate"]["elapsed_s"] for s in shards),
                "requests": sum(s["generate"]["requests"] for s in shards),
                "prompt_tokens": sum(s["generate"]["prompt_tokens"] for s in shards),
                "output_tokens": sum(s["generate"]["output_tokens"] for s in shards),
            }
            summary["offline"] = {"generate": _rate(merged), "init_s": [s["init_s"] for s in shards]}
            summary["offline"]["shard_elapsed_s"] = [s["generate"]["elapsed_s"] for s in shards]
            rounds = zip(*(s["generate"]["rounds"] for s in shards), strict=True)
            summary["offline"]["generate"]["rounds_req_per_s"] = [
                sum(r["requests"] for r in pair) / max(r["elapsed_s"] for r in pair) for pair in rounds
            ]
            # The shards ran together: as one process, round i against the adapter's round i.
            merged_rounds = summary["offline"]["generate"]["rounds_req_per_s"]
            summary["offline"]["generate"]["process_rounds_req_per_s"] = [merged_rounds]
        offline = None
    else:
        offline = shards[0] if shards else None
    for mode, runs in outcomes.items():
        if mode == "offline" and summary.get("offline"):
            continue
        run = runs[0] if runs else None
        if run is None:
            summary[mode] = None
            continue
        entry: dict[str, Any] = {"init_s": run["init_s"], "vllm": run.get("vllm")}
        entry["generate"] = _rate(run["generate"])
        per_process = [
            [r["requests"] / r["elapsed_s"] for r in rounds] if rounds else None
            for rounds in run.get("process_rounds", [run["generate"]["rounds"]])
        ]
        entry["generate"]["process_rounds_req_per_s"] = per_process
        entry["generate"]["rounds_req_per_s"] = [rate for rates in per_process if rates for rate in rates]
        entry["generate"]["rounds_frontend_cpu"] = [
            r["cpu_s"] / r["elapsed_s"] for r in run["generate"]["rounds"] if "cpu_s" in r
        ]
        if "loglikelihood" in run:
            entry["loglikelihood"] = _rate(run["loglikelihood"])
        if offline is not None and mode != "offline":
            entry["greedy_vs_offline"] = _same_greedy(
                offline["generate"]["tokens"], run["generate"]["tokens"], compare
            )
            if "loglikelihood" in run and "loglikelihood" in offline:
                ours, theirs = run["loglikelihood"]["logprobs"], offline["loglikelihood"]["logprobs"]
                diffs = sorted(abs(a - b) for a, b in zip(ours, theirs, strict=False))
                entry["loglikelihood_vs_offline"] = {
                    "compared": len(diffs),
                    "max_abs_diff": diffs[-1] if diffs else None,
                    "median_abs_diff": diffs[len(diffs) // 2] if diffs else None,
                }
        summary[mode] = entry
    base = summary.get("offline")
    for mode, entry in summary.items():
        if entry and base and mode != "offline":
            for part in ("generate", "loglikelihood"):
                if part in entry and part in base:
                    entry[part]["ratio_to_offline"] = entry[part]["req_per_s"] / base[part]["req_per_s"]
            ratios = _paired_ratios(
                entry["generate"].get("process_rounds_req_per_s", []),
                base["generate"].get("process_rounds_req_per_s", []),
            )
            if ratios:
                entry["generate"]["ratio_to_offline"] = statistics.median(ratios)
            if len(ratios) > 1:
                entry["generate"]["round_ratios"] = ratios
    return summary


def markdown(results: dict[str, Any]) -> str:
    lines = [
        "| suite | mode | work | req/s | out tok/s | total tok/s | x offline | output tokens | start s |"
    ]
    lines.append("|---|---|---|---|---|---|---|---|---|")
    notes = []
    for suite, summary in results["suites"].items():
        for mode, entry in summary.items():
            if not entry:
                lines.append(f"| {suite} | {mode} | - | failed or skipped | | | | | |")
                continue
            for part in ("generate", "loglikelihood"):
                if part not in entry:
                    continue
                r = entry[part]
                ratio = (
                    f"{r['ratio_to_offline']:.2f}"
                    if "ratio_to_offline" in r
                    else "1.00"
                    if mode == "offline"
                    else ""
                )
                init = entry["init_s"]
                init_text = "/".join(f"{x:.0f}" for x in init) if isinstance(init, list) else f"{init:.0f}"
                lines.append(
                    f"| {suite} | {mode} | {part} | {r['req_per_s']:.1f} | {r.get('out_tok_per_s', 0):.0f} | "
                    f"{r.get('total_tok_per_s', 0):.0f} | {ratio} | {r.get('output_tokens', '')} | "
                    f"{init_text} |"
                )
            spread = entry.get("generate", {}).get("rounds_req_per_s", [])
            if len(spread) > 1:
                notes.append(
                    f"- {suite}/{mode}: generate rounds (req/s): {', '.join(f'{x:.1f}' for x in spread)}"
                )
            cpu = entry.get("generate", {}).get("rounds_frontend_cpu", [])
            if cpu:
                shares = ", ".join(f"{x:.2f}" for x in cpu)
                notes.append(f"- {suite}/{mode}: frontend CPU seconds per second, each round: {shares}")
            if len(entry.get("generate", {}).get("round_ratios", [])) > 1:
                ratios = entry["generate"]["round_ratios"]
                shares = ", ".join(f"{x:.2f}" for x in ratios)
                notes.append(f"- {suite}/{mode}: ratios to offline, round by round: {shares}")
            for part in ("generate", "loglikelihood"):
                seen = entry.get(part, {}).get("monitor")
                if seen:
                    notes.append(f"- {suite}/{mode}: {part}: {_monitor_text(seen)}")
            if "greedy_vs_offline" in entry:
                g = entry["greedy_vs_offline"]
                notes.append(
                    f"- {suite}/{mode}: greedy outputs identical to offline for "
                    f"{g['identical']}/{g['compared']} prompts ({g['identical_tokens']}/{g['tokens']} tokens "
                    "at equal positions; median first "
                    f"divergence at token {g['median_first_divergence']})"
                )
            if "loglikelihood_vs_offline" in entry:
                s = entry["loglikelihood_vs_offline"]
                notes.append(
                    f"- {suite}/{mode}: loglikelihoods vs offline over {s['compared']} pairs: max |diff| "
                    f"{s['max_abs_diff']:.2e}, median {s['median_abs_diff']:.2e}"
                )
    return "\n".join([*lines, "", *notes]) + "\n"


def _monitor_text(seen: dict[str, Any]) -> str:
    """One phase's GPU and host means, as a note of the report."""
    parts = []
    if "gpu_util" in seen:
        parts.append(
            f"GPU busy {seen['gpu_util']:.0%} (lowest sample {seen['gpu_util_min']:.0%}), "
            f"SM {seen['sm_clock_mhz']:.0f} MHz, {seen['power_w']:.0f} W"
        )
    if "host_busy" in seen:
        parts.append(f"host CPUs busy {seen['host_busy']:.0%}, stolen {seen['host_steal']:.1%}")
    counts = f"{seen.get('gpu_samples', 0)} GPU / {seen.get('host_samples', 0)} host samples"
    return "; ".join([*parts, counts])
