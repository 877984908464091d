"""The spatial IR: ids, nodes, ops, JSON and a text printer. Imports nothing else of spatialc."""

from .ids import *  # noqa: F403
from .nodes import *  # noqa: F403
from .ops import *  # noqa: F403
