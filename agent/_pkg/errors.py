"""Errors a user can act on, as opposed to bugs.

The CLI prints a UserError as one line on stderr and exits 2; anything else is a bug and keeps its traceback.
"""


class UserError(Exception):
    """Bad input or a machine state the user can fix; the message says how."""

    exit_code = 2


class RequirementError(UserError):
    """A missing tool, package or kernel capability; the message names the package or capability."""


class Interrupted(UserError):
    """Ctrl-C or SIGTERM during a run; teardown has run when this reaches the CLI."""

    exit_code = 130
