#!/usr/bin/env python3
"""Pretrain a byte-level transformer with riftco (every PretrainingConfig field
is a flag; see --help). Example:

    python examples/pretrain.py --data my.txt --layers 2 --steps 200 \\
        --activation-checkpointing block --attention flash --output-dir runs/py
"""
import sys

import riftco
from config_flags import Progress, config_from, parser_for, report_files


def main(argv=None):
    parser = parser_for(riftco.PretrainingConfig, __doc__.splitlines()[0])
    config = config_from(riftco.PretrainingConfig, parser.parse_args(argv))
    print(config)
    progress = Progress(config.steps)
    try:
        result = riftco.pretrain(config, progress)
    except KeyboardInterrupt:
        progress.close()
        print(f"\ninterrupted: resume with --resume --output-dir {config.output_dir}")
        return 130
    except riftco.Error as e:
        progress.close()
        print(f"error: {e}", file=sys.stderr)
        return 1
    progress.close()
    report_files(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
