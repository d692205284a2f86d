#!/usr/bin/env bash
# Measure main's train.py on this GPU machine as the bot does (bench/gpu.py; arguments go to it):
# prepare (data, tokenizer, and Flash Attention 3 fetched for the sandboxed runs), the sandboxed h100
# runs, then MFU, tokens/s, val_bpb, peak memory, attention and optimizer step against the reference's.
# It makes or reuses .venv first (`make venv`, which needs the package index when pyproject.toml changed).
cd "$(dirname "$0")/.." || exit 2
if ! make --quiet venv; then
    if [ ! -x .venv/bin/python ]; then
        echo "bench/gpu.sh: could not make .venv (make venv failed above: is the package index reachable?)." \
            "Make it once where it is, then run this again." >&2
        exit 2
    fi
    echo "bench/gpu.sh: make venv failed; going on with the .venv already here (it may lack what pyproject.toml added)" >&2
fi
exec .venv/bin/python bench/gpu.py "$@"
