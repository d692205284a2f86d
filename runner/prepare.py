"""Prepare a profile's data and tokenizer once, and on a CUDA profile Flash Attention 3's kernel
(runner.kernels); later calls find them cached and do no work beyond checking the kernel's files."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass

from runner import kernels
from runner.data import Dataset, prepare_dataset
from runner.profiles import get_profile
from runner.tokenizer import Tokenizer, is_cached, prepare_tokenizer, tokenizer_dir


@dataclass
class Prepared:
    dataset: Dataset
    tokenizer: Tokenizer
    trained_tokenizer: bool
    flash_attention: str = ""  # on a CUDA profile: what was fetched, or why runs will use SDPA


def prepare(profile_name: str, data: str | None = None, *, progress: bool = False) -> Prepared:
    profile = get_profile(profile_name)
    dataset = prepare_dataset(data or profile.data, train_shards=profile.train_shards, progress=progress)
    spinner: contextlib.AbstractContextManager[object] = contextlib.nullcontext()
    if progress and not is_cached(dataset, profile.vocab_size):  # a cached one loads in a blink
        spinner = _spinner(
            f"training the {profile.vocab_size}-token BPE tokenizer "
            f"(cached in {tokenizer_dir(dataset, profile.vocab_size)})"
        )
    with spinner:
        tokenizer, trained = prepare_tokenizer(dataset, profile.vocab_size, profile.tokenizer_chars, profile.name)
    flash_attention = _fetch_flash_attention(progress) if profile.device == "cuda" else ""
    return Prepared(dataset, tokenizer, trained, flash_attention)


def _fetch_flash_attention(progress: bool) -> str:
    """Fetch Flash Attention 3 for the runs (runner.kernels). A failure only costs speed: the runs
    fall back to SDPA, and the returned line says why."""
    spinner: contextlib.AbstractContextManager[object] = contextlib.nullcontext()
    if progress and kernels.read_record(kernels.kernels_dir()) is None:
        spinner = _spinner(f"fetching Flash Attention 3 ({kernels.FLASH_ATTENTION_3}) into {kernels.kernels_dir()}")
    try:
        with spinner:
            line = kernels.describe(*kernels.fetch_flash_attention())
    except (kernels.KernelError, OSError) as error:
        line = f"Flash Attention 3 not fetched ({error}): runs on this machine will use PyTorch's SDPA"
    if progress:
        print(line, file=sys.stderr)
    return line


@contextlib.contextmanager
def _spinner(message: str) -> Iterator[None]:
    """A spinner with `message` on stderr while the block runs (on a terminal; elsewhere, a log
    for example, the message once)."""
    from rich.console import Console

    console = Console(stderr=True)
    if not console.is_terminal:
        console.print(f"{message} ...", soft_wrap=True, highlight=False)
        yield
        return
    with console.status(message):
        yield
