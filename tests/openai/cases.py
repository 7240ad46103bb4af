"""The requests both engines answer: the in-process reference (reference.py) and the served model."""

from __future__ import annotations

import asyncbackends as ab

GREEDY = [
    ab.GenerationRequest("The quick brown fox", ab.SamplingParams(max_tokens=12)),
    ab.GenerationRequest("Paris is the capital of", ab.SamplingParams(max_tokens=8, logprobs=True)),
    ab.GenerationRequest([0, 74, 75, 322], ab.SamplingParams(max_tokens=6)),
    ab.GenerationRequest([{"role": "user", "content": "hello there"}], ab.SamplingParams(max_tokens=6)),
    ab.GenerationRequest("Numbers: 0 1 2", ab.SamplingParams(max_tokens=10, stop=("5",))),
]

SCORED = [
    ab.LoglikelihoodRequest("Paris is the capital of", " France"),
    ab.LoglikelihoodRequest("The quick brown fox jumps over the ", "lazy dog."),
    ab.LoglikelihoodRequest("", "hello there"),
    ab.LoglikelihoodRequest("Question: What is two plus two? Answer:", " four"),
    ab.LoglikelihoodRequest("abc", "d"),
]

ROLLING = [ab.RollingLoglikelihoodRequest("Once upon a time there was a small model that lived on a CPU.")]

ENGINE_OPTIONS = {
    "dtype": "float32",
    "enforce_eager": True,
    "gpu_memory_utilization": 0.1,
    "max_model_len": 512,
}
