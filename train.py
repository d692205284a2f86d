"""
train.py: the one file the agent edits.

A small GPT trained for the harness's fixed time budget, then scored by the harness in validation
bits per byte (val_bpb, lower is better). Everything here may change: the model, the optimizer, the
schedule, the hyperparameters. What may not change lives in `runner/` (data, tokenizer, clock,
evaluation): this file asks the harness for batches, reports each step, and hands over the model.

Run it through the harness: `autoresearch train --profile cpu` (or h100 on a GPU).
"""

import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from runner import harness

# ---------------------------------------------------------------------------
# Hyperparameters: the agent's main knobs
# ---------------------------------------------------------------------------
# Model shape and batch on a GPU (profile h100)
DEPTH = 8                    # transformer layers
ASPECT_RATIO = 64            # model_dim = DEPTH * ASPECT_RATIO
HEAD_DIM = 128               # attention head size
TOTAL_BATCH_SIZE = 2**19     # tokens per optimizer step
DEVICE_BATCH_SIZE = 128      # sequences per forward pass
# Model shape and batch on the CPU (profiles cpu, smoke)
CPU_DEPTH = 2
CPU_ASPECT_RATIO = 64
CPU_HEAD_DIM = 32
CPU_TOTAL_BATCH_SIZE = 2**12
CPU_DEVICE_BATCH_SIZE = 16
# Attention
WINDOW_PATTERN = "SSSL"      # per layer, cycled: S = half context, L = full context; last layer is L
LOGIT_SOFTCAP = 15.0         # logits = cap * tanh(logits / cap)
# Optimization
EMBEDDING_LR = 0.6           # AdamW, token and value embeddings
UNEMBEDDING_LR = 0.004       # AdamW, output head
MATRIX_LR = 0.04             # Muon, every matrix inside the blocks
SCALAR_LR = 0.5              # AdamW, per-layer residual and x0 scalars
WEIGHT_DECAY = 0.2           # Muon matrices only, decays with the schedule
ADAM_BETA1 = 0.8
ADAM_BETA2 = 0.95
MUON_MOMENTUM = 0.95
WARMUP_RATIO = 0.0           # fraction of the budget spent warming the learning rate up
WARMDOWN_RATIO = 0.5         # fraction of the budget spent cooling it down at the end
FINAL_LR_FRAC = 0.0          # learning rate at the very end, as a fraction of the peak

# ---------------------------------------------------------------------------
# The run: the harness decides profile, device, data and time budget
# ---------------------------------------------------------------------------
h = harness.session()
device = h.device
on_gpu = device.type == "cuda"
if not on_gpu:
    DEPTH, ASPECT_RATIO, HEAD_DIM = CPU_DEPTH, CPU_ASPECT_RATIO, CPU_HEAD_DIM
    TOTAL_BATCH_SIZE, DEVICE_BATCH_SIZE = CPU_TOTAL_BATCH_SIZE, CPU_DEVICE_BATCH_SIZE
autocast = torch.autocast("cuda", dtype=torch.bfloat16) if on_gpu else torch.autocast("cpu", enabled=False)
if on_gpu:
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

# Flash Attention 3 on Hopper when the `kernels` package can fetch it, else PyTorch's SDPA.
flash_attn = None
if on_gpu and torch.cuda.get_device_capability()[0] == 9:
    try:
        from kernels import get_kernel
        flash_attn = get_kernel("varunneal/flash-attention-3").flash_attn_interface
    except Exception as error:  # any failure here only costs speed
        print(f"Flash Attention 3 unavailable ({type(error).__name__}); using SDPA")

# ---------------------------------------------------------------------------
# The model: GPT with rotary embeddings, QK-norm, squared-ReLU MLP, value embeddings,
# per-layer residual and x0 scalars, sliding-window attention and a logit softcap
# ---------------------------------------------------------------------------


def rms_norm(x):
    return F.rms_norm(x, (x.size(-1),))


def rotary_tables(seq_len, head_dim, base=10000.0):
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    return angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]  # [1, T, 1, D/2]


def apply_rotary(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos[:, : x.size(1)].to(x.dtype), sin[:, : x.size(1)].to(x.dtype)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def window_sizes(depth, seq_len, pattern):
    """Context window of each layer: S = half the sequence, L = all of it; the last layer is L."""
    sizes = [seq_len // 2 if pattern[i % len(pattern)] == "S" else seq_len for i in range(depth)]
    sizes[-1] = seq_len
    return sizes


def has_value_embedding(layer, depth):
    return layer % 2 == (depth - 1) % 2  # every other layer, always including the last


class Attention(nn.Module):
    def __init__(self, dim, head_dim, window, vocab_size, use_ve):
        super().__init__()
        self.n_head = dim // head_dim
        self.head_dim = head_dim
        self.window = window
        self.c_q = nn.Linear(dim, dim, bias=False)
        self.c_k = nn.Linear(dim, dim, bias=False)
        self.c_v = nn.Linear(dim, dim, bias=False)
        self.c_proj = nn.Linear(dim, dim, bias=False)
        self.value_embed = nn.Embedding(vocab_size, dim) if use_ve else None
        self.ve_gate = nn.Linear(min(32, dim), self.n_head, bias=False) if use_ve else None

    def forward(self, x, idx, cos, sin):
        B, T, C = x.shape
        q = self.c_q(x).view(B, T, self.n_head, self.head_dim)
        k = self.c_k(x).view(B, T, self.n_head, self.head_dim)
        v = self.c_v(x).view(B, T, self.n_head, self.head_dim)
        if self.value_embed is not None:
            gate = 2 * torch.sigmoid(self.ve_gate(x[..., : self.ve_gate.in_features]))  # [B, T, H]
            ve = self.value_embed(idx).view(B, T, self.n_head, self.head_dim)
            v = v + (gate.unsqueeze(-1) * ve).to(v.dtype)  # embeddings stay float32 under autocast
        q, k = rms_norm(apply_rotary(q, cos, sin)), rms_norm(apply_rotary(k, cos, sin))
        if flash_attn is not None:  # FA3 wants one half-precision dtype for q, k and v
            q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
            y = flash_attn.flash_attn_func(q, k, v, causal=True, window_size=(self.window - 1, 0))
            y = y[0] if isinstance(y, tuple) else y
        else:
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
            if self.window >= T:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                pos = torch.arange(T, device=x.device)
                distance = pos[:, None] - pos[None, :]
                mask = (distance >= 0) & (distance < self.window)
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            y = y.transpose(1, 2)
        return self.c_proj(y.reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.c_fc = nn.Linear(dim, 4 * dim, bias=False)
        self.c_proj = nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x):
        return self.c_proj(F.relu(self.c_fc(x)).square())


class Block(nn.Module):
    def __init__(self, dim, head_dim, window, vocab_size, use_ve):
        super().__init__()
        self.attn = Attention(dim, head_dim, window, vocab_size, use_ve)
        self.mlp = MLP(dim)

    def forward(self, x, idx, cos, sin):
        x = x + self.attn(rms_norm(x), idx, cos, sin)
        return x + self.mlp(rms_norm(x))


class GPT(nn.Module):
    def __init__(self, vocab_size, seq_len, depth, dim, head_dim, pattern, softcap):
        super().__init__()
        self.softcap = softcap
        self.wte = nn.Embedding(vocab_size, dim)
        windows = window_sizes(depth, seq_len, pattern)
        self.blocks = nn.ModuleList(
            Block(dim, head_dim, windows[i], vocab_size, has_value_embedding(i, depth)) for i in range(depth)
        )
        self.resid_lambdas = nn.Parameter(torch.ones(depth))  # scales the residual stream per layer
        self.x0_lambdas = nn.Parameter(torch.full((depth,), 0.1))  # mixes the first embedding back in
        self.lm_head = nn.Linear(dim, vocab_size, bias=False)
        cos, sin = rotary_tables(seq_len, head_dim)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    @torch.no_grad()
    def init_weights(self):
        dim = self.wte.embedding_dim
        bound = math.sqrt(3.0 / dim)  # uniform with the variance of normal(0, 1/sqrt(dim))
        nn.init.normal_(self.wte.weight, std=1.0)
        nn.init.normal_(self.lm_head.weight, std=0.001)
        for block in self.blocks:
            for linear in (block.attn.c_q, block.attn.c_k, block.attn.c_v, block.mlp.c_fc):
                nn.init.uniform_(linear.weight, -bound, bound)
            nn.init.zeros_(block.attn.c_proj.weight)  # each block starts as the identity
            nn.init.zeros_(block.mlp.c_proj.weight)
            if block.attn.value_embed is not None:
                nn.init.uniform_(block.attn.value_embed.weight, -bound, bound)
                nn.init.zeros_(block.attn.ve_gate.weight)

    def forward(self, idx, targets=None):
        x = x0 = rms_norm(self.wte(idx))
        for i, block in enumerate(self.blocks):
            x = self.resid_lambdas[i] * x + self.x0_lambdas[i] * x0
            x = block(x, idx, self.cos, self.sin)
        logits = self.lm_head(rms_norm(x)).float()
        logits = self.softcap * torch.tanh(logits / self.softcap)
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    def flops_per_token(self):
        """Forward + backward matmul FLOPs per token (6 per weight, plus attention scores)."""
        embeddings = self.wte.weight.numel() + sum(
            b.attn.value_embed.weight.numel() for b in self.blocks if b.attn.value_embed is not None)
        matmul_params = sum(p.numel() for p in self.parameters()) - embeddings
        attention = sum(12 * b.attn.n_head * b.attn.head_dim * min(b.attn.window, self.cos.size(1))
                        for b in self.blocks)
        return 6 * matmul_params + attention


# ---------------------------------------------------------------------------
# The optimizer: Muon (orthogonalized momentum) for matrices, AdamW for the rest
# ---------------------------------------------------------------------------


def orthogonalize(G, steps=5):
    """Newton-Schulz iteration towards the nearest semi-orthogonal matrix (the Muon update)."""
    a, b, c = 3.4445, -4.7750, 2.0315
    X = G.bfloat16() if G.is_cuda else G.float()
    tall = X.size(-2) > X.size(-1)
    if tall:
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        A = X @ X.mT
        X = a * X + (b * A + c * A @ A) @ X
    return (X.mT if tall else X).to(G.dtype)


class Muon(torch.optim.Optimizer):
    def __init__(self, params, lr, momentum, weight_decay):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                buf = self.state[p].setdefault("momentum", torch.zeros_like(p))
                buf.lerp_(p.grad, 1 - group["momentum"])
                update = p.grad.lerp(buf, group["momentum"])  # Nesterov
                scale = max(1.0, p.size(0) / p.size(1)) ** 0.5
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(orthogonalize(update), alpha=-group["lr"] * scale)


def lr_multiplier(progress):
    if progress < WARMUP_RATIO:
        return (progress + 1e-8) / WARMUP_RATIO
    if progress < 1.0 - WARMDOWN_RATIO:
        return 1.0
    cooled = (1.0 - progress) / WARMDOWN_RATIO
    return FINAL_LR_FRAC + (1.0 - FINAL_LR_FRAC) * cooled


# ---------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------
model_dim = DEPTH * ASPECT_RATIO
model = GPT(h.vocab_size, h.seq_len, DEPTH, model_dim, HEAD_DIM, WINDOW_PATTERN, LOGIT_SOFTCAP).to(device)
model.init_weights()
num_params = sum(p.numel() for p in model.parameters())
print(f"model: depth {DEPTH}, dim {model_dim}, {num_params / 1e6:.2f}M parameters, profile {h.profile.name}")

adam_scale = (model_dim / 768) ** -0.5  # AdamW learning rates were tuned at width 768
matrices = [p for b in model.blocks for n, p in b.named_parameters() if p.ndim == 2 and "value_embed" not in n]
embeddings = [model.wte.weight] + [b.attn.value_embed.weight for b in model.blocks if b.attn.value_embed is not None]
adamw = torch.optim.AdamW(
    [
        dict(params=embeddings, lr=EMBEDDING_LR * adam_scale),
        dict(params=[model.lm_head.weight], lr=UNEMBEDDING_LR * adam_scale),
        dict(params=[model.resid_lambdas], lr=SCALAR_LR * 0.01),
        dict(params=[model.x0_lambdas], lr=SCALAR_LR),
    ],
    betas=(ADAM_BETA1, ADAM_BETA2), eps=1e-10, weight_decay=0.0,
)
muon = Muon(matrices, lr=MATRIX_LR, momentum=MUON_MOMENTUM, weight_decay=WEIGHT_DECAY)
optimizers = [adamw, muon]
for opt in optimizers:
    for group in opt.param_groups:
        group["initial_lr"] = group["lr"]

grad_accum = max(1, TOTAL_BATCH_SIZE // (DEVICE_BATCH_SIZE * h.seq_len))
train_model = torch.compile(model) if on_gpu else model
batches = h.train_batches(DEVICE_BATCH_SIZE)
x, y = next(batches)
t_start = time.time()

while not h.time_up():
    for _ in range(grad_accum):
        with autocast:
            loss = train_model(x, y)
        (loss / grad_accum).backward()
        x, y = next(batches)  # prefetch while the GPU works
    progress = h.progress()
    multiplier = lr_multiplier(progress)
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = group["initial_lr"] * multiplier
    muon.param_groups[0]["momentum"] = MUON_MOMENTUM - 0.1 * max(0.0, 1 - h.step / 300)  # momentum warmup
    muon.param_groups[0]["weight_decay"] = WEIGHT_DECAY * (1 - progress)
    for opt in optimizers:
        opt.step()
    model.zero_grad(set_to_none=True)
    h.step_done(loss)

print(f"trained {h.step} steps in {time.time() - t_start:.1f}s wall")
result = h.finish(model, flops_per_token=model.flops_per_token(), extra={"depth": DEPTH})
print(result.summary_block())
