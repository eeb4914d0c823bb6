"""Incremental detokenization with stop strings, for one sequence."""

from __future__ import annotations

import codecs

from latlab.tokenizer import Tokenizer


class Detokenizer:
    """Turns a sequence's tokens into text as they come, releasing each piece as early as it
    is known.

    Held back are only the bytes of a UTF-8 character not complete yet (a byte that can never
    start one is released at once, as "�") and the end of the text that may still grow into
    a stop string; so a stream never shows a stop string that the final text leaves out, and
    a first token with text is sent in the step that made it. Special tokens have no text.
    """

    def __init__(self, tokenizer: Tokenizer, stop: tuple[str, ...] = ()) -> None:
        self._bytes = tokenizer.token_bytes
        if self._bytes is None:
            self._backend, self._stream = tokenizer.backend, tokenizer.decode_stream()
        else:
            self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self.stop = stop
        self._longest = max(map(len, stop), default=0)
        self.text = ""
        self._released = 0
        self._stopped = False

    def push(self, token_id: int, check_stop: bool = True) -> bool:
        """Add a token; True when a stop string appeared (the text is cut where it begins)."""
        if self._bytes is None:
            piece = self._stream.step(self._backend, token_id)
        else:
            piece = self._utf8.decode(self._bytes[token_id]) if token_id < len(self._bytes) else ""
        if not piece:
            return False
        start = max(self._released, len(self.text) - self._longest + 1)
        self.text += piece
        if not (check_stop and self.stop):
            return False
        hits = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
        if hits:
            self.text = self.text[: min(hits)]
            self._stopped = True
            return True
        return False

    def release(self, final: bool = False) -> str:
        """The text not sent yet that is safe to send: all of it once the sequence is over."""
        if final and self._bytes is not None and not self._stopped:
            self.text += self._utf8.decode(b"", final=True)
        end = len(self.text) if final else len(self.text) - self._may_start_stop()
        out = self.text[self._released : end] if end > self._released else ""
        self._released = max(self._released, end)
        return out

    def _may_start_stop(self) -> int:
        """How many characters at the end of the text are the beginning of a stop string."""
        tail = self.text[self._released :]
        return max((k for s in self.stop for k in range(min(len(s) - 1, len(tail)), 0, -1)
                    if tail.endswith(s[:k])), default=0)
