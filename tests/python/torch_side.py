"""PyTorch side of test_python_parity.py: loads a riftco model-state file
into bench/torch_reference.py's model (float64), runs tokens/targets from an
.npz, and writes logits, loss and every gradient to another .npz.
    usage: torch_side.py MODEL.safetensors ARRAYS.npz OUT.npz"""
import json
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]


def main(argv):
    import torch

    sys.path.insert(0, str(ROOT / "bench"))
    from torch_reference import Transformer, read_safetensors

    model_path, arrays_path, out_path = argv
    params, meta = read_safetensors(pathlib.Path(model_path))
    arrays = np.load(arrays_path)
    dims = json.loads(meta["dimensions"])
    model = Transformer(norm_epsilon=float(arrays["norm_epsilon"]), **dims).double()
    model.load_riftco({k: v.astype(np.float64) for k, v in params.items()})
    tokens = torch.tensor(arrays["tokens"], dtype=torch.long)
    targets = torch.tensor(arrays["targets"], dtype=torch.long)
    logits = model(tokens)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                             ignore_index=-100)
    loss.backward()
    out = {"logits": logits.detach().numpy(), "loss": np.array(loss.item())}
    for name, p in model.riftco_named_parameters():
        out["grad." + name] = p.grad.numpy()
    np.savez(out_path, **out)


if __name__ == "__main__":
    main(sys.argv[1:])
