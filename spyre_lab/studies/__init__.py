"""spyre_lab.studies: the published Spyre results reproduced on the model, each claim an on/off ablation.

``reproduce()`` runs everything and returns the JSON-ready dict ``spyre-lab reproduce --json`` prints;
``to_markdown`` renders ``docs/reproduce.md``. The pieces: ``granite8b`` (the 8B-shaped engine step on
meta weights), ``claims`` (one ablation per published figure), ``kernels`` (kernel-level measurements),
``retime`` (a recorded step re-timed under other host costs), ``sweeps`` (robustness of each claim) and
``sweep_runner`` (``sweep(configs, study)``: any study across device configurations on Dask, cached).

Only ``reproduce``'s own module loads with the package: it is light (the studies it runs load when it runs
them), so a cached ``spyre-lab reproduce`` reads its result without loading the compiler or the engine. The
other names load their study module on first use.
"""

from spyre_lab.studies.reproduce import SCHEMA, reproduce, to_markdown, to_text

# ``reproduce`` is bound here, eagerly: were it lazy, importing the submodule ``spyre_lab.studies.reproduce``
# would set the package's ``reproduce`` to that module and ``from spyre_lab.studies import reproduce`` would
# hand back the module instead of the function.
_LAZY = {
    "Claim": "spyre_lab.studies.claims",
    "GRANITE_3_3_8B": "spyre_lab.studies.granite8b",
    "StepConfig": "spyre_lab.studies.granite8b",
    "StepTiming": "spyre_lab.studies.granite8b",
    "time_steps": "spyre_lab.studies.granite8b",
    "sweep": "spyre_lab.studies.sweep_runner",
}

__all__ = ["GRANITE_3_3_8B", "SCHEMA", "Claim", "StepConfig", "StepTiming", "reproduce", "sweep", "time_steps",
           "to_markdown", "to_text"]


def __getattr__(name: str) -> object:
    """A study's public name loads its module on first use (the compiler and engine come with it)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'spyre_lab.studies' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value   # later look-ups skip this hook
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
