"""The text the endpoint returns and how it counts tokens: one rule a client can predict.

- A prompt's tokens: ceil(UTF-8 bytes / 4), at least 1 (OpenAI's rule of thumb of four
  characters a token). A chat's: each message's text counted so, plus 3 per message
  (its role and separators) and 3 priming the reply, as OpenAI's cookbook counts the
  chat format.
- A completion's tokens: one per word generated. Each word is followed by a space.
- The words: drawn from a fixed list by a generator seeded with the request's `seed`,
  else with the CRC-32 of its prompt, so one prompt always gets one text.
- `stop`: the text ends before the first stop sequence it contains; the tokens
  generated up to it are counted. A stop sequence that spans tokens is cut from the
  token that completes it (what was sent before it stays sent).
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterator
from math import ceil

PER_MESSAGE_TOKENS = 3
REPLY_PRIMING_TOKENS = 3

SENTENCE = (
    "the rack streams weights through its sockets while the dataflow pipeline keeps "
    "every stage busy and the experts wait in memory for a router to call them into "
    "the fast tier where a kernel loop reads each layer once per token and the links "
    "carry partial sums between sockets so that one model spans many chips"
)
WORDS = tuple(SENTENCE.split())  # the generator's vocabulary


def count_tokens(text: str) -> int:
    return max(1, ceil(len(text.encode("utf-8")) / 4))


def chat_tokens(texts: list[str]) -> int:
    return sum(count_tokens(t) + PER_MESSAGE_TOKENS for t in texts) + REPLY_PRIMING_TOKENS


def seed_of(prompt: str, seed: int | None) -> int:
    return zlib.crc32(prompt.encode("utf-8")) if seed is None else seed


def words(seed: int) -> Iterator[str]:
    """The generated text, a token (a word and its space) at a time."""
    rng = random.Random(seed)
    while True:
        yield rng.choice(WORDS) + " "


class Text:
    """A request's output as its tokens come: the text so far, cut at a stop sequence."""

    def __init__(self, seed: int, stops: list[str]) -> None:
        self._words = words(seed)
        self._stops = stops
        self.text = ""
        self.stopped = False

    def next(self) -> str:
        """The next token's text ('' once a stop sequence has been met)."""
        if self.stopped:
            return ""
        before = len(self.text)
        full = self.text + next(self._words)
        cut = min((i for s in self._stops if (i := full.find(s)) >= 0), default=-1)
        if cut >= 0:
            full, self.stopped = full[: max(cut, before)], True
        self.text = full
        return full[before:]
