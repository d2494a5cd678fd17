"""An llm-d-style router: endpoint picker (:mod:`.scheduler`), its config (:mod:`.config`), the proxy (:mod:`.app`)."""

from spyre_lab.serving.router.app import SERVED_HEADER, Router
from spyre_lab.serving.router.config import POLICIES, build_profile, load_config
from spyre_lab.serving.router.run import RouterThread

__all__ = ["POLICIES", "SERVED_HEADER", "Router", "RouterThread", "build_profile", "load_config"]
