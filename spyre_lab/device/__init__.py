"""The hardware model: configuration, stick layouts, memory, tile ISA, simulator and traces."""

from spyre_lab.device.config import SPYRE, SpyreConfig, get_config
from spyre_lab.device.isa import CoreProgram, Kernel, OpKind, TileOp
from spyre_lab.device.trace import Trace, TraceEvent

__all__ = ["SPYRE", "CoreProgram", "Kernel", "OpKind", "SpyreConfig", "TileOp", "Trace", "TraceEvent", "get_config"]
