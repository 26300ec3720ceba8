#!/usr/bin/env python3
"""pytorch_gpt2.py: the PyTorch eager reference. Trains the same GPT-2 as our chapters (same presets,
same math, same AdamW and learning-rate schedule) on random tokens, and prints our step line and
tokens/s, so that our framework's speed can be compared with PyTorch's for the same model shape, batch
and dtype. Speed only: the data are random tokens, so the loss stays near ln V (uniform prediction).

What it measures. One step = forward, backward, gradient-norm clipping, AdamW, zeroing the gradients:
what one of our steps does on one rank. Step 0 is warm-up and is left out of the averages. On CUDA the
step is timed between two torch.cuda.synchronize() calls. tokens/s is averaged over the measured steps'
per-step rates, as our summary does.

Mixed precision (--dtype bf16) is the standard eager recipe: torch.autocast(bfloat16) around the
forward, fp32 master parameters and gradients, fp32 AdamW state. --dtype fp32 leaves PyTorch's default
of plain fp32 matrix products (no TF32), as our CUDA backend does.

  python3 scripts/pytorch/pytorch_gpt2.py --preset tiny --steps 20 --device cpu --threads 1
  python3 scripts/pytorch/pytorch_gpt2.py --preset gpt2 --device cuda --dtype bf16 --json torch.jsonl
  scripts/pytorch/compare_pytorch.sh --preset tiny      # ours and this, in one run, with the ratio
  python3 scripts/pytorch/pytorch_crosscheck.py         # proof of the same math: loads our checkpoint,
                                                # replays our steps, losses agree to about 1e-7

Needs PyTorch (pip install torch); nothing else.
"""
import argparse
import json
import math
import os
import socket
import stat
import sys
import time

# The presets of common/model/model_config.cpp, restated (keep the two in step): L layers, C channels,
# NH heads, T context, V vocabulary, default global batch in sequences, default peak learning rate.
PRESETS = {
    "tiny": dict(L=2, C=64, NH=4, T=64, V=256, batch=8, lr=3e-3),
    "small": dict(L=4, C=128, NH=4, T=128, V=256, batch=8, lr=2e-3),
    "deep": dict(L=12, C=128, NH=4, T=64, V=256, batch=8, lr=1e-3),
    "gpt2": dict(L=12, C=768, NH=12, T=1024, V=50304, batch=8, lr=6e-4),
    "odd": dict(L=2, C=15, NH=3, T=17, V=258, batch=8, lr=3e-3),
}

# Dense bf16 peak FLOP/s from the data sheets (docs/theory.md, section 8), by device name. MFU is printed only against a
# known peak: bf16 on these devices, or any run given --peak-tflops.
BF16_PEAKS = [("H200", 989e12, "H200 dense bf16"), ("H100 80GB HBM3", 989e12, "H100 SXM dense bf16")]

LAYERNORM_EPS = 1e-5  # common/ops/ops_cpu.cpp
BETAS, ADAM_EPS = (0.9, 0.95), 1e-8  # common/training/optimizer.cpp


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tiny", choices=sorted(PRESETS), help="model shape (common/model/model_config.cpp)")
    p.add_argument("--batch", type=int, default=0, help="global batch in sequences; 0 = the preset's")
    p.add_argument("--steps", type=int, default=20, help="steps to run; step 0 is warm-up, left out of averages")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="auto = cuda if available")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"],
                   help="bf16 = autocast(bfloat16), fp32 master parameters and AdamW state")
    p.add_argument("--attention", default="sdpa", choices=["sdpa", "manual"],
                   help="sdpa = F.scaled_dot_product_attention (what eager code writes today: a fused kernel "
                        "where PyTorch has one); manual = softmax(QK^T/sqrt(hs)) V written out, the (T,T) "
                        "matrix materialised, as our ops do")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (off: eager is the point)")
    p.add_argument("--threads", type=int, default=0,
                   help="CPU threads (torch.set_num_threads); 0 = PyTorch's default. One rank of ours uses one")
    p.add_argument("--lr", type=float, default=0, help="peak learning rate; 0 = the preset's")
    p.add_argument("--warmup", type=int, default=-1, help="learning-rate warm-up steps; -1 = steps/10")
    p.add_argument("--weight-decay", type=float, default=0.1, help="AdamW weight decay of the matrices")
    p.add_argument("--grad-clip", type=float, default=1.0, help="clip gradients to this global norm")
    p.add_argument("--seed", type=int, default=1337, help="seed of the initialisation and the random tokens")
    p.add_argument("--peak-tflops", type=float, default=0,
                   help="device peak for MFU, in TFLOP/s; 0 = the data sheet's dense bf16 peak where known")
    p.add_argument("--json", default="", metavar="PATH", help="write JSON lines: run, one per step, summary")
    p.add_argument("--quiet", action="store_true", help="no step lines")
    args = p.parse_args()
    if args.steps < 1:
        p.error("--steps must be >= 1")
    if args.batch < 0:
        p.error("--batch must be >= 1 (or 0 for the preset's)")
    return args


try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    if __name__ == "__main__" and not any(a in ("-h", "--help") for a in sys.argv[1:]):
        print(f"pytorch_gpt2.py: PyTorch is not installed for {sys.executable}: run 'pip install torch' "
              "(or in a virtual environment: python3 -m venv /tmp/torchvenv && /tmp/torchvenv/bin/pip install "
              "torch, then run this script with /tmp/torchvenv/bin/python)", file=sys.stderr)
        sys.exit(2)
    torch = None


# ---- the model: GPT-2 exactly as common/model/model*.cpp compute it -------------------------------------

if torch is not None:

    class Block(nn.Module):
        """Pre-LN block: x + attn(ln1(x)), then + mlp(ln2(x)). Names follow common/model/param_layout.cpp."""

        def __init__(self, C, NH, attention):
            super().__init__()
            self.NH, self.attention = NH, attention
            self.ln1 = nn.LayerNorm(C, eps=LAYERNORM_EPS)
            self.qkv = nn.Linear(C, 3 * C)  # weight (3C, C): rows [q; k; v], heads contiguous in each
            self.attn_proj = nn.Linear(C, C)
            self.ln2 = nn.LayerNorm(C, eps=LAYERNORM_EPS)
            self.fc = nn.Linear(C, 4 * C)
            self.mlp_proj = nn.Linear(4 * C, C)

        def attend(self, x):
            B, T, C = x.shape
            q, k, v = self.qkv(x).split(C, dim=2)
            q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v))  # (B,NH,T,hs)
            if self.attention == "sdpa":
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))  # (B,NH,T,T)
                mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
                att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
                y = att @ v
            return self.attn_proj(y.transpose(1, 2).reshape(B, T, C))

        def forward(self, x):
            x = x + self.attend(self.ln1(x))
            return x + self.mlp_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT2(nn.Module):
        """Token + learned position embeddings, L blocks, final LayerNorm, LM head tied to wte."""

        def __init__(self, cfg, attention):
            super().__init__()
            L, C, T, V = cfg["L"], cfg["C"], cfg["T"], cfg["V"]
            self.wte = nn.Parameter(torch.empty(V, C))
            self.wpe = nn.Parameter(torch.empty(T, C))
            self.blocks = nn.ModuleList(Block(C, cfg["NH"], attention) for _ in range(L))
            self.lnf = nn.LayerNorm(C, eps=LAYERNORM_EPS)
            # GPT-2 initialisation (GPT2::init_weights): N(0, 0.02) for matrices and embeddings, the two
            # projections into the residual stream scaled by 1/sqrt(2L), zero biases, unit LN gains.
            # Same distributions as ours, not the same numbers (ours draws from its own generator).
            for name, p in self.named_parameters():
                if p.dim() == 2:
                    scaled = name.endswith("attn_proj.weight") or name.endswith("mlp_proj.weight")
                    nn.init.normal_(p, mean=0.0, std=0.02 / (math.sqrt(2 * L) if scaled else 1.0))
                elif name.endswith(("ln1.weight", "ln2.weight", "lnf.weight")):
                    nn.init.ones_(p)
                else:
                    nn.init.zeros_(p)

        def forward(self, idx, targets):
            T = idx.size(1)
            x = F.embedding(idx, self.wte) + self.wpe[:T]  # what nn.Embedding calls
            for block in self.blocks:
                x = block(x)
            logits = self.lnf(x) @ self.wte.t()  # tied LM head, no bias: (B,T,V)
            # Mean cross-entropy over B x T, in fp32 (under autocast the logits are bf16).
            return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


def make_adamw(model, lr, weight_decay, foreach):
    """AdamW as common/training/optimizer.cpp: betas 0.9/0.95, eps 1e-8, weight decay on the 2-D tensors only
    (every matrix, wte and wpe included), none on biases and LayerNorm gains. foreach=True on CUDA and
    False on the CPU is PyTorch's own default, spelled out: the multi-tensor kernels on CUDA, the
    per-tensor loop on the CPU; not the fused kernel, which eager code gets only when it asks."""
    matrices = [p for p in model.parameters() if p.dim() == 2]
    vectors = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": matrices, "weight_decay": weight_decay},
                              {"params": vectors, "weight_decay": 0.0}],
                             lr=lr, betas=BETAS, eps=ADAM_EPS, foreach=foreach, fused=False)


def set_lr(optimizer, lr):
    for group in optimizer.param_groups:
        group["lr"] = lr


def train_step(model, optimizer, inputs, targets, grad_clip, bf16):
    """One step as ours: forward (under autocast for bf16), backward, clip to the global norm, AdamW,
    gradients zeroed. Returns the loss and the norm before clipping, as tensors (no sync here)."""
    with torch.autocast(device_type=inputs.device.type, dtype=torch.bfloat16, enabled=bf16):
        loss = model(inputs, targets)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss, norm


def learning_rate(step, steps, warmup, max_lr):
    """common/training/optimizer.cpp learning_rate(): linear warm-up, then cosine down to 10% of the peak."""
    warmup = warmup if warmup >= 0 else steps // 10
    min_lr = max_lr * 0.1
    if step < warmup:
        return max_lr * (step + 1) / warmup
    if steps - 1 <= warmup:
        return max_lr
    progress = (step - warmup) / (steps - 1 - warmup)
    return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + math.cos(math.pi * progress))


# ---- output in our formats (common/base/metrics.cpp) ------------------------------------------------------

def format_count(x):
    return f"{x / 1e6:.2f}M" if x >= 1e6 else f"{x / 1e3:.1f}k" if x >= 1e3 else f"{x:.0f}"


def format_bytes(b):
    if b is None:
        return "n/a"
    units, u = ["B", "KB", "MB", "GB", "TB"], 0
    while abs(b) >= 1000 and u < 4:
        b, u = b / 1000, u + 1
    return f"{b:.0f} {units[u]}" if u == 0 else f"{b:.1f} {units[u]}"


def step_line(step, loss, step_ms, tokens_per_s, mem_bytes):
    # One process, no collectives: exposed comm is 0, printed so the columns line up with ours.
    return (f"step {step:4d} | loss {loss:.4f} | {step_ms:.1f} ms | {format_count(tokens_per_s)} tok/s | "
            f"exposed comm 0.0 ms | mem {format_bytes(mem_bytes)}")


class JsonLines:
    """Like our JsonLinesWriter: this process's own PATH.tmp.<host>.<pid> while running, renamed to PATH
    at the end; /dev/null or a FIFO is written to directly (nothing there may be replaced)."""

    def __init__(self, path):
        self.path, self.file, self.temporary = path, None, None
        if path:
            in_place = os.path.exists(path) and not os.path.isfile(path) and (
                stat.S_ISFIFO(os.stat(path).st_mode) or os.path.realpath(path) == os.devnull)
            if not in_place:
                self.temporary = "%s.tmp.%s.%d" % (path, socket.gethostname(), os.getpid())
            self.file = open(self.temporary or path, "w")

    def write(self, record):
        if self.file:
            self.file.write(json.dumps(record, allow_nan=False) + "\n")
            self.file.flush()

    def close(self):
        if self.file:
            self.file.close()
            if self.temporary:
                os.replace(self.temporary, self.path)


def finite(x):
    return x if x is not None and math.isfinite(x) else None  # JSON has no NaN or inf


def device_peak(args, device, dtype):
    """(peak FLOP/s, description) for MFU, or (None, why not)."""
    if args.peak_tflops > 0:
        return args.peak_tflops * 1e12, f"{args.peak_tflops:g} TFLOP/s (--peak-tflops)"
    if device.type != "cuda":
        return None, "MFU only on CUDA"
    if dtype != "bf16":
        return None, "no MFU for fp32: only the dense bf16 peaks are known here (or pass --peak-tflops)"
    name = torch.cuda.get_device_name(device)
    for key, peak, what in BF16_PEAKS:
        if key in name:
            return peak, f"{peak / 1e12:.0f} TFLOP/s ({what}, data sheet)"
    return None, f"no known bf16 peak for '{name}' (pass --peak-tflops)"


def main():
    args = parse_args()
    cfg = PRESETS[args.preset]
    L, C, NH, T, V = cfg["L"], cfg["C"], cfg["NH"], cfg["T"], cfg["V"]
    B = args.batch or cfg["batch"]
    max_lr = args.lr or cfg["lr"]
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            print(f"pytorch_gpt2.py: --device cuda, but this PyTorch ({torch.__version__}) sees no CUDA device",
                  file=sys.stderr)
            sys.exit(1)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    cuda = device.type == "cuda"
    bf16 = args.dtype == "bf16"
    torch.manual_seed(args.seed)

    model = GPT2(cfg, args.attention).to(device)
    num_params = sum(p.numel() for p in model.parameters())
    flops_params = num_params - model.wpe.numel()  # N of docs/theory.md: without position embeddings
    flops_per_token = 6 * flops_params + 12 * L * C * T
    if args.compile:
        model = torch.compile(model)

    foreach = cuda
    optimizer = make_adamw(model, max_lr, args.weight_decay, foreach)

    # Random tokens (speed only), every step's batch made before the clock starts: (steps, B, T+1).
    g = torch.Generator().manual_seed(args.seed)
    tokens = torch.randint(0, V, (args.steps, B, T + 1), generator=g).to(device)

    device_name = torch.cuda.get_device_name(device) if cuda else f"cpu, {torch.get_num_threads()} thread(s)"
    peak, peak_text = device_peak(args, device, args.dtype)
    print(f"pytorch eager | 1 process | preset {args.preset} (L={L} C={C} NH={NH} T={T} V={V}) | "
          f"{num_params} parameters")
    print(f"global batch {B} x {T} tokens | {device_name} | {args.dtype}"
          f"{' (autocast, fp32 master + AdamW state)' if bf16 else ''} | torch {torch.__version__} | "
          f"attention {args.attention} | AdamW {'foreach' if foreach else 'per-tensor loop'}"
          f"{' | torch.compile' if args.compile else ''} | data: random tokens (loss starts at ln V = "
          f"{math.log(V):.4f})", flush=True)
    out = JsonLines(args.json)
    out.write({"type": "run", "chapter": "pytorch_eager", "framework": "pytorch", "torch": torch.__version__,
               "ranks": 1, "preset": args.preset, "L": L, "C": C, "NH": NH, "T": T, "V": V,
               "params": num_params, "flops_per_token": flops_per_token, "batch": B, "steps": args.steps,
               "lr": max_lr, "seed": args.seed, "device": device.type, "device_name": device_name,
               "dtype": args.dtype, "attention": args.attention, "compile": args.compile,
               "adamw": "foreach" if foreach else "for-loop", "threads": torch.get_num_threads(),
               "data": "random tokens"})

    totals = {"steps": 0, "step_ms": 0.0, "tokens_per_s": 0.0}
    peak_mem, loss_value = None, float("nan")
    for step in range(args.steps):
        inputs, targets = tokens[step, :, :-1], tokens[step, :, 1:]
        lr = learning_rate(step, args.steps, args.warmup, max_lr)
        set_lr(optimizer, lr)
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
            torch.cuda.synchronize(device)
        start, cpu_start = time.perf_counter(), time.process_time()
        loss, norm = train_step(model, optimizer, inputs, targets, args.grad_clip, bf16)
        if cuda:
            torch.cuda.synchronize(device)
        step_ms = (time.perf_counter() - start) * 1e3
        step_cpu_ms = (time.process_time() - cpu_start) * 1e3  # all threads of this process
        tokens_per_s = B * T / (step_ms / 1e3)
        loss_value, norm_value = loss.item(), norm.item()
        mem = torch.cuda.max_memory_allocated(device) if cuda else None  # not measured on the CPU
        if step > 0:  # step 0 is warm-up
            totals["steps"] += 1
            totals["step_ms"] += step_ms
            totals["tokens_per_s"] += tokens_per_s
            peak_mem = max(peak_mem or 0, mem) if mem is not None else None
        if not args.quiet:
            print(step_line(step, loss_value, step_ms, tokens_per_s, mem), flush=True)
        out.write({"type": "step", "step": step, "loss": finite(loss_value), "lr": lr,
                   "grad_norm": finite(norm_value), "step_ms": step_ms, "step_cpu_ms": step_cpu_ms,
                   "tokens_per_s": tokens_per_s,
                   "exposed_comm_ms": 0.0, "mem_total": mem})

    n = max(totals["steps"], 1)
    step_ms, tokens_per_s = totals["step_ms"] / n, totals["tokens_per_s"] / n
    model_flops = tokens_per_s * flops_per_token
    mfu = model_flops / peak if peak else None
    print(f"average over {totals['steps']} measured steps: {step_ms:.1f} ms/step | {format_count(tokens_per_s)} "
          f"tok/s | {model_flops / 1e12:.3g} model TFLOP/s | "
          + (f"MFU {100 * mfu:.1f}% of {peak_text}" if mfu is not None else peak_text)
          + f" | peak mem {format_bytes(peak_mem)} | final loss {loss_value:.4f}")
    print(f"  (model FLOP/s = tokens/s x FLOPs/token; FLOPs/token = 6N + 12LCT = 6 x {flops_params} + "
          f"12 x {L} x {C} x {T} = {flops_per_token}, N without position embeddings)", flush=True)
    out.write({"type": "summary", "measured_steps": totals["steps"], "step_ms": step_ms,
               "tokens_per_s": tokens_per_s, "flops_per_token": flops_per_token,
               "model_tflops": model_flops / 1e12, "mfu": mfu, "peak_tflops": peak / 1e12 if peak else None,
               "peak_note": peak_text, "peak_mem_bytes": peak_mem, "final_loss": finite(loss_value)})
    out.close()


if __name__ == "__main__":
    main()
