"""Errors a user can cause. The CLI prints their message on one line and exits with code 2."""


class XrlError(Exception):
    """Base class: the message says what is wrong and, where possible, what to do."""


class ModelLoadError(XrlError):
    """The model file is missing, unreadable, or not a model xrl understands."""


class DynamicShapeError(XrlError):
    """A graph input has a dimension that is not a fixed integer."""


class InvalidGraphError(XrlError):
    """The graph breaks an IR invariant: a cycle, an undefined value, shapes that disagree."""


class ShapeInferenceError(InvalidGraphError):
    """An operator's inputs do not fit its definition."""


class UnknownGraphError(XrlError):
    """A built-in graph name that does not exist."""


class OutputPathError(XrlError):
    """An output path that would overwrite the input or cannot be written."""


class VerificationError(XrlError):
    """An optimised graph does not compute what the original computes."""


class ConfigError(XrlError):
    """A name or option xrl does not know (a cost model, a device, a setting): the message lists the valid ones."""


class XrlWarning(UserWarning):
    """Something xrl can go on with but the user should know (an op it does not understand): the CLI
    prints it as one line, `xrl: warning: ...`, on stderr."""
