#!/usr/bin/env python3
"""Post-train (LoRA or full fine-tuning) a riftco model on prompt/response
JSON Lines (every PostTrainingConfig field is a flag; see --help). Example:

    python examples/post_train.py --base-model runs/py/model.safetensors \\
        --data data/chat_example.jsonl --lora-rank 8 --activation-checkpointing block \\
        --output-dir runs/py-lora
"""
import sys

import riftco
from config_flags import config_from, parser_for, run_stage


def main(argv=None):
    parser = parser_for(riftco.PostTrainingConfig, __doc__.splitlines()[0])
    parser.add_argument("--prompt", default="What is 2 + 3?", help="prompt to sample after training")
    args = parser.parse_args(argv)
    config = config_from(riftco.PostTrainingConfig, args)
    print(config)
    result, failed = run_stage(riftco.post_train, config)
    if failed is not None:
        return failed
    if result.completed:
        model = riftco.load_model(config.base_model)
        if config.fine_tuning_method == "lora":
            model.load_adapter(result.weights)
        else:
            model = riftco.load_model(result.weights)
        print(f"sample: {args.prompt!r} → {model.generate(args.prompt, max_new_tokens=40, temperature=0).text!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
