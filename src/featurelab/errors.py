"""The one exception type for a user's mistake.

A `FeaturelabError` carries a one-line message that names the field, the value and what is
allowed. The CLI prints it as ``featurelab: error: <message>`` and exits with status 2; it never
shows a stack trace for these.
"""


class FeaturelabError(ValueError):
    """A bad argument, config value, path or shape, explained in one line."""
