"""Evaluation: bits per byte on the fixed validation documents.

The harness calls the model for logits only and computes the loss itself, so train.py cannot
change how it is scored. In the isolated path (runner.isolated) the model is a torch.export graph
loaded by the scoring process (runner.score), exported for one batch shape: `fixed_batch` then
pads a short last batch to that shape and scores only its real rows. Per-token cross-entropy (nats) and the byte length of each target token
are summed over `eval_tokens` target tokens; tokens with no bytes (special tokens) are left out
of both sums; val_bpb = nats / (ln 2 * bytes).
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from runner.data import Dataset
from runner.dataloader import batches
from runner.tokenizer import Tokenizer


@dataclass
class Evaluation:
    val_bpb: float
    tokens: int  # target tokens scored (special tokens included in the count of positions)
    scored_tokens: int  # target tokens with at least one byte
    bytes: int
    nats: float


@torch.no_grad()
def evaluate_bpb(
    model: torch.nn.Module,
    tokenizer: Tokenizer,
    dataset: Dataset,
    *,
    seq_len: int,
    eval_tokens: int,
    batch_size: int,
    device: torch.device,
    fixed_batch: bool = False,
) -> Evaluation:
    rows_needed = max(1, eval_tokens // seq_len)
    token_bytes = tokenizer.token_bytes.to(device)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()
    toggles_mode = not isinstance(model, torch.fx.GraphModule)  # an exported graph has no train mode
    was_training = model.training
    if toggles_mode:
        model.eval()
    nats = 0.0
    nbytes = 0
    scored = 0
    rows_done = 0
    loader = batches(tokenizer, dataset, "val", batch_size, seq_len, device, loop=False)
    try:
        while rows_done < rows_needed:
            try:
                x, y, _ = next(loader)
            except StopIteration:
                raise RuntimeError(
                    f"the validation split has fewer than {eval_tokens} tokens for seq_len {seq_len}; "
                    "use a larger data source or a profile with fewer eval_tokens"
                ) from None
            take = min(batch_size, rows_needed - rows_done)
            x, y = x[:take], y[:take]
            with autocast:
                if fixed_batch and x.shape[0] < batch_size:
                    logits = model(torch.cat([x, x.new_zeros(batch_size - x.shape[0], x.shape[1])]))[: x.shape[0]]
                else:
                    logits = model(x)
            if logits.shape[:2] != y.shape or logits.shape[-1] < tokenizer.vocab_size:
                raise RuntimeError(
                    f"model(x) must return logits [B, T, V>={tokenizer.vocab_size}], got {tuple(logits.shape)}"
                )
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="none")
            target_bytes = token_bytes[y.reshape(-1)]
            counted = target_bytes > 0
            nats += loss[counted].sum().item()
            nbytes += int(target_bytes.sum().item())
            scored += int(counted.sum().item())
            rows_done += take
    finally:
        if toggles_mode:
            model.train(was_training)
    if not math.isfinite(nats):
        raise FloatingPointError("validation loss is not finite (NaN or inf)")
    return Evaluation(
        val_bpb=nats / (math.log(2) * nbytes), tokens=rows_done * seq_len, scored_tokens=scored, bytes=nbytes, nats=nats
    )
