"""The hardware model: configuration, stick layouts, memory, tile ISA, simulator and traces."""

from spyre_lab.device.config import SPYRE, SpyreConfig, get_config
from spyre_lab.device.isa import CoreOps, OpKind, TileOp, TileProgram
from spyre_lab.device.trace import Trace, TraceEvent

__all__ = ["SPYRE", "CoreOps", "OpKind", "SpyreConfig", "TileOp", "TileProgram", "Trace", "TraceEvent", "get_config"]
