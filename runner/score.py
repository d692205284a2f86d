"""The scoring process: `python -m runner.score --model FILE --profile P [--data SRC]`.

It never runs train.py's code: it loads the exported graph (runner.handoff), runs the causality
probe (runner.probe) on the first validation batch, and evaluates val_bpb with the harness's own
evaluation (runner.evaluate) on the validation split, which the training sandbox never saw. Its
answer is one JSON object on the last line of stdout, read by the supervisor (runner.isolated):
{"val_bpb": ..., ...} when scored, {"rejected": why} for a model that may not be scored, or
{"error": why} when scoring failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from runner.data import DataMissing, load_dataset
from runner.dataloader import batches
from runner.evaluate import evaluate_bpb
from runner.handoff import ModelRefused, autocast_for, load_model
from runner.harness import pick_device
from runner.probe import causality_probe
from runner.profiles import get_profile
from runner.tokenizer import load_tokenizer


def score(model_file: Path, profile_name: str, data: str | None = None) -> dict[str, Any]:
    started = time.time()
    profile = get_profile(profile_name)
    device = pick_device(profile)
    dataset = load_dataset(data or profile.data, profile.name)
    tokenizer = load_tokenizer(dataset, profile.vocab_size, profile.name)
    try:
        model = load_model(model_file).to(device)
    except ModelRefused as error:
        return {"rejected": str(error)}
    loaded = time.time()
    first, _, _ = next(batches(tokenizer, dataset, "val", profile.eval_batch_size, profile.seq_len, device,
                               loop=False))

    def forward(x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad(), autocast_for(device):
            return model(x)

    probe = causality_probe(forward, first)
    probed = time.time()
    if not probe.causal:
        return {"rejected": probe.detail, "probe_seconds": probed - loaded}
    evaluation = evaluate_bpb(model, tokenizer, dataset, seq_len=profile.seq_len, eval_tokens=profile.eval_tokens,
                              batch_size=profile.eval_batch_size, device=device, fixed_batch=True)
    done = time.time()
    return {"val_bpb": evaluation.val_bpb, "eval_tokens": evaluation.tokens, "eval_bytes": evaluation.bytes,
            "probe": probe.detail, "probe_max_change": probe.max_change, "load_seconds": loaded - started,
            "probe_seconds": probed - loaded, "eval_seconds": done - probed, "device": str(device)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runner.score")
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--profile", required=True)
    parser.add_argument("--data", default=None)
    args = parser.parse_args(argv)
    try:
        answer = score(args.model, args.profile, args.data)
    except (DataMissing, Exception) as error:  # noqa: BLE001 - the model can fail in any way: say how
        answer = {"error": f"scoring failed: {type(error).__name__}: {str(error)[:1000]}"}
    print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
