"""Tokenizers: a character-level one (for the shipped tiny model) and a thin wrapper for Hugging Face files.

The character tokenizer is deliberately tiny: every character is one token, so a learner can read
token ids back by eye. It is stored as a tokenizer.json with `"type": "spyre_lab.char"`. A character
outside its vocabulary becomes <unk>, with one warning per `encode` call naming every such character,
and `decode(ids, skip_special_tokens=False)` shows what the model was given, <unk>s included.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

from spyre_lab.engine.errors import ModelLoadError
from spyre_lab.user_line import warn_at_user_line

CHAR_TOKENIZER_TYPE = "spyre_lab.char"
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")


class UnknownCharactersWarning(UserWarning):
    """The character tokenizer met characters it has no token for; the model sees <unk> in their place."""


class Tokenizer(Protocol):
    bos_token_id: int | None
    eos_token_id: int | None

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str: ...


class CharTokenizer:
    """One token per character; ids 0-3 are <pad>, <bos>, <eos>, <unk>. `encode` prepends <bos>.

    With `lowercase=True` text is lowercased before encoding (the vocabulary has no capitals).
    """

    pad_token_id, bos_token_id, eos_token_id, unk_token_id = 0, 1, 2, 3
    #: ``decode(a + b) == decode(a) + decode(b)``: a request's text can grow one token at a time (`detokenizer`)
    decodes_token_by_token = True

    def __init__(self, chars: str, lowercase: bool = False) -> None:
        if len(set(chars)) != len(chars):
            raise ValueError("CharTokenizer characters must be unique")
        self.chars = chars
        self.lowercase = lowercase
        self._id_of = {c: i + len(SPECIAL_TOKENS) for i, c in enumerate(chars)}

    @property
    def vocab_size(self) -> int:
        return len(SPECIAL_TOKENS) + len(self.chars)

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        """Token ids of ``text`` (after lowercasing, if this tokenizer lowercases); characters it has no token
        for become <unk>, named in one UnknownCharactersWarning per call."""
        seen = text.lower() if self.lowercase else text
        ids = [self._id_of.get(c, self.unk_token_id) for c in seen]
        unknown = sorted({c for c in seen if c not in self._id_of})
        if unknown:
            count = sum(1 for c in seen if c not in self._id_of)
            warn_at_user_line(
                f"the character tokenizer has no token for {', '.join(map(repr, unknown))} ({count} of {len(seen)} "
                f"characters of {text!r}); the model sees <unk> there: {self.decode(ids, False)!r}. Its "
                f"characters are {self.chars!r}{' (text is lowercased first)' if self.lowercase else ''}.",
                UnknownCharactersWarning,
            )
        return [self.bos_token_id, *ids] if add_bos else ids

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        """The text of ``token_ids``; with ``skip_special_tokens=False`` specials show as <bos>, <unk>, ..."""
        first = len(SPECIAL_TOKENS)
        if skip_special_tokens:
            return "".join(self.chars[i - first] for i in token_ids if first <= i < self.vocab_size)
        return "".join(self.chars[i - first] if first <= i < self.vocab_size
                       else SPECIAL_TOKENS[i] if 0 <= i < first else f"<id {i}>" for i in token_ids)

    def save(self, path: str | Path) -> None:
        document = {
            "type": CHAR_TOKENIZER_TYPE,
            "special_tokens": list(SPECIAL_TOKENS),
            "chars": self.chars,
            "lowercase": self.lowercase,
        }
        Path(path).write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n")

    @classmethod
    def from_dict(cls, document: dict) -> CharTokenizer:
        if list(document.get("special_tokens", [])) != list(SPECIAL_TOKENS):
            raise ValueError(f"char tokenizer special tokens must be {list(SPECIAL_TOKENS)}")
        return cls(document["chars"], lowercase=document.get("lowercase", False))


class HFTokenizer:
    """A Hugging Face `tokenizers` tokenizer.json, used as is (no special-token handling beyond its own)."""

    def __init__(self, path: Path, bos_token_id: int | None, eos_token_id: int | None) -> None:
        from tokenizers import Tokenizer as _Tokenizer

        self._tokenizer = _Tokenizer.from_file(str(path))
        self.bos_token_id, self.eos_token_id = bos_token_id, eos_token_id

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text).ids

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)


def load_tokenizer(folder: Path, bos_token_id: int | None = None, eos_token_id: int | None = None) -> Tokenizer | None:
    """The tokenizer in `folder`, or None when it has none (then prompts must be token ids)."""
    path = folder / "tokenizer.json"
    if not path.exists():
        return None
    try:
        document = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"{path} is not valid JSON ({e}); save the tokenizer again (save_pretrained) or fix the "
                             "file") from e
    if not isinstance(document, dict):
        raise ModelLoadError(f"{path} must hold a JSON object (a tokenizer), got a {type(document).__name__}")
    if document.get("type") == CHAR_TOKENIZER_TYPE:
        try:
            return CharTokenizer.from_dict(document)
        except KeyError as e:
            raise ModelLoadError(f"{path}: a {CHAR_TOKENIZER_TYPE} tokenizer needs the key {e.args[0]!r}") from e
        except (TypeError, ValueError) as e:
            raise ModelLoadError(f"{path}: {e}") from e
    try:
        return HFTokenizer(path, bos_token_id, eos_token_id)
    except ImportError:
        return None
    except Exception as e:  # the tokenizers library raises its own exception types for a malformed file
        raise ModelLoadError(f"{path} cannot be read as a Hugging Face tokenizer ({e}); save the tokenizer again "
                             "(save_pretrained) or fix the file") from e
