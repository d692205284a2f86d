"""Prepare a profile's data and tokenizer once; later calls find them cached and do no work."""

from __future__ import annotations

from dataclasses import dataclass

from runner.data import Dataset, prepare_dataset
from runner.profiles import get_profile
from runner.tokenizer import Tokenizer, prepare_tokenizer, tokenizer_dir


@dataclass
class Prepared:
    dataset: Dataset
    tokenizer: Tokenizer
    trained_tokenizer: bool


def prepare(profile_name: str, data: str | None = None, *, progress: bool = False) -> Prepared:
    profile = get_profile(profile_name)
    dataset = prepare_dataset(data or profile.data, train_shards=profile.train_shards, progress=progress)
    if progress:
        from rich.console import Console

        with Console(stderr=True).status(f"training the {profile.vocab_size}-token BPE tokenizer "
                                         f"(cached in {tokenizer_dir(dataset, profile.vocab_size)})"):
            tokenizer, trained = prepare_tokenizer(dataset, profile.vocab_size, profile.tokenizer_chars)
    else:
        tokenizer, trained = prepare_tokenizer(dataset, profile.vocab_size, profile.tokenizer_chars)
    return Prepared(dataset, tokenizer, trained)
