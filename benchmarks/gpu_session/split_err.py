"""How far bf16 activations alone move the tiny models' logits on one GPU (the int8 model in bf16 vs the
same int8 model in fp32), next to the split's distance from the one-GPU bf16 model: the scale for the
one-GPU split test's tolerance."""
import sys

import torch

sys.path.insert(0, "tests")
from models import tiny_model
from test_parallel import ARCHS, _models_match, _run_ranks

from experts_int8 import quantize_


def logits(arch, dtype):
    model = tiny_model(arch, seed=0).to(dtype)  # fp32 weights rounded: bf16 init draws other values
    quantize_(model)
    model.to("cuda")
    tokens = torch.randint(3, 96, (2, 11), generator=torch.Generator().manual_seed(1)).cuda()
    with torch.no_grad():
        return model(tokens).logits.float()


if __name__ == "__main__":
    import pathlib
    import tempfile
    split = _run_ranks(_models_match, 2, pathlib.Path(tempfile.mkdtemp()), "gloo", "one_gpu")[0]
    for arch in ARCHS:
        ref, bf = logits(arch, torch.float32), logits(arch, torch.bfloat16)
        print(f"{arch:12s} bf16-vs-fp32 {((bf - ref).norm() / ref.norm()).item():.4f}  "
              f"split tp {split[arch + '/tp']['err']:.4f}  ep {split[arch + '/ep']['err']:.4f}")


def fp32_split(rank, device, out_dir):
    """The tp split in fp32 activations: rounding of the partial sums out of the picture."""
    from experts_int8.parallel import parallelize_experts
    errs = {}
    for arch in ARCHS:
        model = tiny_model(arch, seed=0)
        quantize_(model)
        model.to(device)
        tokens = torch.randint(3, 96, (2, 11), generator=torch.Generator().manual_seed(1)).to(device)
        with torch.no_grad():
            want = model(tokens).logits.float()
            parallelize_experts(model, "tp")
            errs[arch] = ((model(tokens).logits.float() - want).norm() / want.norm()).item()
    return errs


if __name__ == "__main__":
    print("fp32 tp split vs one GPU:", _run_ranks(fp32_split, 2, pathlib.Path(tempfile.mkdtemp()), "gloo", "one_gpu")[0])
