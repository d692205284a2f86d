"""The measurement identity: what two results must share to be compared.

A result compares with another only when profile, harness hash and data fingerprint all match,
and on a CPU-clock profile the threads allotted to a run too (that budget is CPU time per thread).
The conductor pins this identity when it starts, from the installed harness and the prepared data,
with the fingerprint recomputed from the files rather than taken from the manifest.
"""

from __future__ import annotations

from runner.data import load_dataset, verify_dataset
from runner.profiles import get_profile, harness_hash
from runner.tokenizer import load_tokenizer


def measurement_identity(profile_name: str, data: str | None = None, threads: int | None = None) -> dict[str, str]:
    """{"profile", "harness_hash", "data_fingerprint"} for the prepared data of the profile (or of
    `data`), with "threads" on a CPU-clock profile when the runner says how many it allots. Raises
    ValueError for an unknown profile, DataMissing when the data or tokenizer is not prepared,
    DataCorrupt when the files do not match what preparation wrote."""
    profile = get_profile(profile_name)
    dataset = load_dataset(data or profile.data, profile.name)
    fingerprint = verify_dataset(dataset, profile.name)
    load_tokenizer(dataset, profile.vocab_size, profile.name)  # runs need it: prepared, and sound
    identity = {"profile": profile.name, "harness_hash": harness_hash(), "data_fingerprint": fingerprint}
    if threads is not None and profile.clock == "cpu":
        identity["threads"] = str(threads)
    return identity
