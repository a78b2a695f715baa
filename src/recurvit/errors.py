"""Errors a user can cause. The CLI turns them into one line on stderr and exit code 2."""


class UserError(Exception):
    """A problem with the user's input (config value, data, checkpoint): message names the fix."""
