#!/usr/bin/env python3
"""Pretrain a byte-level transformer with riftco (every PretrainingConfig field
is a flag; see --help). Example:

    python examples/pretrain.py --data my.txt --layers 2 --steps 200 \\
        --activation-checkpointing block --attention flash --output-dir runs/py
"""
import sys

import riftco
from config_flags import config_from, parser_for, run_stage


def main(argv=None):
    parser = parser_for(riftco.PretrainingConfig, __doc__.splitlines()[0])
    config = config_from(riftco.PretrainingConfig, parser.parse_args(argv))
    print(config)
    result, failed = run_stage(riftco.pretrain, config)
    if failed is not None:
        return failed
    return 0


if __name__ == "__main__":
    sys.exit(main())
