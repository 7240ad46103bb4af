"""vLLM's offline ``LLM.chat``, greedy, as a subprocess (two engines never share a process).

Usage: python _inspect_chat_reference.py MODEL_DIR OPTIONS_JSON CONVERSATIONS_JSON MAX_TOKENS OUT_JSON [LORA_DIR]
Writes one ``{"text", "prompt_tokens", "output_tokens"}`` per conversation. With ``LORA_DIR`` every
conversation is sent with that LoRA adapter (``lora_request=``; OPTIONS_JSON then enables LoRA).
"""

import json
import sys
import warnings


def main() -> None:
    model, options, conversations, max_tokens, out = sys.argv[1:6]
    lora = sys.argv[6] if len(sys.argv) > 6 else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from vllm import LLM, SamplingParams
        from vllm.lora.request import LoRARequest

    llm = LLM(model=model, **json.loads(options))
    with open(conversations) as f:
        messages = json.load(f)
    params = SamplingParams(temperature=0.0, max_tokens=int(max_tokens))
    lora_request = LoRARequest("adapter", 1, lora) if lora else None
    outputs = llm.chat(messages, params, use_tqdm=False, lora_request=lora_request)
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
