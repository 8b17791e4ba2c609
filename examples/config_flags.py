"""Command-line flags for every field of a riftco stage config, read from the
config classes themselves (so a new C++ field gets a flag with its default):
nested configs are flattened — model.layers → --layers, lora.rank →
--lora-rank. Used by pretrain.py and post_train.py."""
import argparse
import sys

import riftco

CHOICES = {
    "attention": riftco.ATTENTION_KINDS,
    "activation_checkpointing": riftco.ACTIVATION_CHECKPOINTING_KINDS,
    "fine_tuning_method": riftco.FINE_TUNING_METHODS,
}
NESTED = {"model": "", "lora": "lora_"}  # field → prefix of its flattened fields


def flat_fields(config):
    """{flag_name: default} with nested configs flattened."""
    out = {}
    for name, value in config.to_dict().items():
        if name in NESTED:
            for sub, sub_value in value.to_dict().items():
                out[NESTED[name] + sub] = sub_value
        else:
            out[name] = value
    return out


def _true_or_false(text):
    if text not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return text == "true"


def parser_for(cls, description):
    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for name, default in flat_fields(cls()).items():
        flag = "--" + name.replace("_", "-")
        if isinstance(default, bool) and default:  # on by default: --flag true|false, as rt-train takes it
            parser.add_argument(flag, type=_true_or_false, default=True, metavar="true|false", help=name)
        elif isinstance(default, bool):
            parser.add_argument(flag, action="store_true", help=f"{name} (default off)")
        elif name in CHOICES:
            parser.add_argument(flag, choices=CHOICES[name], default=default)
        elif isinstance(default, list):  # lora targets
            parser.add_argument(flag, default=",".join(default), help="comma list, or attention / mlp / all")
        elif isinstance(default, (int, float)):
            parser.add_argument(flag, type=type(default), default=default)
        else:  # paths (None: the stage's default)
            parser.add_argument(flag, default=None if default is None else str(default))
    return parser


def config_from(cls, args):
    """The config the parsed flags describe."""
    config = cls()
    values = vars(args)
    for name, value in config.to_dict().items():
        if name in NESTED:
            nested = value
            for sub in nested.to_dict():
                setattr(nested, sub, values[NESTED[name] + sub])
            setattr(config, name, nested)
        else:
            setattr(config, name, values[name])
    return config


class Progress:
    """A tqdm bar when tqdm is installed, else a plain line every few steps."""

    def __init__(self, total):
        try:
            from tqdm import tqdm
        except ImportError:
            tqdm = None
        self.bar = tqdm(total=total, unit="step") if tqdm else None
        self.every = max(1, total // 20)

    def __call__(self, report):
        if self.bar is not None:
            self.bar.update(report.step - self.bar.n)
            info = {"loss": f"{report.loss:.4f}", "tok/s": f"{report.tokens_per_second:.0f}"}
            if report.validation_loss is not None:
                info["val"] = f"{report.validation_loss:.4f}"
            self.bar.set_postfix(info)
        elif report.step % self.every == 0 or report.step == report.total_steps or report.step == 1:
            val = "" if report.validation_loss is None else f"  validation {report.validation_loss:.4f}"
            print(f"step {report.step}/{report.total_steps}  loss {report.loss:.4f}{val}  "
                  f"lr {report.learning_rate:.2e}  {report.tokens_per_second:.0f} tok/s  "
                  f"eta {report.eta_seconds:.0f} s", flush=True)
        return True

    def close(self):
        if self.bar is not None:
            self.bar.close()


def report_files(result):
    if not result.completed:
        print(f"stopped after step {result.steps}; resume with --resume (files in {result.output_dir})")
        return
    print(f"done: {result.steps} steps, final train loss {result.final_train_loss:.4f}, "
          f"validation loss {result.final_validation_loss:.4f}, {result.tokens_per_second:.0f} tok/s")
    print("files:")
    for role, path in result.files.items():
        print(f"  {role:20s} {path}")


def run_stage(stage, config):
    """Runs `stage` (riftco.pretrain or riftco.post_train) with a progress bar.
    Returns (result, None) on success, (None, exit code) on Ctrl-C or an error."""
    progress = Progress(config.steps)
    try:
        result = stage(config, progress)
    except KeyboardInterrupt:
        progress.close()
        print(f"\ninterrupted: resume with --resume --output-dir {config.output_dir}")
        return None, 130
    except riftco.Error as e:
        progress.close()
        print(f"error: {e}", file=sys.stderr)
        return None, 1
    progress.close()
    report_files(result)
    return result, None
