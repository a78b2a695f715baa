"""Errors a user can cause. The CLI turns them into one line on stderr and exit code 2."""


class UserError(ValueError):
    """A problem with the user's input (config value, data, checkpoint): message names the fix.

    A ValueError, so that a Python caller of the API (``create_model("bvit_tiny", depth=3)``) can
    catch what Python users expect; the command line prints its message as one line, exit code 2."""
