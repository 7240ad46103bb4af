"""Per-sample generations of lm-eval's own ``vllm-vlm`` model with --apply_chat_template: run as a subprocess.

Usage: python _lm_eval_vlm_reference.py MODEL_DIR OPTIONS_JSON SAMPLES_JSON OUT_JSON
Each sample: {"history": [messages with <image> placeholders], "images": [PNG paths], "gen_kwargs": {...}}.
"""

import json
import sys
import tempfile
import warnings
from pathlib import Path

from asyncbackends.testing._vllm_metadata import vllm_metadata_shim


def main() -> None:
    model, options, samples_path, out = sys.argv[1:5]
    vllm_metadata_shim(Path(tempfile.mkdtemp(prefix="vllm-shim-")))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from lm_eval.api.instance import Instance
        from lm_eval.models.vllm_vlms import VLLM_VLM
        from PIL import Image

    lm = VLLM_VLM(pretrained=model, **json.loads(options))
    with open(samples_path) as f:
        samples = json.load(f)
    instances = []
    for index, sample in enumerate(samples):
        context = lm.apply_chat_template(sample["history"], add_generation_prompt=True)
        images = [Image.open(path).convert("RGB") for path in sample["images"]]
        arguments = (context, sample["gen_kwargs"], {"visual": images})
        instances.append(Instance("generate_until", doc={}, arguments=arguments, idx=index))
    with open(out, "w") as f:
        json.dump(lm.generate_until(instances, disable_tqdm=True), f)


if __name__ == "__main__":
    main()
