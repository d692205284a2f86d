"""runner.tokenizer: round trips, the on-disk cache, vocabulary size and token byte lengths."""

from __future__ import annotations

import pytest

from runner.data import DataMissing, prepare_dataset
from runner.profiles import get_profile
from runner.tokenizer import BOS_TOKEN, SPECIAL_TOKENS, load_tokenizer, prepare_tokenizer, tokenizer_dir

SMOKE = get_profile("smoke")

TEXTS = [
    "Hello, world!",
    "Accents: café, naïve, Ünïcödé, façade, Øresund, ÅÄÖ, ß, Ελληνικά, Кириллица",
    "CJK: 你好，世界。日本語のテキスト、한국어 텍스트",
    "Emoji: 🙂 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇫🇷",
    "Numbers: 0 7 42 123 4567 89012 3.14159 -273.15 1e-9 1,000,000",
    "Whitespace runs:  two   three    four\t\ttabs \u00a0nbsp\u2003em space, zero\u200bwidth",
    "Lines\n\nwith\r\nCRLF and\n\n\n\nblank lines\n   indented\n\t\ttabbed\n",
    "  leading and trailing  ",
    "\n",
    " ",
    "",
    "x" * 500,
    "Is this a dagger which I see before me, / The handle toward my hand?",
    "<|reserved_0|> written as plain text is not the special token",
]


def test_round_trips_unicode_text(smoke_prepared):
    tokenizer = smoke_prepared.tokenizer
    for text in TEXTS:
        ids = tokenizer.encode(text)
        assert tokenizer.decode(ids) == text
        assert all(0 <= i < tokenizer.vocab_size for i in ids)
        assert tokenizer.bos_id not in ids
    rows = tokenizer.encode_batch(TEXTS)
    assert rows == [tokenizer.encode(t) for t in TEXTS]
    assert [tokenizer.decode(r) for r in rows] == TEXTS


def test_bos_prefix(smoke_prepared):
    tokenizer = smoke_prepared.tokenizer
    assert tokenizer.bos_id == tokenizer.encoding.encode_single_token(BOS_TOKEN)
    assert tokenizer.encode("to be", bos=True) == [tokenizer.bos_id, *tokenizer.encode("to be")]
    assert tokenizer.encode("", bos=True) == [tokenizer.bos_id]
    assert tokenizer.encode_batch(["a", "b c"], bos=True) == [
        [tokenizer.bos_id, *tokenizer.encode("a")],
        [tokenizer.bos_id, *tokenizer.encode("b c")],
    ]


def test_merges_were_learned(smoke_prepared):
    tokenizer = smoke_prepared.tokenizer
    text = "And the king said unto the lords of the court"
    assert len(tokenizer.encode(text)) < len(text.encode()) / 2, "BPE should merge common words"


def test_vocab_size_is_the_profiles(smoke_prepared):
    tokenizer = smoke_prepared.tokenizer
    assert tokenizer.vocab_size == SMOKE.vocab_size == 1024
    assert tuple(tokenizer.token_bytes.shape) == (SMOKE.vocab_size,)


def test_token_bytes_are_zero_exactly_for_special_tokens(smoke_prepared):
    tokenizer = smoke_prepared.tokenizer
    encoding = tokenizer.encoding
    special_ids = {encoding.encode_single_token(name) for name in SPECIAL_TOKENS}
    assert len(special_ids) == len(SPECIAL_TOKENS)
    token_bytes = tokenizer.token_bytes.tolist()
    for token in range(tokenizer.vocab_size):
        if token in special_ids:
            assert token_bytes[token] == 0, token
        else:
            length = len(encoding.decode_single_token_bytes(token))
            assert token_bytes[token] == length > 0, token
    # the 256 single bytes are all there, so any byte sequence can be encoded
    singles = {encoding.decode_single_token_bytes(t) for t in range(tokenizer.vocab_size) if token_bytes[t] == 1}
    assert singles == {bytes([b]) for b in range(256)}


def test_cached_tokenizer_is_reused(smoke_prepared):
    dataset, first = smoke_prepared.dataset, smoke_prepared.tokenizer
    assert smoke_prepared.trained_tokenizer, "the session's first prepare trains the tokenizer"
    directory = tokenizer_dir(dataset, SMOKE.vocab_size)
    files = sorted(p for p in directory.iterdir())
    assert {p.name for p in files} == {"ranks.tiktoken", "token_bytes.npy", "tokenizer.json", "trained.txt"}
    before = {p.name: p.stat().st_mtime_ns for p in files}

    second, trained = prepare_tokenizer(dataset, SMOKE.vocab_size, SMOKE.tokenizer_chars)

    assert trained is False
    assert {p.name: p.stat().st_mtime_ns for p in sorted(directory.iterdir())} == before
    assert same_tokens(first, second)
    assert second.token_bytes.tolist() == first.token_bytes.tolist()
    assert [second.encode(t) for t in TEXTS] == [first.encode(t) for t in TEXTS]
    assert same_tokens(load_tokenizer(dataset, SMOKE.vocab_size), first)


def test_training_is_deterministic(smoke_prepared, tmp_path, monkeypatch):
    """The same data gives the same tokenizer in a fresh cache (so results compare across machines)."""
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path / "cache"))
    dataset = prepare_dataset("builtin")
    assert dataset.fingerprint == smoke_prepared.dataset.fingerprint
    fresh, trained = prepare_tokenizer(dataset, SMOKE.vocab_size, SMOKE.tokenizer_chars)
    assert trained is True
    assert same_tokens(fresh, smoke_prepared.tokenizer)


def test_untrained_vocabulary_names_the_prepare_command(smoke_prepared):
    with pytest.raises(DataMissing) as info:
        load_tokenizer(smoke_prepared.dataset, 777, "smoke")
    assert "autoresearch prepare --profile smoke" in str(info.value)
    assert "777" in str(info.value)
    with pytest.raises(DataMissing, match="`autoresearch prepare"):
        load_tokenizer(smoke_prepared.dataset, 777)


def same_tokens(a, b) -> bool:
    ea, eb = a.encoding, b.encoding
    return (
        ea.n_vocab == eb.n_vocab
        and all(ea.decode_single_token_bytes(t) == eb.decode_single_token_bytes(t) for t in range(ea.n_vocab))
        and all(ea.encode_single_token(n) == eb.encode_single_token(n) for n in SPECIAL_TOKENS)
    )
