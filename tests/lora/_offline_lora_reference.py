"""Greedy token ids from vLLM's offline ``LLM.generate`` with ``lora_request=``: a subprocess, so two engines
never share a process (and its start overlaps the tested engine's).

Usage: python _offline_lora_reference.py MODEL_DIR OPTIONS_JSON REQUEST_JSON OUT_JSON

REQUEST_JSON: ``{"prompts": [[ids]], "max_tokens": n, "adapters": {name: [lora_int_id, path]}}``. OUT_JSON:
``{"": [ids per prompt] (the base), name: [ids per prompt], ...}``. Each adapter is generated in a batch of
its own (and the base in one without any), the way a user sweeps adapters with the offline class.
"""

import json
import sys
import warnings


def main() -> None:
    model, options, request_path, out = sys.argv[1:5]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from vllm import LLM, SamplingParams, TokensPrompt
        from vllm.lora.request import LoRARequest

    llm = LLM(model=model, **json.loads(options))
    with open(request_path) as f:
        request = json.load(f)
    params = SamplingParams(temperature=0.0, max_tokens=request["max_tokens"])
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in request["prompts"]]
    result = {}
    for name, lora in [("", None), *request["adapters"].items()]:
        lora_request = LoRARequest(name, lora[0], lora[1]) if lora is not None else None
        outputs = llm.generate(prompts, params, lora_request=lora_request, use_tqdm=False)
        result[name] = [list(o.outputs[0].token_ids) for o in outputs]
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
