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
    # "FILE:ARG" passes ARG to FILE's get_config (ml_collections' config_flags).
    if path is not None and not os.path.isfile(path.split(":", 1)[0]):
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


def run_main(entry, argv=()):
    """Runs an entry point in THIS process as `python -m ENTRY ARGV` (a module name, e.g.
    "tf_gan_scale.main") or `python ENTRY ARGV` (a script path, e.g. "tools/sample.py")
    would, through its own `cli.run` and absl's `app.run`; returns the exit status.

    Why: a Python process that imports TensorFlow costs ~5 CPU-seconds before it does
    anything, and most command-line cases (bad input: one line, exit 2) do nothing else.
    The binary and the tools define flags of the same names in absl's one global
    FlagValues, so the entry point's flags exist for this call only: defined by running
    its file afresh, parsed from `argv` alone (every other flag back at its default), and
    removed afterwards. An exception that escapes main is printed as Python prints it
    (a traceback on stderr) and returns 1, as the process would exit. Not thread-safe
    (flags, sys.argv): one call at a time.
    """
    from absl import app  # Its help flags are defined once per process: keep them.
    app.define_help_flags()
    before = set(flags.FLAGS)
    saved_argv = sys.argv
    sys.argv = [entry, *map(str, argv)]
    flags.FLAGS.unparse_flags()
    try:
        if entry.endswith(".py"):
            runpy.run_path(entry, run_name="__main__")
        else:
            runpy.run_module(entry, run_name="__main__", alter_sys=True)
        return 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)  # sys.exit("message"): Python prints it, exits 1.
        return 1
    except Exception:  # noqa: BLE001 - what an uncaught exception does to the process.
        import traceback
        traceback.print_exc()
        return 1
    finally:
        sys.argv = saved_argv
        for name in set(flags.FLAGS) - before:
            delattr(flags.FLAGS, name)
        flags.FLAGS.unparse_flags()
