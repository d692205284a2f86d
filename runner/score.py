"""The scoring process: `python -m runner.score --model FILE --profile P [--data SRC]`.

It never runs train.py's code. Started with --wait while training runs, it gets ready (torch,
the validation split, the tokenizer) and scores when the supervisor writes `go`; it then loads
the exported graph (runner.handoff), runs the causality
probe (runner.probe) on the first validation batch, and evaluates val_bpb with the harness's own
evaluation (runner.evaluate) on the validation split, which the training sandbox never saw. Its
answer is one JSON object on the last line of stdout, read by the supervisor (runner.isolated):
{"val_bpb": ..., ...} when scored, {"rejected": why} for a model that may not be scored, or
{"error": why} when scoring failed. A scored answer carries `params_fingerprint`, a hash of the
model's parameters' names, shapes and dtypes as this process loaded them: a change to train.py that
keeps it equal to main's keeps main's parameters, and only such a change is judged on paired seeds
(bot.loop.judge). It comes from here, never from what train.py says of itself.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from runner import workdir
from runner.data import DataMissing, load_dataset
from runner.dataloader import batches
from runner.evaluate import evaluate_bpb
from runner.handoff import ModelRefused, autocast_for, load_model
from runner.harness import pick_device
from runner.probe import causality_probe
from runner.profiles import get_profile
from runner.tokenizer import load_tokenizer


class Scorer:
    """Everything but the model, ready: torch imported, the validation split and the tokenizer
    loaded, the probe's batch read (on the CPU: nothing touches the GPU while training runs)."""

    def __init__(self, profile_name: str, data: str | None = None) -> None:
        self.profile = get_profile(profile_name)
        self.device = pick_device(self.profile)
        self.dataset = load_dataset(data or self.profile.data, self.profile.name)
        self.tokenizer = load_tokenizer(self.dataset, self.profile.vocab_size, self.profile.name)
        self.first, _, _ = next(
            batches(
                self.tokenizer,
                self.dataset,
                "val",
                self.profile.eval_batch_size,
                self.profile.seq_len,
                torch.device("cpu"),
                loop=False,
            )
        )

    def score(self, model_file: Path) -> dict[str, Any]:
        started = time.time()
        profile, device = self.profile, self.device
        try:
            model = load_model(model_file).to(device)
        except ModelRefused as error:
            return {"rejected": str(error)}
        loaded = time.time()

        def forward(x: torch.Tensor) -> torch.Tensor:
            with torch.no_grad(), autocast_for(device):
                return model(x)

        probe = causality_probe(forward, self.first.to(device))
        probed = time.time()
        if not probe.causal:
            return {"rejected": probe.detail, "probe_seconds": probed - loaded}
        evaluation = evaluate_bpb(
            model,
            self.tokenizer,
            self.dataset,
            seq_len=profile.seq_len,
            eval_tokens=profile.eval_tokens,
            batch_size=profile.eval_batch_size,
            device=device,
            fixed_batch=True,
        )
        done = time.time()
        return {
            "val_bpb": evaluation.val_bpb,
            "params_fingerprint": params_fingerprint(model),
            "eval_tokens": evaluation.tokens,
            "eval_bytes": evaluation.bytes,
            "probe": probe.detail,
            "probe_max_change": probe.max_change,
            "load_seconds": loaded - started,
            "probe_seconds": probed - loaded,
            "eval_seconds": done - probed,
            "device": _device_name(device),
        }


def params_fingerprint(model: torch.nn.Module) -> str:
    """A short hash of the model's parameters' names, shapes and dtypes, in name order: equal for two
    models whose parameters differ only in their values."""
    described = sorted(f"{name}:{tuple(p.shape)}:{p.dtype}" for name, p in model.named_parameters())
    return hashlib.sha256("\n".join(described).encode()).hexdigest()[:16]


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runner.score")
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--profile", required=True)
    parser.add_argument("--data", default=None)
    parser.add_argument(
        "--wait",
        action="store_true",
        help="get ready, then score only after reading `go` on stdin (started while training runs)",
    )
    args = parser.parse_args(argv)
    started_in = os.getcwd()
    try:
        scorer = Scorer(args.profile, args.data)
        if args.wait:
            print("[score] ready", file=sys.stderr, flush=True)
            if sys.stdin.readline().strip() != "go":
                return 0  # the run ended without a model to score
            workdir.follow(started_in)  # a relative --model resolves in the (maybe renamed) directory
        answer = scorer.score(args.model)
    except (DataMissing, Exception) as error:  # noqa: BLE001 - the model can fail in any way: say how
        answer = {"error": f"scoring failed: {type(error).__name__}: {str(error)[:1000]}"}
    print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
