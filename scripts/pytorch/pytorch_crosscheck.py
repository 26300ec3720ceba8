#!/usr/bin/env python3
"""pytorch_crosscheck.py: shows that scripts/pytorch/pytorch_gpt2.py computes what our framework computes, so its
tokens/s is a comparison of the same work. Trains chapter 01 on one rank for a few steps on a text
file, saving a checkpoint after every step (docs/checkpoint.md); loads the checkpoint written after
step 0 (parameters and AdamW moments) into the PyTorch model, replays the remaining steps on the same
batches (the data order of the README) with the PyTorch script's own optimizer and step code, and
compares every step's loss and gradient norm, and the final parameters, with ours.
fp32 on the CPU; both sides then differ only by the order of fp32 sums (expect about 1e-7).

  make 01_vanilla_dp && python3 scripts/pytorch/pytorch_crosscheck.py --preset tiny --steps 6
Exits 1 if a relative difference exceeds --tolerance (1e-5, the tests' bound between rank counts).
"""
import argparse
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pytorch_gpt2 as ref  # noqa: E402  the model, optimizer and step under test

torch = ref.torch
if torch is None:
    print(f"pytorch_crosscheck.py: PyTorch is not installed for {sys.executable}: run 'pip install torch'",
          file=sys.stderr)
    sys.exit(2)


def read_checkpoint(path):
    """docs/checkpoint.md: header, tensor table, then parameters, AdamW m and v in table order."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"GPT2CKPT":
        sys.exit(f"{path}: not a checkpoint")
    (version,) = struct.unpack_from("<I", data, 8)
    at = 8 + 4 + 5 * 4  # magic, version, L C NH T V
    step, batch, _, _ = struct.unpack_from("<4Q", data, at)
    at += 32
    at += (7 * 8 if version >= 2 else 0) + (2 * 4 + 3 * 8 if version >= 3 else 0)  # settings, mixture of experts
    (count,) = struct.unpack_from("<I", data, at)
    at += 4
    table = []
    for _ in range(count):
        (length,) = struct.unpack_from("<I", data, at)
        name = data[at + 4:at + 4 + length].decode()
        at += 4 + length
        (ndim,) = struct.unpack_from("<I", data, at)
        shape = struct.unpack_from(f"<{ndim}Q", data, at + 4)
        at += 4 + 8 * ndim
        table.append((name, shape))
    parts = {}
    for part in ("param", "m", "v"):
        for name, shape in table:
            n = math.prod(shape)
            values = torch.frombuffer(bytearray(data[at:at + 4 * n]), dtype=torch.float32)
            parts[part, name] = values.view(*shape)
            at += 4 * n
    return step, batch, table, parts


def torch_name(name):
    """Our parameter names (common/model/param_layout.cpp) to the PyTorch module's."""
    if not name.startswith("h"):
        return name  # wte, wpe, lnf.weight, lnf.bias
    layer, rest = name[1:].split(".", 1)
    rest = {"attn.qkv.weight": "qkv.weight", "attn.qkv.bias": "qkv.bias", "attn.proj.weight": "attn_proj.weight",
            "attn.proj.bias": "attn_proj.bias", "mlp.fc.weight": "fc.weight", "mlp.fc.bias": "fc.bias",
            "mlp.proj.weight": "mlp_proj.weight", "mlp.proj.bias": "mlp_proj.bias"}.get(rest, rest)
    return f"blocks.{layer}.{rest}"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="tiny", choices=sorted(ref.PRESETS))
    p.add_argument("--steps", type=int, default=6, help="steps of ours; PyTorch replays steps 1..")
    p.add_argument("--data", default="README.md", help="text file both sides train on")
    p.add_argument("--attention", default="sdpa", choices=["sdpa", "manual"])
    p.add_argument("--tolerance", type=float, default=1e-5)
    args = p.parse_args()
    if args.steps < 2:
        p.error("--steps must be >= 2")
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    cfg = ref.PRESETS[args.preset]
    T, B = cfg["T"], cfg["batch"]
    work = tempfile.mkdtemp(prefix="pytorch_crosscheck.")
    ours_json = os.path.join(work, "ours.jsonl")
    command = ["mpiexec", "-n", "1", "./01_vanilla_dp/train", "--preset", args.preset, "--steps", str(args.steps),
               "--data", args.data, "--save", os.path.join(work, "ckpt_{step}.bin"), "--save-every", "1",
               "--json", ours_json, "--quiet", "--device", "cpu"]  # the replay below runs on the CPU
    print("ours:", " ".join(command))
    if subprocess.run(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL).returncode != 0:
        sys.exit("our run failed (is 01_vanilla_dp built? make 01_vanilla_dp)")
    with open(ours_json) as f:
        records = [json.loads(line) for line in f]
    ours = {r["step"]: r for r in records if r["type"] == "step"}
    run = next(r for r in records if r["type"] == "run")

    start, batch, table, saved = read_checkpoint(os.path.join(work, "ckpt_1.bin"))
    assert batch == B
    torch.set_num_threads(1)
    model = ref.GPT2(cfg, args.attention)
    params = dict(model.named_parameters())
    if sorted(params) != sorted(torch_name(n) for n, _ in table):
        sys.exit("the PyTorch model's parameters differ from the checkpoint's table")
    optimizer = ref.make_adamw(model, run["lr"], 0.1, foreach=False)  # 0.1: our --weight-decay default
    with torch.no_grad():
        for name, _ in table:
            w = params[torch_name(name)]
            w.copy_(saved["param", name])
            optimizer.state[w] = {"step": torch.tensor(float(start)), "exp_avg": saved["m", name].clone(),
                                  "exp_avg_sq": saved["v", name].clone()}

    with open(args.data, "rb") as f:
        text = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).long()
    offsets = len(text) - T - 1
    worst = 0.0
    print(f"{'step':>4} {'loss ours':>11} {'loss torch':>11} {'rel diff':>9} {'norm ours':>10} {'norm torch':>10} "
          f"{'rel diff':>9}")
    for step in range(start, args.steps):
        # The README's data order: sample i of step s reads T+1 bytes at ((s*B + i)*T) mod (len - T - 1).
        windows = torch.stack([text[(step * B + i) * T % offsets:][:T + 1] for i in range(B)])
        ref.set_lr(optimizer, ref.learning_rate(step, args.steps, -1, run["lr"]))
        loss, norm = ref.train_step(model, optimizer, windows[:, :-1], windows[:, 1:], 1.0, bf16=False)
        o = ours[step]
        d_loss = abs(loss.item() - o["loss"]) / abs(o["loss"])
        d_norm = abs(norm.item() - o["grad_norm"]) / abs(o["grad_norm"])
        worst = max(worst, d_loss, d_norm)
        print(f"{step:4d} {o['loss']:11.6f} {loss.item():11.6f} {d_loss:9.1e} {o['grad_norm']:10.6f} "
              f"{norm.item():10.6f} {d_norm:9.1e}")
    _, _, _, final = read_checkpoint(os.path.join(work, f"ckpt_{args.steps}.bin"))
    diff = sum(float(((params[torch_name(n)].detach() - final["param", n]) ** 2).sum()) for n, _ in table)
    norm = sum(float((final["param", n] ** 2).sum()) for n, _ in table)
    d_params = math.sqrt(diff / norm)
    worst = max(worst, d_params)
    print(f"final parameters after step {args.steps - 1}: relative L2 difference {d_params:.1e}")
    for name in os.listdir(work):
        os.remove(os.path.join(work, name))
    os.rmdir(work)
    ok = worst <= args.tolerance
    print(f"PyTorch and ours {'agree' if ok else 'DISAGREE'}: largest relative difference {worst:.1e} "
          f"(tolerance {args.tolerance:g})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
