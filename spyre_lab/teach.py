"""Predict, then run: the helper every tutorial's reveal cell calls, so a guess is made before the answer is seen.

Why a function and not a print: a prediction teaches only if it is written down first. ``reveal`` refuses to
show the model's answer while the guess is still empty (``None``, which is what a workshop's student copy puts
in every predict cell), and it records each (guess, answer) pair so the notebook tests can prove that no
committed predict cell already holds the answer it reveals.

Conventions shared by every notebook in ``tutorials/`` and ``notebooks/``:

* a **predict cell** starts with the line ``# PREDICT`` and assigns one or more ``guess_<name> = <value>``
  lines; the committed notebook holds a plausible guess that is *not* the answer, the student copy
  (``spyre-lab workshop build``) writes ``guess_<name> = None``;
* its **reveal cell** calls ``reveal("guess_<name>", guess_<name>, actual, unit)`` once per guess.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Number
from typing import Any

PREDICT = "# PREDICT"


class GuessMissing(RuntimeError):
    """A reveal cell ran before its predict cell held a guess."""


@dataclass(frozen=True)
class Revealed:
    """One guess shown beside the model's answer (kept so tests can check no guess was the answer)."""

    name: str
    guess: Any
    actual: Any

    @property
    def matches(self) -> bool:
        """True when the guess is the answer (numbers within 0.5% or 1e-9, anything else by ``==``)."""
        return same_answer(self.guess, self.actual)


_revealed: list[Revealed] = []


def same_answer(guess: Any, actual: Any) -> bool:
    """Whether a guess equals the answer: numbers within 0.5% (or 1e-9 absolute), anything else by ``==``."""
    if isinstance(guess, Number) and isinstance(actual, Number) and not isinstance(guess, bool):
        g, a = float(guess), float(actual)  # type: ignore[arg-type]
        return math.isclose(g, a, rel_tol=5e-3, abs_tol=1e-9)
    try:
        return bool(guess == actual)
    except Exception:  # tensors and arrays compare elementwise; a guess is never one
        return False


def _fmt(value: Any, unit: str) -> str:
    if isinstance(value, bool) or not isinstance(value, Number):
        text = repr(value)
    elif isinstance(value, int) or float(value).is_integer():  # type: ignore[arg-type]
        text = f"{int(value):,}"  # type: ignore[arg-type]
    else:
        text = f"{float(value):,.4g}"  # type: ignore[arg-type]
    return f"{text} {unit}".rstrip()


def reveal(name: str, guess: Any, actual: Any, unit: str = "") -> Revealed:
    """Print ``guess`` beside ``actual``; refuse (:class:`GuessMissing`) while the guess is still ``None``."""
    if guess is None:
        raise GuessMissing(f"{name} is empty: write your prediction into {name} in the cell above (a number is "
                           "fine, a wrong one is fine), run that cell, then run this one. Predicting before you "
                           "look is the point of the exercise.")
    record = Revealed(name, guess, actual)
    _revealed.append(record)
    line = f"your guess: {_fmt(guess, unit)}   the model: {_fmt(actual, unit)}"
    if record.matches:
        line += "   (spot on)"
    elif isinstance(guess, Number) and isinstance(actual, Number) and not isinstance(guess, bool):
        g, a = float(guess), float(actual)  # type: ignore[arg-type]
        if g > 0 and a > 0:
            ratio = a / g
            line += f"   (the answer is {ratio:.2g}x your guess)" if ratio >= 1 else f"   ({1 / ratio:.2g}x lower)"
    print(line)
    return record


def revealed() -> list[Revealed]:
    """Every reveal made in this process, oldest first."""
    return list(_revealed)
