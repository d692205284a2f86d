"""bot.core.textcache: a value worked out from a text is remembered by the text's digest, for many
texts, from several threads."""

from __future__ import annotations

import threading

from bot.core import textcache


def test_a_value_is_worked_out_once_per_text_and_argument() -> None:
    calls: list[tuple[str, str]] = []

    @textcache.by_digest
    def shout(text: str, how: str = "!") -> str:
        calls.append((text, how))
        return text.upper() + how

    assert [shout("a"), shout("a"), shout("a", "?"), shout("b"), shout("a", "?")] == ["A!", "A!", "A?", "B!", "A?"]
    assert calls == [("a", "!"), ("a", "?"), ("b", "!")]


def test_more_texts_than_experiments_in_flight_are_remembered_and_the_oldest_go_first(monkeypatch) -> None:
    monkeypatch.setattr(textcache, "MAX_ENTRIES", 100)
    calls: list[str] = []

    @textcache.by_digest
    def length(text: str) -> int:
        calls.append(text)
        return len(text)

    texts = [f"train.py {i}" for i in range(100)]
    for text in texts + texts:  # 100 texts twice: each worked out once (lru_cache(32) worked out all 200)
        length(text)
    assert len(calls) == 100
    length("one more")  # pushes out the least recently used: "train.py 0"
    length("train.py 99")
    length("train.py 0")
    assert calls[-2:] == ["one more", "train.py 0"]


def test_several_threads_share_it() -> None:
    @textcache.by_digest
    def length(text: str) -> int:
        return len(text)

    errors: list[BaseException] = []

    def work(offset: int) -> None:
        try:
            for i in range(2000):
                assert length("x" * ((i + offset) % 300)) == (i + offset) % 300
        except BaseException as error:  # noqa: BLE001 - any failure is the finding
            errors.append(error)

    threads = [threading.Thread(target=work, args=(n * 7,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
