"""Incremental detokenization: a request's output text and stop-string check, updated per token, not redone.

The text a request reports after each step is its output tokens decoded, and a stop string ends it where it
first appears. Decoding all the output again and searching all of it every step costs O(n) a step, O(n^2) a
request. Both are done incrementally here, with results equal to the full decode and search:

* Text: a tokenizer whose decode is a concatenation of per-token pieces (``decode(a + b) == decode(a) +
  decode(b)``; it says so with ``decodes_token_by_token = True``, as the character tokenizer does) gets the new
  token's piece appended. Any other tokenizer decodes the whole output again: in a byte-level BPE a character
  can span tokens, so a later token can change how earlier bytes decode.
* Stop strings: the text searched at the previous step held none of them (or the request would have stopped).
  When the new text still starts with it, an occurrence must end in the new characters, so each stop string is
  searched from ``len(stop) - 1`` characters before them. When earlier text changed, or the stop strings did,
  the whole text is searched again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spyre_lab.engine.sequence import Sequence

if TYPE_CHECKING:
    from spyre_lab.engine.tokenizer import Tokenizer


def update_text(tokenizer: Tokenizer, seq: Sequence) -> None:
    """Set ``seq.output_text`` to its output tokens decoded (appending the last token's piece when it can)."""
    state, ids = seq.decode_state, seq.output_token_ids
    previous = seq.output_text
    if state.tokens == len(ids) - 1 and getattr(tokenizer, "decodes_token_by_token", False):
        seq.output_text = previous + tokenizer.decode(ids[-1:])
    else:
        seq.output_text = text = tokenizer.decode(ids)
        if not text.startswith(previous[:state.searched]):
            state.searched = 0                           # earlier text changed: search all of it again
    state.tokens = len(ids)


def find_stop(seq: Sequence) -> tuple[int, str] | None:
    """Where the first of the sequence's stop strings (in their order) occurs in its text, and which one; None when
    none does. Only text that could hold an occurrence not seen at the previous search is searched."""
    state, text, stops = seq.decode_state, seq.output_text, seq.sampling_params.stop
    searched = state.searched if state.stops == stops else 0      # text[:searched] holds none of ``stops``
    for stop in stops:
        cut = text.find(stop, max(0, searched - len(stop) + 1))
        if cut >= 0:
            return cut, stop
    state.searched, state.stops = len(text), list(stops)
    return None
