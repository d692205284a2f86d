"""Prepare a profile's data and tokenizer once; later calls find them cached and do no work."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from runner.data import Dataset, prepare_dataset
from runner.profiles import get_profile
from runner.tokenizer import Tokenizer, is_cached, prepare_tokenizer, tokenizer_dir


@dataclass
class Prepared:
    dataset: Dataset
    tokenizer: Tokenizer
    trained_tokenizer: bool


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
    return Prepared(dataset, tokenizer, trained)


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
