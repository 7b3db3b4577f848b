"""Shared command-line plumbing for the binary and tools: one-line errors, exit code 2."""

import os
import runpy
import sys

from absl import app, flags

from tf_gan_scale import errors


def fail(message):
    """Prints `error: MESSAGE` on one line to stderr and exits with status 2 (bad input)."""
    print(f"error: {' '.join(str(message).split())}", file=sys.stderr)
    sys.exit(2)


_BAD_CONFIG = (flags.Error, KeyError, AttributeError, TypeError, ValueError, OSError,
               SyntaxError, ImportError)


def _config_paths(argv):
    """Every --config file named on the command line, in order (also in a command after
    `--` that a tool such as launch_local runs: it fails here, before any worker starts)."""
    paths = []
    for i, arg in enumerate(argv):
        if arg.startswith("--config="):
            paths.append(arg.split("=", 1)[1])
        elif arg == "--config" and i + 1 < len(argv):
            paths.append(argv[i + 1])
    return paths


def _config_path(argv):
    """The --config file named on the command line (None if none)."""
    paths = _config_paths(argv)
    return paths[-1] if paths else None


def _unknown_override(argv):
    """For a `--config.a.b=v` naming no key: "unknown config key 'a.b'; valid: ..."."""
    path = _config_path(argv)
    try:
        config = runpy.run_path(path)["get_config"]()
    except Exception:  # The config itself is broken: let the original error speak.
        return None
    for arg in argv:
        if not arg.startswith("--config."):
            continue
        node, keys = config, arg[len("--config."):].split("=", 1)[0].split(".")
        for depth, key in enumerate(keys):
            if not hasattr(node, "keys") or key not in node:
                valid = ", ".join(sorted(node.keys())) if hasattr(node, "keys") else "none"
                where = ".".join(keys[:depth]) or "config"
                return (f"unknown config key {'.'.join(keys)!r}; valid keys of {where}: "
                        f"{valid}")
            node = node[key]
    return None


def last_override_wins(argv):
    """argv with only the last `--config.KEY=VALUE` of each KEY (at its place).

    absl keeps the last value of a repeated scalar override, but ml_collections
    concatenates a repeated tuple override ((32,16,8) then (16,8,4) gave six widths):
    the last one wins for every key.
    """
    last = {}
    for i, arg in enumerate(argv):
        if arg.startswith("--config.") and "=" in arg:
            last[arg.split("=", 1)[0]] = i
    return [arg for i, arg in enumerate(argv)
            if not (arg.startswith("--config.") and "=" in arg)
            or last[arg.split("=", 1)[0]] == i]


def _parse_flags(argv):
    # absl would print the usage text and exit 1; a bad flag, config file or config
    # override (a typo under lock_config) is bad input: one line, exit 2.
    paths = _config_paths(argv)
    if len(paths) > 1:
        # absl would say "The flag 'config.train.num_steps' is defined twice".
        fail(f"--config given {len(paths)} times ({', '.join(map(repr, paths))}); pass one "
             f"config file and change its keys with --config.KEY=VALUE")
    argv = last_override_wins(argv)
    path = _config_path(argv)
    if path is not None and not os.path.isfile(path):
        fail(f"cannot load --config={path!r}: no such file")
    try:
        return flags.FLAGS(argv)
    except _BAD_CONFIG as e:
        fail(_unknown_override(argv) or e)


def config_value(holder):
    """The value of a DEFINE_config_file flag; loading errors become ConfigError."""
    try:
        value = holder.value
        if value is not None:
            value.keys()  # A config that failed to load raises on first attribute access.
        return value
    except _BAD_CONFIG as e:
        first = str(e).strip().replace("\n", " ")
        raise errors.ConfigError(f"cannot load --config: {first}") from None


def run(main, *, positional=False):
    """app.run(main) where main's ConfigError and bad flags become one line + exit 2.

    positional: pass the arguments left after the flags (e.g. a command after `--`) to
    main instead of rejecting them.
    """

    def guarded(argv):
        if len(argv) > 1 and not positional:
            fail(f"unexpected arguments: {' '.join(argv[1:])}")
        try:
            return main(argv)
        except errors.ConfigError as e:
            fail(e)

    app.run(guarded, flags_parser=_parse_flags)
