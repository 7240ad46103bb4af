"""MMLU-shaped 5-shot prompts for the prefix-cache tests: one few-shot context every question shares.

Long enough (about 200 tokens of the tiny model's tokenizer) that the shared context fills whole KV-cache
blocks, so most of each prompt is read from the prefix cache once the first question has been answered.
"""

from __future__ import annotations

import asyncbackends as ab

SHOTS = "".join(
    f"Question: which of these is item {k} of the list {k * 7} {k * 11} {k * 13}?\n"
    f"A. one\nB. two\nC. three\nD. four\nAnswer: {'ABCD'[k % 4]}\n\n"
    for k in range(5)
)


def five_shot(questions: range, max_tokens: int = 1) -> list[ab.GenerationRequest]:
    """One text request per question: the shared shots, then the question and its four choices."""
    return [
        ab.GenerationRequest(
            f"{SHOTS}Question: what is {q} plus {q * 3}?\nA. {q}\nB. {q + 1}\nC. {q + 2}\nD. {q + 3}\nAnswer:",
            ab.SamplingParams(max_tokens=max_tokens),
        )
        for q in questions
    ]
