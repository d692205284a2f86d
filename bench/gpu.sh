#!/usr/bin/env bash
# Measure the baseline train.py on this GPU machine as the bot does (see bench/gpu.py); arguments go to it.
cd "$(dirname "$0")/.." && make --quiet venv && exec .venv/bin/python bench/gpu.py "$@"
