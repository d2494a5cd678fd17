"""Warnings that point at the user's line: the first stack frame outside torch and spyre_lab.

A warning raised deep in the stack (an eager op reaching the CPU fallback through the dispatcher, a
graph node lowered to a host op while Dynamo compiles) would otherwise name a torch internal such as
``torch/utils/_device.py`` or a spyre_lab module: true, but not where the learner can change anything.
``warn_at_user_line`` walks out of torch and spyre_lab and files the warning under the first frame it
finds, so the usual "once per location" filters, ``pytest.warns`` and IDE links all see the user's line.
It sits on the ground floor (layer 0, below the device model), so every layer that warns this way (the compiler's
lowering, the runtime's fallbacks and dtype policy, the engine's tokenizer) can use it.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from pathlib import Path
from types import FrameType

import torch


def _folders(*paths: Path) -> tuple[str, ...]:
    return tuple({f"{p}/" for path in paths for p in (path, path.resolve())})


_PACKAGE = Path(__file__).parent
LIBRARY_DIRS = _folders(Path(torch.__file__).parent, _PACKAGE)
"""Frames in these folders are library code: never the line a warning should name."""
GENERATED_CODE = ("<eval_with_key>",)
"""FX's generated ``forward`` of a GraphModule (a compiled graph's pieces): code nobody wrote, never the user's line."""
DRIVER_DIRS = _folders(Path(torch.__file__).parent, _PACKAGE / "runtime", _PACKAGE / "compiler")
"""torch and the device driver itself: frames between an op's caller and the code that reports on it."""


def is_library_frame(frame: FrameType) -> bool:
    filename = frame.f_code.co_filename
    return (filename.startswith(LIBRARY_DIRS) or filename.startswith(GENERATED_CODE)
            or (filename.startswith("<frozen ") and "importlib" in filename))


def user_frame(skip: int = 1) -> FrameType | None:
    """The innermost frame outside torch and spyre_lab (``skip`` frames above this call), or None."""
    frame = sys._getframe(skip)
    while frame is not None and is_library_frame(frame):
        frame = frame.f_back
    return frame


def caller_frame(skip: int = 1) -> FrameType | None:
    """The innermost frame outside torch and the driver (``skip`` frames above this call): the line that
    called the torch op, which may be spyre_lab's own (an engine layer) when the user's line is further out."""
    frame = sys._getframe(skip)
    while frame is not None and frame.f_code.co_filename.startswith(DRIVER_DIRS):
        frame = frame.f_back
    return frame


def where(frame: FrameType | None) -> str:
    """``file:line`` of a frame, relative to the working folder when under it."""
    if frame is None:
        return "?"
    filename = frame.f_code.co_filename
    with contextlib.suppress(ValueError):
        filename = str(Path(filename).resolve().relative_to(Path.cwd()))
    return f"{filename}:{frame.f_lineno}"


def warn_at_user_line(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn`` filed under the user's line instead of the frame that called it."""
    frame = user_frame(2)
    if frame is None:  # the whole stack is library code (a spyre_lab entry point): warn where we are
        warnings.warn(message, category, stacklevel=2)
        return
    module_globals = frame.f_globals
    warnings.warn_explicit(
        message, category, frame.f_code.co_filename, frame.f_lineno,
        module=module_globals.get("__name__", "<unknown>"),
        registry=module_globals.setdefault("__warningregistry__", {}),
    )  # no module_globals: linecache reads the line from the file (a -c/REPL loader cannot serve it)
