"""
train.py: the one file the agent edits.

A small GPT trained for the harness's fixed time budget, then scored by the harness in validation
bits per byte (val_bpb, lower is better). Everything here may change: the model, the optimizer, the
schedule, the hyperparameters. What may not change lives in `runner/` (data, tokenizer, clock,
evaluation): this file asks the harness for batches, reports each step, and hands over the model.

Run it through the harness: `autoresearch train --profile cpu` (or h100 on a GPU).
"""

import gc
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
ASPECT_RATIO = 64            # model_dim = DEPTH * ASPECT_RATIO, rounded up to a multiple of HEAD_DIM
HEAD_DIM = 128               # attention head size
TOTAL_BATCH_SIZE = 2**19     # tokens per optimizer step: a multiple of DEVICE_BATCH_SIZE * seq_len
DEVICE_BATCH_SIZE = 128      # sequences per forward pass (seq_len is 2048 on h100)
# Model shape and batch on the CPU (profiles cpu and smoke: seq_len 256 and 128)
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
WEIGHT_DECAY = 0.2           # Muon matrices only, cautious, decays with the schedule
ADAM_BETA1 = 0.8
ADAM_BETA2 = 0.95
MUON_MOMENTUM = 0.95
MUON_BETA2 = 0.95            # NorMuon: decay of each neuron's running mean square update
WARMUP_RATIO = 0.0           # fraction of the budget spent warming the learning rate up
WARMDOWN_RATIO = 0.5         # fraction of the budget spent cooling it down at the end
FINAL_LR_FRAC = 0.0          # learning rate at the very end, as a fraction of the peak
LOSS_LIMIT = 100.0           # a training loss above this stops the run at once: it has blown up

# ---------------------------------------------------------------------------
# The run: the harness decides profile, device, data and time budget
# ---------------------------------------------------------------------------
h = harness.session()
device = h.device
on_gpu = device.type == "cuda"
prefix = ""  # which constants are live, for error messages
if not on_gpu:
    DEPTH, ASPECT_RATIO, HEAD_DIM = CPU_DEPTH, CPU_ASPECT_RATIO, CPU_HEAD_DIM
    TOTAL_BATCH_SIZE, DEVICE_BATCH_SIZE = CPU_TOTAL_BATCH_SIZE, CPU_DEVICE_BATCH_SIZE
    prefix = "CPU_"


def accumulation_steps(total, device_batch, seq_len):
    """Forward passes per optimizer step. The batch must split into whole passes: a silently rounded
    batch would make an edit of TOTAL_BATCH_SIZE change nothing, and its experiment measure noise."""
    if device_batch < 1:
        raise ValueError(f"{prefix}DEVICE_BATCH_SIZE = {device_batch}: a forward pass needs at least 1 sequence.")
    tokens_per_pass = device_batch * seq_len
    if total >= tokens_per_pass and total % tokens_per_pass == 0:
        return total // tokens_per_pass
    fix = (f"Set {prefix}TOTAL_BATCH_SIZE to a multiple of {tokens_per_pass}, such as "
           f"{max(1, round(total / tokens_per_pass)) * tokens_per_pass}")
    sequences = total // seq_len
    if total > 0 and total % seq_len == 0:  # a smaller micro-batch can split it too
        divisor = max(d for d in range(1, min(sequences, device_batch) + 1) if sequences % d == 0)
        fix += f", or {prefix}DEVICE_BATCH_SIZE to a divisor of {sequences}, such as {divisor}"
    raise ValueError(f"{prefix}TOTAL_BATCH_SIZE = {total} tokens is not a positive multiple of "
                     f"{prefix}DEVICE_BATCH_SIZE * seq_len = {device_batch} * {seq_len} = {tokens_per_pass} "
                     f"(profile {h.profile.name}). {fix}.")


grad_accum = accumulation_steps(TOTAL_BATCH_SIZE, DEVICE_BATCH_SIZE, h.seq_len)  # fails before any work
autocast = torch.autocast("cuda", dtype=torch.bfloat16) if on_gpu else torch.autocast("cpu", enabled=False)
if on_gpu:
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True


def load_flash_attention(capability):
    """Flash Attention 3's interface on a Hopper GPU (compute capability 9.x) when the `kernels`
    package loads it, else None (PyTorch's SDPA); and which, in words. The runner fetched the kernel
    before the run (`autoresearch prepare`): inside the sandbox it loads offline, from that copy."""
    if capability is None:
        return None, "SDPA (CPU)"
    if capability[0] != 9:
        return None, f"SDPA (Flash Attention 3 needs a Hopper GPU; this one is sm_{capability[0]}{capability[1]})"
    try:
        from kernels import get_kernel
        return get_kernel("varunneal/flash-attention-3", version=1).flash_attn_interface, "Flash Attention 3"
    except Exception as error:  # any failure here only costs speed
        why = (str(error).strip().splitlines() or [""])[0][:200]
        return None, (f"SDPA (Flash Attention 3 did not load: {type(error).__name__}: {why}; "
                      f"`autoresearch prepare --profile {h.profile.name}` fetches it)")


flash_attn, attention = load_flash_attention(torch.cuda.get_device_capability() if on_gpu else None)

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
        if flash_attn is not None and self.training:  # eval (the exported graph the scorer runs) uses SDPA
            # FA3 wants one half-precision dtype for q, k and v
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
# The optimizer: Muon for the matrices inside the blocks, AdamW for the rest. Muon's update is the
# Nesterov momentum made semi-orthogonal (Polar Express), each neuron's share of it normalized
# (NorMuon), plus weight decay only where update and weight agree in sign (cautious).
# ---------------------------------------------------------------------------

# Polar Express (Amsel et al., 2025): one (a, b, c) per iteration of X <- a X + b X X^T X + c (X X^T)^2 X,
# chosen so that five iterations push every singular value of X close to 1.
POLAR_EXPRESS = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)


def orthogonalize(G):
    """The nearest semi-orthogonal matrix to each matrix in G [..., rows, cols]; bf16 on a GPU."""
    X = G.bfloat16() if G.is_cuda else G.float()
    tall = X.size(-2) > X.size(-1)
    if tall:  # iterate on the smaller of the two Gram matrices
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) * 1.02 + 1e-6)  # all singular values now below 1
    for a, b, c in POLAR_EXPRESS:
        A = X @ X.mT
        X = a * X + (b * A + c * A @ A) @ X
    return (X.mT if tall else X).float()


def normalize_neurons(U, second_moment, beta2):
    """NorMuon: divide each row of U (each column, for a wide matrix) by its running RMS, then
    rescale so that U keeps its overall norm. second_moment holds the running mean squares."""
    along = -1 if U.size(-2) >= U.size(-1) else -2  # one statistic per entry of the longer side
    second_moment.lerp_(U.square().mean(dim=along, keepdim=True), 1 - beta2)
    V = U * second_moment.clamp_min(1e-10).rsqrt()
    return V * (U.norm(dim=(-2, -1), keepdim=True) / V.norm(dim=(-2, -1), keepdim=True).clamp_min(1e-10))


def muon_update(grad, W, momentum_buffer, second_moment, momentum, lr, weight_decay, beta2):
    """One Muon step for a stack of same-shape matrices W, in place on W and its two buffers. The
    hyperparameters are floats (eager) or 0-d tensors (compiled: a new value needs no recompilation)."""
    momentum_buffer.lerp_(grad, 1 - momentum)
    update = grad.lerp_(momentum_buffer, momentum)  # Nesterov
    update = normalize_neurons(orthogonalize(update), second_moment, beta2)
    agree = (update * W) >= 0  # decay only where the step already moves the weight towards 0
    W.sub_(lr * (update + weight_decay * W * agree))


class Muon(torch.optim.Optimizer):
    """Muon with NorMuon and cautious weight decay. Matrices of one shape form one group and are
    updated together, stacked, so that each step runs a few large kernels rather than many small.
    `update` is muon_update, or its compiled form on a GPU."""

    def __init__(self, params, lr, momentum, beta2, weight_decay, update):
        shapes = sorted({tuple(p.shape) for p in params})
        groups = [dict(params=[p for p in params if tuple(p.shape) == shape]) for shape in shapes]
        super().__init__(groups, dict(lr=lr, momentum=momentum, beta2=beta2, weight_decay=weight_decay))
        self.update = update
        self.compiled = update is not muon_update

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            params = group["params"]
            n, (rows, cols) = len(params), params[0].shape
            state = self.state[params[0]]  # the group's state lives with its first matrix
            if not state:
                state["momentum"] = torch.zeros(n, rows, cols, device=params[0].device)
                moment_shape = (n, rows, 1) if rows >= cols else (n, 1, cols)
                state["second_moment"] = torch.zeros(moment_shape, device=params[0].device)
            W = torch.stack(params)
            grad = torch.stack([p.grad for p in params]).float()
            lr = group["lr"] * max(1.0, rows / cols) ** 0.5
            scalars = (group["momentum"], lr, group["weight_decay"], group["beta2"])
            if self.compiled:  # 0-d CPU tensors, refilled each step: the compiled graph never sees a new constant
                held = state.setdefault("scalars", [torch.zeros(()) for _ in scalars])
                for tensor, value in zip(held, scalars):
                    tensor.fill_(value)
                scalars = held
            self.update(grad, W, state["momentum"], state["second_moment"], *scalars)
            for p, w in zip(params, W):
                p.copy_(w)


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
model_dim = math.ceil(DEPTH * ASPECT_RATIO / HEAD_DIM) * HEAD_DIM  # whole heads
model = GPT(h.vocab_size, h.seq_len, DEPTH, model_dim, HEAD_DIM, WINDOW_PATTERN, LOGIT_SOFTCAP).to(device)
model.init_weights()
num_params = sum(p.numel() for p in model.parameters())
print(f"model: depth {DEPTH}, dim {model_dim}, {num_params / 1e6:.2f}M parameters, profile {h.profile.name}, "
      f"{grad_accum} forward passes per step")

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
    betas=(ADAM_BETA1, ADAM_BETA2), eps=1e-10, weight_decay=0.0, fused=on_gpu,  # one CUDA kernel for every tensor
)
# On a GPU the Muon step is compiled into a few fused kernels per shape, as the reference compiles its
# own; on the CPU it stays eager: compiling it costs more of a short run than it would save.
if on_gpu:
    muon_step = torch.compile(muon_update, dynamic=False, fullgraph=True)
    optimizer_step = "compiled (Muon: torch.compile, fullgraph; AdamW: fused)"
else:
    muon_step, optimizer_step = muon_update, "eager (CPU: compiling costs more of a short run than it saves)"
muon = Muon(matrices, lr=MATRIX_LR, momentum=MUON_MOMENTUM, beta2=MUON_BETA2, weight_decay=WEIGHT_DECAY,
            update=muon_step)
print(f"attention: {attention}; optimizer step: {optimizer_step}")
optimizers = [adamw, muon]
for opt in optimizers:
    for group in opt.param_groups:
        group["initial_lr"] = group["lr"]

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
    for group in muon.param_groups:
        group["momentum"] = MUON_MOMENTUM - 0.1 * max(0.0, 1 - h.step / 300)  # momentum warmup
        group["weight_decay"] = WEIGHT_DECAY * (1 - progress)
    for opt in optimizers:
        opt.step()
    model.zero_grad(set_to_none=True)
    train_loss = loss.item()  # waits for the step to finish
    if h.step == 0:  # after the first step (compilation, allocations): collect once, then keep the collector out
        gc.collect()
        gc.freeze()
        gc.disable()
    elif h.step % 5000 == 0:
        gc.collect()  # a long run still frees its reference cycles now and then
    h.step_done(train_loss)  # a NaN or infinite loss stops the run here
    if train_loss > LOSS_LIMIT:  # with LOGIT_SOFTCAP 15 the loss stays below 30 + ln(vocab)
        raise RuntimeError(f"training loss {train_loss:.1f} at step {h.step} is above LOSS_LIMIT = {LOSS_LIMIT}: "
                           "the run blew up. Lower the learning rates or add warmup (WARMUP_RATIO).")

print(f"trained {h.step} steps in {time.time() - t_start:.1f}s wall")
result = h.finish(model, flops_per_token=model.flops_per_token(),
                  extra={"depth": DEPTH, "attention": attention, "optimizer_step": optimizer_step})
print(result.summary_block())
