"""Loss and metric curves of a training run as one PNG, for people who do not run TensorBoard.

    from tf_gan_scale.artifacts import plot
    plot.curves("runs/digits", "curves.png")
    # -> {"output": "curves.png", "steps": [5, 2000],
    #     "series": ["d_loss", "g_loss", "fid [keras:/abs/c.keras, 1000 samples]", ...]}

Inputs (the workdir layout of training/workdir.py):
    WORKDIR/logs/**/events.out.tfevents.*  TensorBoard scalars (callbacks.Summaries: d_loss,
        g_loss, steps_per_sec, images_per_sec, and whatever else training logs, e.g.
        d_grad_norm, g_learning_rate), one value per generator step. Tags of event files in
        a subfolder of logs/ get its path as a prefix ("validation/d_loss").
    WORKDIR/metrics.jsonl (or eval.jsonl, the name training.run writes, when there is no
        metrics.jsonl): one JSON object per line, {"step": int, "extractor": str,
        "num_samples": int, "fid": float, "kid": float, "kid_std": float, "is": float,
        "is_std": float, "precision": float, "recall": float}, any subset of the metrics;
        a metric may also be {"mean": float, "std": float} (what evaluation.evaluate gives).

Panels (2 columns, only those with data):
    losses             every scalar tag whose name ends in "loss", vs generator step
    one per metric     fid; kid and is with a +-std band; precision and recall together;
                       any other numeric key. Numbers from different extractors (or sample
                       counts) are not comparable: each (extractor, num_samples) is its own
                       series, named "METRIC [EXTRACTOR, N samples]"; with one such pair the
                       panel title names it.
    gradient norms     tags containing "grad_norm"
    learning rates     tags containing "learning_rate" (or ending in "_lr")
    throughput         tags ending in "_per_sec" (log scale)
    one per other tag  anything else (eval/<metric> tags are left out when a metrics file
                       is there: they are its numbers without the extractor's name)
"""

import glob
import json
import math
import os
import tempfile

import numpy as np
from absl import logging

from tf_gan_scale import errors

METRICS_FILES = ("metrics.jsonl", "eval.jsonl")  # The first one present is read.
_GROUPS = (  # (title, y label, log scale, tag -> belongs); the first match wins.
    ("losses", "loss", False, lambda t: t.rsplit("/", 1)[-1].endswith("loss")),
    ("gradient norms", "global L2 norm", False, lambda t: "grad_norm" in t),
    ("learning rates", "learning rate", False,
     lambda t: "learning_rate" in t or t.endswith("_lr")),
    ("throughput", "per second (global)", True, lambda t: t.endswith("_per_sec")),
)
_META = ("step", "extractor", "num_samples")
_STD_METRICS = ("kid", "is")


def metrics_path(workdir):
    """WORKDIR/metrics.jsonl, else WORKDIR/eval.jsonl, else None."""
    for name in METRICS_FILES:
        path = os.path.join(workdir, name)
        if os.path.isfile(path):
            return path
    return None


def _event_files(workdir):
    """Event files under WORKDIR/logs, oldest first within each folder: their names,
    events.out.tfevents.<10-digit unix time>.<host>..., sort by time of creation."""
    paths = glob.glob(os.path.join(workdir, "logs", "**", "*tfevents*"), recursive=True)
    return sorted(p for p in paths if os.path.isfile(p))


def read_scalars(workdir):
    """Every scalar summary under WORKDIR/logs: {tag: (steps, values)}.

    steps: int64 [T], strictly increasing generator steps; values: float64 [T]. A step
    written twice (a resumed run logging again) keeps the later value. Image, histogram
    and text summaries are skipped. A truncated or corrupt event file (a killed run) keeps
    the records before the damage, with a warning.
    """
    import tensorflow as tf  # Only to read event files: metrics.jsonl alone needs none.
    logs = os.path.join(workdir, "logs")
    table = {}
    for path in _event_files(workdir):
        prefix = os.path.relpath(os.path.dirname(path), logs).replace(os.sep, "/")
        prefix = "" if prefix == "." else prefix + "/"
        try:
            for record in tf.data.TFRecordDataset(path):
                event = tf.compat.v1.Event.FromString(record.numpy())
                for v in event.summary.value:
                    kind = v.WhichOneof("value")
                    if kind == "simple_value":
                        value = float(v.simple_value)
                    elif kind == "tensor":
                        array = tf.make_ndarray(v.tensor)
                        if array.ndim != 0 or array.dtype.kind not in "fiub":
                            continue
                        value = float(array)
                    else:
                        continue
                    table.setdefault(prefix + v.tag, {})[int(event.step)] = value
        except tf.errors.DataLossError as e:
            logging.warning("%s is damaged; using the events before it: %s", path,
                            " ".join(str(e.message).split()))
    return {tag: (np.array(sorted(by_step), np.int64),
                  np.array([by_step[s] for s in sorted(by_step)], np.float64))
            for tag, by_step in sorted(table.items())}


def read_metrics(workdir):
    """The evaluation scores of WORKDIR/metrics.jsonl (or eval.jsonl), in file order.

    Returns a list of flat dicts {"step": int, "extractor": str, "num_samples": int or
    None, METRIC: float, METRIC_std: float, ...}: a metric given as {"mean", "std"} becomes
    METRIC and METRIC_std; non-numeric keys (e.g. "checkpoint") are dropped. [] if there is
    no such file. Blank lines are skipped; any other line that is not a JSON object with an
    integer "step" raises ConfigError naming the file and line number.
    """
    path = metrics_path(workdir)
    if path is None:
        return []
    records = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}, line {lineno}"
            try:
                raw = json.loads(line)
            except json.JSONDecodeError as e:
                raise errors.ConfigError(f"corrupt {where}: not JSON ({e.msg})") from None
            if not isinstance(raw, dict):
                raise errors.ConfigError(f"corrupt {where}: not a JSON object")
            step = raw.get("step")
            if not errors.is_int(step) or step < 0:
                raise errors.ConfigError(
                    f"corrupt {where}: 'step' must be an integer >= 0; Received: {step!r}")
            n = raw.get("num_samples")
            record = {"step": step, "extractor": str(raw.get("extractor", "unknown extractor")),
                      "num_samples": n if errors.is_int(n)
                      else None}
            for key, value in raw.items():
                if key in _META:
                    continue
                if isinstance(value, dict) and errors.is_real(value.get("mean")):
                    record[key] = float(value["mean"])
                    if errors.is_real(value.get("std")):
                        record[key + "_std"] = float(value["std"])
                elif errors.is_real(value):
                    record[key] = float(value)
            records.append(record)
    return records


def _label(metric, extractor, num_samples):
    n = "" if num_samples is None else f", {num_samples} samples"
    return f"{metric} [{extractor}{n}]"


def _metric_panels(records):
    """[(title, ylabel, log, [(label, steps [T], values [T], std [T] or None)])]."""
    groups = sorted({(r["extractor"], r["num_samples"]) for r in records},
                    key=lambda g: (g[0], -1 if g[1] is None else g[1]))
    names = []
    for r in records:
        names += [k for k in r if k not in _META and not k.endswith("_std") and k not in names]
    order = ["fid", "kid", "is", "precision", "recall"]
    names.sort(key=lambda k: (order.index(k) if k in order else len(order), k))
    panels = []
    for panel in [[k] for k in names if k not in ("precision", "recall")] + [
            [k for k in ("precision", "recall") if k in names]]:
        series, used = [], set()
        for metric in panel:
            for extractor, n in groups:
                by_step = {r["step"]: r for r in records if metric in r
                           and (r["extractor"], r["num_samples"]) == (extractor, n)}
                if not by_step:
                    continue
                steps = sorted(by_step)  # A step scored twice keeps the later score.
                values = [by_step[s][metric] for s in steps]
                std = None
                if metric in _STD_METRICS and all(metric + "_std" in by_step[s] for s in steps):
                    std = np.array([by_step[s][metric + "_std"] for s in steps])
                series.append((_label(metric, extractor, n), np.array(steps),
                               np.array(values), std))
                used.add((extractor, n))
        if not series:
            continue
        title = " and ".join(panel)
        if len(used) == 1:
            extractor, n = used.pop()
            title += " — " + _label("", extractor, n)[2:-1]
        else:
            title += " — different extractors or sample counts: not comparable"
        panels.append((title, " / ".join(panel), False, series))
    return panels


def _scalar_panels(scalars, skip_eval):
    """Panels of the TensorBoard scalars: the _GROUPS, then one per remaining tag."""
    grouped = {title: [] for title, *_ in _GROUPS}
    rest = []
    for tag, (steps, values) in scalars.items():
        if skip_eval and tag.startswith("eval/"):
            continue
        for title, _, _, belongs in _GROUPS:
            if belongs(tag):
                grouped[title].append((tag, steps, values, None))
                break
        else:
            rest.append((tag, tag, False, [(tag, steps, values, None)]))
    panels = [(title, ylabel, log, grouped[title]) for title, ylabel, log, _ in _GROUPS
              if grouped[title]]
    return panels[:1], panels[1:] + rest


def _draw(panels, output):
    """Draws the panels in 2 columns with the Agg canvas (no display) into a PNG, written
    to a temporary file next to `output` and renamed over it."""
    # matplotlib (~0.5 s to import) only when a figure is drawn.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    cols = 1 if len(panels) == 1 else 2
    rows = math.ceil(len(panels) / cols)
    fig = Figure(figsize=(7 * cols, 3.8 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    for i, (title, ylabel, log, series) in enumerate(panels):
        ax = fig.add_subplot(rows, cols, i + 1)
        for j, (label, steps, values, std) in enumerate(series):  # Styles: equal curves
            (line,) = ax.plot(steps, values, marker="." if len(steps) < 30 else None,
                              linestyle=("-", "--", "-.", ":")[j % 4], label=label)
            if std is not None:
                ax.fill_between(steps, values - std, values + std, alpha=0.25,
                                color=line.get_color(), linewidth=0)
        if log and all(np.all(s[2] > 0) for s in series):
            ax.set_yscale("log")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("generator step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    write_png(fig, output)


def write_png(fig, output):
    """Saves the matplotlib figure `fig` as a PNG at `output`, atomically: a temporary
    file beside it, readable as any file the user writes (0644, not mkstemp's 0600),
    renamed over `output`; removed if anything fails."""
    directory = os.path.dirname(os.path.abspath(output))
    fd, tmp = tempfile.mkstemp(prefix=".plot-", suffix=".png", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format="png", dpi=100)
        os.chmod(tmp, 0o644)
        os.replace(tmp, output)
    except BaseException:
        os.unlink(tmp)
        raise


def curves(workdir, output):
    """Draws the loss and metric curves of the run in `workdir` into the PNG `output`.

    Returns {"output": output, "steps": [first, last] (int, over every series plotted),
    "series": [names of the series plotted, panel by panel]}. Overwrites `output`
    atomically. Raises ConfigError (nothing written) if the workdir is missing, there is
    nothing to plot, `output` does not end in .png or its folder does not exist, or a
    metrics line is corrupt.
    """
    if not str(output).lower().endswith(".png"):
        raise errors.ConfigError(f"output must end in .png; Received: {output!r}")
    if os.path.isdir(output) or not os.path.isdir(os.path.dirname(os.path.abspath(output))):
        raise errors.ConfigError(f"cannot write {output!r}: it is a folder or its folder "
                                 f"does not exist")
    if not workdir or not os.path.isdir(workdir):
        raise errors.ConfigError(f"workdir {workdir!r} is not a directory")
    records = read_metrics(workdir)  # First: a corrupt line fails before any event is read.
    scalars = read_scalars(workdir) if _event_files(workdir) else {}
    losses, others = _scalar_panels(scalars, skip_eval=bool(records))
    panels = losses + _metric_panels(records) + others
    if not panels:
        names = " or ".join(METRICS_FILES)
        raise errors.ConfigError(
            f"nothing to plot in {workdir!r}: no scalar in TensorBoard event files under "
            f"logs/ and no {names}")
    _draw(panels, output)
    steps = np.concatenate([s[1] for p in panels for s in p[3]])
    return {"output": str(output), "steps": [int(steps.min()), int(steps.max())],
            "series": [s[0] for p in panels for s in p[3]]}
