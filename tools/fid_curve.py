"""FID against training wall time, several runs in one PNG (docs/quality.md's curves).

    for c in DIR/checkpoints/ckpt-*.index; do python tools/evaluate.py --workdir=DIR \
        --checkpoint=${c%.index} ... >> DIR/fid.jsonl; done
    python tools/fid_curve.py --output=curve.png \
        --run="DCGAN tutorial=DIR1/fid.jsonl@0.213" --run="R3GAN=DIR2/fid.jsonl@0.286"

Each --run is LABEL=FILE@SECONDS_PER_STEP: FILE holds tools/evaluate.py's JSON lines (one
per checkpoint, "step" and "fid"), and SECONDS_PER_STEP (a benchmark's step time, e.g.
tools/benchmark.py measured side by side for every recipe) turns steps into minutes of
training: x = step * SECONDS_PER_STEP / 60, so recipes compare at equal wall time on one
machine without the noise of the runs' own clocks. Runs with the same LABEL (seeds) share
a colour; the y axis is logarithmic. Prints one JSON line: {"output", "runs": [{"label",
"points"}]}. Bad input (a --run not LABEL=FILE@SECONDS, a missing file, a line without
step and fid): one `error:` line, exit 2.
"""

import json
import os
import sys

from absl import flags

from tf_gan_scale import cli, errors

flags.DEFINE_multi_string("run", [], "LABEL=FILE.jsonl@SECONDS_PER_STEP (repeatable).")
flags.DEFINE_string("output", None, "The PNG to write (replaced atomically).")
flags.DEFINE_string("title", "", "The figure's title.")
FLAGS = flags.FLAGS


def parse(spec):
    """(label, path, seconds per step) of one --run."""
    label, eq, rest = spec.partition("=")
    path, at, seconds = rest.rpartition("@")
    try:
        value = float(seconds)
    except ValueError:
        value = -1.0
    if not eq or not at or not label or not path or value <= 0:
        raise errors.ConfigError(f"--run must be LABEL=FILE@SECONDS_PER_STEP (seconds > 0); "
                                 f"Received: {spec!r}")
    return label, path, value


def points(path):
    """[(step, fid)] of an evaluate.py JSON-lines file, by step."""
    if not os.path.isfile(path):
        raise errors.ConfigError(f"--run file not found: {path!r}")
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                out.append((int(record["step"]), float(record["fid"])))
            except (ValueError, KeyError, TypeError):
                raise errors.ConfigError(f"{path}:{n}: not an evaluate.py line with step "
                                         f"and fid: {line.strip()[:80]!r}") from None
    return sorted(out)


def main(argv):
    del argv
    if not FLAGS.run or not FLAGS.output or not FLAGS.output.endswith(".png"):
        raise errors.ConfigError("--run (at least one) and --output=FILE.png are required")
    runs = [(label, seconds, points(path)) for label, path, seconds in map(parse, FLAGS.run)]
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from tf_gan_scale.artifacts import plot
    fig = Figure(figsize=(7, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    colours = {}
    for label, seconds, pts in runs:
        first = label not in colours
        colour = colours.setdefault(label, f"C{len(colours)}")
        ax.plot([s * seconds / 60 for s, _ in pts], [f for _, f in pts], marker=".",
                color=colour, label=label if first else None)
    ax.set_yscale("log")
    ax.set_xlabel("training wall time, minutes (steps x benchmark seconds per step)")
    ax.set_ylabel("FID (classifier features)")
    ax.set_title(FLAGS.title, fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    plot.write_png(fig, FLAGS.output)
    print(json.dumps({"output": FLAGS.output,
                      "runs": [{"label": label, "points": pts} for label, _, pts in runs]}))
    sys.stdout.flush()


if __name__ == "__main__":
    cli.run(main)
