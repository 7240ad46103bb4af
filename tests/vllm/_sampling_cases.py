"""Sampling cases the offline reference (`_offline_reference.py`) also runs, for `test_sampling_vllm.py`.

Each case is keyword arguments common to vLLM's ``SamplingParams`` and ours: the adapter must give the same
tokens as ``LLM.generate`` for the same prompt. ``min_tokens == max_tokens`` stops EOS from ending a
completion early, which the tiny model's greedy outputs otherwise do.
"""

SAMPLING_MAX_TOKENS = 12
SAMPLING_CASES: list[dict[str, object]] = [
    {"temperature": 0.0, "repetition_penalty": 1.5, "presence_penalty": 0.8, "frequency_penalty": 0.6},
    {"temperature": 1.0, "seed": 7, "min_p": 0.2},
    {"temperature": 0.0, "min_tokens": SAMPLING_MAX_TOKENS},
    {
        "temperature": 0.9,
        "seed": 5,
        "min_p": 0.05,
        "repetition_penalty": 1.2,
        "frequency_penalty": -0.5,
        "min_tokens": 6,
    },
]
