class LabError(Exception):
    """A lab operation that cannot go on. The message is one line: what is wrong and the fix."""
