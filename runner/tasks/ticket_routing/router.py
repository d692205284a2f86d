"""Ticket router: learns from labelled support tickets, then sends each new ticket to a queue.

A multinomial naive Bayes classifier over the words of a ticket, in plain Python (standard library
only). The evaluator calls train() once with the training split, then route() on batches of
hold-out tickets, and measures the fraction routed to their true queue. The constants below are the
knobs; the method itself is fair game too.
"""

import math
import re
from collections import Counter, defaultdict

# --- knobs -------------------------------------------------------------------------------------
LOWERCASE = True  # fold case before splitting into words
MIN_WORD_LENGTH = 1  # shorter words are dropped
STOPWORDS = frozenset("a an the i my me to is it of and or in on for be do does can you your".split())
BIGRAMS = False  # also count pairs of adjacent words as features
ALPHA = 1.0  # additive smoothing of word counts per queue
PRIOR = True  # weigh each queue by its share of the training tickets

# --- learned state -----------------------------------------------------------------------------
_queues: list[str] = []
_log_prior: dict[str, float] = {}
_log_likelihood: dict[str, dict[str, float]] = {}
_log_unseen: dict[str, float] = {}
_vocabulary: set[str] = set()
_WORD = re.compile(r"[a-z0-9']+", re.IGNORECASE)


def features(text: str) -> list[str]:
    words = [w for w in _WORD.findall(text.lower() if LOWERCASE else text) if len(w) >= MIN_WORD_LENGTH]
    words = [w for w in words if w not in STOPWORDS]
    if BIGRAMS:
        words += [f"{words[i]} {words[i + 1]}" for i in range(len(words) - 1)]
    return words


def train(examples: list[tuple[str, str]]) -> None:
    counts: dict[str, Counter] = defaultdict(Counter)
    tickets = Counter()
    for text, queue in examples:
        counts[queue].update(features(text))
        tickets[queue] += 1
    _vocabulary.clear()
    _vocabulary.update(*counts.values())
    _queues[:] = sorted(counts)
    for queue in _queues:
        total = sum(counts[queue].values()) + ALPHA * len(_vocabulary)
        _log_prior[queue] = math.log(tickets[queue] / len(examples)) if PRIOR else 0.0
        _log_likelihood[queue] = {w: math.log((n + ALPHA) / total) for w, n in counts[queue].items()}
        _log_unseen[queue] = math.log(ALPHA / total)


def score(words: list[str], queue: str) -> float:
    likelihood, unseen = _log_likelihood[queue], _log_unseen[queue]
    return _log_prior[queue] + sum(likelihood.get(w, unseen) for w in words)


def route(texts: list[str]) -> list[str]:
    routed = []
    for text in texts:
        words = [w for w in features(text) if w in _vocabulary]  # a word no queue has seen says nothing
        routed.append(max(_queues, key=lambda queue: score(words, queue)))  # ties: the first queue by name
    return routed
