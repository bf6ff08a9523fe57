"""The exception types for what a user can fix.

A `FeaturelabError` carries a one-line message that names the field, the value and what is
allowed. The CLI prints it as ``featurelab: error: <message>`` and exits with its `exit_code` (2);
it never shows a stack trace for these. A `WriteError` is the operating system refusing a write (a
full disk, no permission, a read-only file system, too many open files): one line naming the path,
the cause and the fix.
"""

from __future__ import annotations


class FeaturelabError(ValueError):
    """A bad argument, config value, path or shape, explained in one line."""

    exit_code = 2


class WriteError(FeaturelabError):
    """``cannot write 'PATH': CAUSE; REMEDY[, then NEXT]``: the operating system refused to write `path`.

    `remedy` removes the cause (free space, give permission, ...); `next_step` says how to carry on
    afterwards (``then(...)``). `exit_code` is 2 before a run has started, 1 for a run already started.
    """

    def __init__(self, path: str, cause: str, remedy: str, next_step: str = "", exit_code: int = 2):
        self.path, self.cause, self.remedy, self.next_step, self.exit_code = path, cause, remedy, next_step, exit_code
        super().__init__(f"cannot write '{path}': {cause}; {remedy}" + (f", then {next_step}" if next_step else ""))

    def then(self, next_step: str, exit_code: int = 2) -> WriteError:
        """The same error with how to carry on once its cause is gone."""
        return WriteError(self.path, self.cause, self.remedy, next_step, exit_code)

    def __reduce__(self):  # crosses process boundaries (sweep workers) intact
        return type(self), (self.path, self.cause, self.remedy, self.next_step, self.exit_code)
