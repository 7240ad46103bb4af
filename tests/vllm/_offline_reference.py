"""Greedy token ids from vLLM's offline ``LLM.generate``: run as a subprocess so two engines never share a process.

Usage: python _offline_reference.py MODEL_DIR OPTIONS_JSON PROMPTS_JSON OUT_JSON
"""

import json
import sys
import warnings


def main() -> None:
    model, options, prompts, out = sys.argv[1:5]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from vllm import LLM, SamplingParams, TokensPrompt

    llm = LLM(model=model, **json.loads(options))
    with open(prompts) as f:
        request = json.load(f)
    params = SamplingParams(temperature=0.0, max_tokens=request["max_tokens"])
    outputs = llm.generate(
        [TokensPrompt(prompt_token_ids=ids) for ids in request["prompts"]], params, use_tqdm=False
    )
    with open(out, "w") as f:
        json.dump([list(o.outputs[0].token_ids) for o in outputs], f)
    # The optional sampling parameters (tests/vllm/test_sampling_vllm.py): one batch per case.
    sampled = []
    for case in request.get("sampling_cases", []):
        params = SamplingParams(max_tokens=request["sampling_max_tokens"], **case)
        outputs = llm.generate(
            [TokensPrompt(prompt_token_ids=ids) for ids in request["prompts"]], params, use_tqdm=False
        )
        sampled.append([list(o.outputs[0].token_ids) for o in outputs])
    with open(out + ".sampling.json", "w") as f:
        json.dump(sampled, f)


if __name__ == "__main__":
    main()
