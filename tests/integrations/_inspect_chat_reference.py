"""vLLM's offline ``LLM.chat``, greedy, as a subprocess (two engines never share a process).

Usage: python _inspect_chat_reference.py MODEL_DIR OPTIONS_JSON CONVERSATIONS_JSON MAX_TOKENS OUT_JSON
Writes one ``{"text", "prompt_tokens", "output_tokens"}`` per conversation.
"""

import json
import sys
import warnings


def main() -> None:
    model, options, conversations, max_tokens, out = sys.argv[1:6]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from vllm import LLM, SamplingParams

    llm = LLM(model=model, **json.loads(options))
    with open(conversations) as f:
        messages = json.load(f)
    params = SamplingParams(temperature=0.0, max_tokens=int(max_tokens))
    outputs = llm.chat(messages, params, use_tqdm=False)
    rows = [
        {
            "text": o.outputs[0].text,
            "prompt_tokens": len(o.prompt_token_ids),
            "output_tokens": len(o.outputs[0].token_ids),
        }
        for o in outputs
    ]
    with open(out, "w") as f:
        json.dump(rows, f)


if __name__ == "__main__":
    main()
