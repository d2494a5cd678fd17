"""spyre_lab.studies: the published Spyre results reproduced on the model, each claim an on/off ablation.

``reproduce()`` runs everything and returns the JSON-ready dict ``spyre-lab reproduce --json`` prints;
``to_markdown`` renders ``docs/reproduce.md``. The pieces: ``granite8b`` (the 8B-shaped engine step on
meta weights), ``claims`` (one ablation per published figure), ``kernels`` (kernel-level measurements),
``retime`` (a recorded step re-timed under other host costs), ``sweeps`` (robustness of each claim) and
``sweep_runner`` (``sweep(configs, study)``: any study across device configurations on Dask, cached).
"""

from spyre_lab.studies.claims import Claim
from spyre_lab.studies.granite8b import GRANITE_3_3_8B, StepConfig, StepTiming, time_steps
from spyre_lab.studies.reproduce import SCHEMA, reproduce, to_markdown, to_text
from spyre_lab.studies.sweep_runner import sweep

__all__ = ["GRANITE_3_3_8B", "SCHEMA", "Claim", "StepConfig", "StepTiming", "reproduce", "sweep", "time_steps",
           "to_markdown", "to_text"]
