"""User-facing errors: one line, naming the bad value and the valid choices."""

import numbers


class ConfigError(ValueError):
    """Bad user input (flag, config value, data path, checkpoint).

    Binaries print `str(error)` on one line and exit with status 2.
    """


def is_int(value):
    """An integer that is not a bool (True would pass as 1)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value):
    """A real number that is not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def choose(kind, name, table):
    """Looks `name` up in `table` (a dict); unknown names raise ConfigError.

    Example: `choose("loss", "hinj", LOSSES)` raises
    `ConfigError("unknown loss 'hinj'; valid: hinge, least_squares, ...")`.
    """
    try:
        return table[name]
    except (KeyError, TypeError):
        valid = ", ".join(sorted(table))
        raise ConfigError(f"unknown {kind} {name!r}; valid: {valid}") from None


def named_ints(flag, spec, names, kind, value, form):
    """Parses a flag of the form "name:int,name:int": {name: int}, each name one of
    `names`, at most once (names left out are absent). A bad part raises ConfigError
    naming it and the valid `form`; `kind` and `value` word the message ("axis",
    "size": "--mesh='batch:two': size 'two' of axis 'batch' is not an integer; ...")."""
    out = {}
    for part in str(spec).split(","):
        name, sep, text = part.strip().partition(":")
        if not sep or name not in names or name in out:
            why = (f"repeated {kind}" if name in out else
                   f"unknown {kind} {name!r}" if sep else f"no {value} in {part.strip()!r}")
            raise ConfigError(f"{flag}={spec!r}: {why}; {form}")
        try:
            out[name] = int(text)
        except ValueError:
            raise ConfigError(f"{flag}={spec!r}: {value} {text!r} of {kind} {name!r} is "
                              f"not an integer; {form}") from None
    return out


class NonFiniteError(RuntimeError):
    """Training produced a NaN or inf global loss or gradient (outside mixed-float16 loss
    scaling, which skips such steps). Raised before the step's callbacks run, so no
    checkpoint holds its weights. Binaries print one line and exit with status 1."""


class UnevenBatchError(ConfigError):
    """A batch did not split evenly over the replicas: each replica would divide its
    losses by a wrong global batch size. Raised before the step when the replicas of one
    worker disagree, else right after it, before any callback (nothing of it is saved)."""


class CheckpointError(RuntimeError):
    """A checkpoint just written cannot be read back (a full disk, a short write on
    shared storage): training stops before the checkpoint is recorded as the latest or
    older ones are removed. Binaries print one line and exit with status 1."""
