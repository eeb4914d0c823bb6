"""What a service raises besides the load generator's errors."""


class InputError(ValueError):
    """Bad input, named by its option: the command reports it as a usage error."""


class ServiceFailed(RuntimeError):
    """The work could not be done (a server would not start, a probe failed)."""
