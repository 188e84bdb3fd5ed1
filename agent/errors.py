"""The agent's name for pathprof.errors (the errors live at the top so analysis needs nothing of the agent)."""
from pathprof.errors import Interrupted, RequirementError, UserError

__all__ = ["Interrupted", "RequirementError", "UserError"]
