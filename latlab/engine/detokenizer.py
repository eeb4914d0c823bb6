"""Incremental detokenization with stop strings, for one sequence."""

from __future__ import annotations

from latlab.tokenizer import Tokenizer


class Detokenizer:
    """Turns a sequence's tokens into text as they come.

    Text is released only when it can no longer turn out to be the start of a stop string,
    so a stream never shows a stop string that the final text leaves out. Incomplete UTF-8
    and special tokens produce no text until a later token completes them.
    """

    def __init__(self, tokenizer: Tokenizer, stop: tuple[str, ...] = ()) -> None:
        self._tokenizer = tokenizer.backend
        self._stream = tokenizer.decode_stream()
        self.stop = stop
        self._hold = max(map(len, stop), default=1) - 1
        self.text = ""
        self._released = 0

    def push(self, token_id: int, check_stop: bool = True) -> bool:
        """Add a token; True when a stop string appeared (the text is cut where it begins)."""
        piece = self._stream.step(self._tokenizer, token_id)
        if not piece:
            return False
        start = max(self._released, len(self.text) - self._hold)
        self.text += piece
        if not (check_stop and self.stop):
            return False
        hits = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
        if hits:
            self.text = self.text[: min(hits)]
            return True
        return False

    def release(self, final: bool = False) -> str:
        """The text not sent yet that is safe to send: all of it once the sequence is over."""
        end = len(self.text) if final else max(self._released, len(self.text) - self._hold)
        out = self.text[self._released : end]
        self._released = end
        return out
