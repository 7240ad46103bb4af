"""Greedy token ids from vLLM's offline ``LLM.chat`` (messages, tools, structured output): run as a subprocess.

Usage: python _offline_chat_reference.py MODEL_DIR OPTIONS_JSON CASES_JSON OUT_JSON
Each case: {"messages": [...], "tools": [...] | null, "max_tokens": int, "json": schema | null,
"regex": str | null}; the output is one {"prompt": ids, "tokens": ids, "text": str} per case.
"""

import json
import sys
import warnings


def main() -> None:
    model, options, cases_path, out = sys.argv[1:5]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from vllm import LLM, SamplingParams
        from vllm.config import StructuredOutputsConfig
        from vllm.sampling_params import StructuredOutputsParams

    compact = StructuredOutputsConfig(backend="xgrammar", disable_any_whitespace=True)
    llm = LLM(model=model, structured_outputs_config=compact, **json.loads(options))
    with open(cases_path) as f:
        cases = json.load(f)
    results = []
    for case in cases:
        structured = None
        if case.get("json") is not None or case.get("regex") is not None:
            structured = StructuredOutputsParams(json=case.get("json"), regex=case.get("regex"))
        params = SamplingParams(temperature=0.0, max_tokens=case["max_tokens"], structured_outputs=structured)
        (output,) = llm.chat(case["messages"], params, tools=case.get("tools"), use_tqdm=False)
        results.append(
            {
                "prompt": list(output.prompt_token_ids),
                "tokens": list(output.outputs[0].token_ids),
                "text": output.outputs[0].text,
            }
        )
    with open(out, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
