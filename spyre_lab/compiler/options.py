"""CompileOptions: every switch a learner can flip, each a real code path with an off position."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from spyre_lab.compiler.rules import FUSION_RULES  # the switchable rows of the rules table

WorkDivisionStrategy = Literal["planned", "naive"]
LXAllocator = Literal["greedy", "first_fit", "best_fit"]
TimingMode = Literal["analytic", "event"]

__all__ = ["FUSION_RULES", "CompileOptions"]


@dataclass(frozen=True)
class CompileOptions:
    """How the compiler treats a graph. Hashable: it is part of the Program cache key."""

    # fusion rules switched on (names from FUSION_RULES); an empty set compiles one kernel per op
    fusion: frozenset[str] = field(default_factory=lambda: frozenset(FUSION_RULES))
    # "planned": cost model over B/M/N/K splits with ring reduction; "naive": split one output dim only
    work_division: WorkDivisionStrategy = "planned"
    # per-kernel LX allocation strategy
    lx_allocator: LXAllocator = "greedy"
    # keep two copies of each streamed tile buffer so loads run ahead of compute
    double_buffer: bool = True
    # place K-split partners next to each other on the ring (psum hops m*n -> 1)
    k_fast_placement: bool = True
    # let a split leave its last slice short when no even split fits (a prime vocabulary of 769 sticks);
    # off: torch-spyre's rule, splits divide their dim evenly (some shapes then get no tile plan)
    uneven_splits: bool = True
    # scratchpad (LX) planning of a fused chain, torch-spyre's steps; off, what a step covers goes through DRAM:
    # reduction results (row max, row sum) pinned in LX
    lx_pin_reductions: bool = True
    # pointwise intermediates kept in LX, exp/sub/add/rsqrt written into their input's slot
    lx_in_place: bool = True
    # an input several ops read (softmax's x, for max and sub) loaded into LX once, not once per reader
    lx_clone_inputs: bool = True
    # timing mode used when a Program's kernels are simulated
    timing: TimingMode = "analytic"
    # max unique DRAM tensors one fused kernel may reference (the SuperDSC bundle limit)
    max_bundle_tensors: int = 6

    def __post_init__(self) -> None:
        if isinstance(self.fusion, str) or not isinstance(self.fusion, (set, frozenset, list, tuple)):
            raise TypeError(f"fusion must be a set of rule names from {list(FUSION_RULES)}, got {self.fusion!r}")
        for name in ("double_buffer", "k_fast_placement", "uneven_splits", "lx_pin_reductions", "lx_in_place",
                     "lx_clone_inputs"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if isinstance(self.max_bundle_tensors, bool) or not isinstance(self.max_bundle_tensors, int):
            raise TypeError(f"max_bundle_tensors must be an int (at least 2), got {self.max_bundle_tensors!r}")
        unknown = set(self.fusion) - set(FUSION_RULES)
        if unknown:
            raise ValueError(f"unknown fusion rule(s) {sorted(unknown)}; rules are {list(FUSION_RULES)}")
        if self.work_division not in ("planned", "naive"):
            raise ValueError(f"work_division must be 'planned' or 'naive', got {self.work_division!r}")
        if self.lx_allocator not in ("greedy", "first_fit", "best_fit"):
            raise ValueError(f"lx_allocator must be greedy, first_fit or best_fit, got {self.lx_allocator!r}")
        if self.timing not in ("analytic", "event"):
            raise ValueError(f"timing must be 'analytic' or 'event', got {self.timing!r}")
        if self.max_bundle_tensors < 2:
            raise ValueError(f"max_bundle_tensors must be at least 2, got {self.max_bundle_tensors}")
        object.__setattr__(self, "fusion", frozenset(self.fusion))

    def replace(self, **changes: object) -> CompileOptions:
        return dataclasses.replace(self, **changes)

    def without(self, *rules: str) -> CompileOptions:
        """These options with some fusion rules switched off: ``opts.without("softmax")``."""
        return self.replace(fusion=self.fusion - set(rules))
