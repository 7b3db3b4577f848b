""".keras files written once: a new name ending in .keras, never overwritten, never left
half-written (a temporary file in the same directory, linked into place)."""

import os
import shutil
import tempfile

from tf_gan_scale import errors


def check_new(path):
    """Raises ConfigError unless `path` is a new file name ending in .keras."""
    if not str(path or "").endswith(".keras"):
        raise errors.ConfigError(f"--output must be a file name ending in .keras; "
                                 f"Received: {path!r}")
    if os.path.lexists(path):
        raise errors.ConfigError(f"--output {path!r} already exists (never overwritten); "
                                 f"choose a new file name")


def save_new(model, output):
    """Writes `model` to the new file `output` (.keras): saved to a temporary file in the
    same directory, then linked into place, which fails rather than overwrite a file
    written meanwhile; nothing is left behind on failure."""
    check_new(output)
    target = os.path.abspath(output)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.tmp-",
                           dir=os.path.dirname(target))
    try:
        saved = os.path.join(tmp, "model.keras")
        model.save(saved)
        try:
            os.link(saved, target)  # Atomic, and never replaces a file written meanwhile.
        except FileExistsError:
            raise errors.ConfigError(f"--output {output!r} already exists (never "
                                     f"overwritten); choose a new file name") from None
        except OSError:  # A file system without hard links.
            check_new(output)
            os.rename(saved, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
