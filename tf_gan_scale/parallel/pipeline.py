"""A multi-stage pipeline: G and D each split into K stages over K devices, M micro-batches
in a GPipe schedule ("stages:K" placements, parallel/placement.py).

    python -m tf_gan_scale.main --config=... --workdir=... --placement=stages:4 \\
        --num_cpu_devices=4 --config.train.accumulation_steps=8

Stage s of G and stage s of D live on device s: their weights, optimizer slots and forward
and backward ops (GPipe, Huang et al. 2019; torchgpipe). The M micro-batches are
accumulation's (config.train.accumulation_steps, `GanStep.micro_batches`: strided rows,
batch-norm statistics per micro-batch), so a pipelined step equals one device with the
same accumulation_steps bit for bit: the same ops on the same values, only where and when
they run changes. Each network pass follows a `Schedule` (data: which stage runs which
micro-batch at which tick): all forwards, then all backwards, stage by stage, and the ops of
tick t wait for those of tick t - 1 (control dependencies), so the executor cannot run the
passes in any other order. Idle (stage, tick) cells are the bubble, (K - 1) / (M + K - 1)
of each pass.

One D update = G's forward pass (M micro-batches, no gradient), then D's forward and
backward pass on [real; fake]. One G update = G forward, D forward, D backward (to d loss /
d fake only), G backward. Gradients are summed over micro-batches on each stage's device in
micro-batch order (accumulation's order), then go to the step's one gradient reduction
(`GanStep.apply`).

With `recompute`, a forward cell keeps only its stage's input (and the stage's state: batch-
norm moving statistics, spectral-norm vectors) and the backward cell re-runs the stage
under a tape from that state (GPipe's re-materialization): activations of one stage and
micro-batch at a time instead of all of them, for one more forward pass.

Stages are contiguous runs of the network's Keras graph (a Sequential or functional model;
tensors used later, like BigGAN's latent chunks and class embedding, travel with the
activations), balanced by an estimate of each layer's multiply-adds (weights x output
positions). A subclassed network (StyleGAN2's) has no graph to split: refused.
"""

import contextlib
import dataclasses

import keras
import tensorflow as tf
from keras.src.models import functional as keras_functional

from tf_gan_scale import errors, latents, replica
from tf_gan_scale.architectures import stylegan2
from tf_gan_scale.gan import Topology
from tf_gan_scale.gan import regularizers
from tf_gan_scale.gan.step import add_grads

FORWARD, BACKWARD = "F", "B"


# ---- the schedule ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Cell:
    """Stage `stage` runs micro-batch `micro`'s forward ("F") or backward ("B") pass."""

    stage: int
    micro: int
    phase: str


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Ticks of a pipeline pass: ticks[t] is the cells that run at the same time at tick t
    (at most one per stage: stage s runs on device s)."""

    stages: int
    micros: int
    ticks: tuple

    def phase(self, phase):
        """The ticks that hold cells of `phase` (in order)."""
        return [t for t in self.ticks if t and t[0].phase == phase]

    @property
    def bubble_fraction(self):
        """Idle (stage, tick) cells over all of them: (K - 1) / (M + K - 1) for GPipe."""
        busy = sum(len(t) for t in self.ticks)
        return 1.0 - busy / float(self.stages * len(self.ticks))


def gpipe(stages, micros, backward=True):
    """GPipe's schedule for `stages` K and `micros` M: forward tick t runs micro-batch
    t - s on stage s (t = 0 .. M + K - 2); then backward tick t runs micro-batch t - j on
    stage K - 1 - j, so each stage sees its micro-batches in order 0 .. M - 1 both ways.
    Without `backward`, the forward ticks alone (a pass that takes no gradient)."""
    span = micros + stages - 1
    ticks = [tuple(Cell(s, t - s, FORWARD) for s in range(stages) if 0 <= t - s < micros)
             for t in range(span)]
    if backward:
        ticks += [tuple(Cell(stages - 1 - j, t - j, BACKWARD) for j in range(stages)
                        if 0 <= t - j < micros) for t in range(span)]
    return Schedule(stages, micros, tuple(ticks))


# ---- a network in stages ----------------------------------------------------------------


def move_variables(weights, device):
    """Every variable of `weights` re-created on `device` with its value (each Keras
    variable keeps its object, path and trainability; its backing tf.Variable moves)."""
    for w in weights:
        with tf.device(device):
            w._value = tf.Variable(w._value.read_value(), trainable=w.trainable, name=w.name)


def _graph(model):
    """(the Functional holding `model`'s graph, its nodes in execution order)."""
    fn = model._functional if isinstance(model, keras.Sequential) else model
    if not isinstance(fn, keras_functional.Functional):
        raise errors.ConfigError(
            f"--placement=stages:K: network {model.name!r} ({type(model).__name__}) is not "
            f"a Sequential or functional Keras model, so it has no layer graph to split "
            f"into stages; valid: --placement=g:I,d:J (whole networks) or a --mesh")
    nodes = [node for depth in sorted(fn._nodes_by_depth, reverse=True)
             for node in fn._nodes_by_depth[depth]
             if node.operation is not None and not node.is_input]
    return fn, nodes


def _node_cost(node, seen):
    """(multiply-adds estimate of one layer call: its not yet counted trainable weights
    times its output positions (a convolution's kernel runs once per output pixel),
    whether it can start a stage: it has a kernel (a trainable weight of rank >= 2). A
    normalization's gain or a dropout's call counter stays with the layer before it, so
    a convolution, its batch norm and activation stay one unit (which Grappler may fuse:
    split, they round differently)."""
    op = node.operation
    weights = [w for w in getattr(op, "trainable_weights", []) if id(w) not in seen]
    seen.update(id(w) for w in weights)
    size = sum(int(tf.size(w)) for w in weights)
    out = node.outputs[0].shape if node.outputs else ()
    positions = 1
    for d in out[1:-1]:
        positions *= int(d or 1)
    return size * positions, any(len(w.shape) >= 2 for w in weights)


def _partition(costs, k):
    """Split points of `costs` into k contiguous runs minimising the largest run's sum
    (dynamic programming): [end of run 0, ..., len(costs)]."""
    n = len(costs)
    prefix = [0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(k + 1)]
    cut = [[0] * (n + 1) for _ in range(k + 1)]
    best[0][0] = 0
    for j in range(1, k + 1):
        for i in range(j, n + 1):
            for p in range(j - 1, i):
                v = max(best[j - 1][p], prefix[i] - prefix[p])
                if v < best[j][i]:
                    best[j][i], cut[j][i] = v, p
    ends, i = [], n
    for j in range(k, 0, -1):
        ends.append(i)
        i = cut[j][i]
    return ends[::-1]


class StagedNetwork:
    """A Keras network run as K stages, stage s on devices[s].

    Stage s runs a contiguous run of the graph's layer calls. It takes the tensors `ins[s]`
    (ids of the graph's symbolic tensors) and hands on `outs[s]`: every tensor made so far
    that a later stage (or the output) uses. Each stage holds at least one layer with
    weights; the split balances `_node_cost`."""

    def __init__(self, model, devices):
        self.model, self.devices = model, list(devices)
        k = len(self.devices)
        self.fn, nodes = _graph(model)
        seen = set()
        costs, weighted = zip(*[_node_cost(n, seen) for n in nodes])
        # Only layers with a kernel start a stage; the calls after one (its normalization,
        # activation, dropout, reshapes) join its run.
        heads = [i for i, w in enumerate(weighted) if w]
        if len(heads) < k:
            raise errors.ConfigError(
                f"--placement=stages:{k}: network {model.name!r} has {len(heads)} layers "
                f"with kernels, fewer than {k} stages; valid: stages:2..{len(heads)}")
        groups = [list(range(heads[i] if i else 0,
                             heads[i + 1] if i + 1 < len(heads) else len(nodes)))
                  for i in range(len(heads))]
        ends = _partition([sum(costs[j] for j in g) for g in groups], k)
        starts = [0] + ends[:-1]
        self.stages = [[nodes[j] for g in groups[a:b] for j in g]
                       for a, b in zip(starts, ends)]
        self.input_ids = [id(x) for x in self.fn.inputs]
        self.input_dtypes = [x.dtype for x in self.fn.inputs]
        self.output_id = id(self.fn.outputs[0])
        # Live tensors at each boundary: made before it (or an input), used after it.
        made = set(self.input_ids)
        self.ins, self.outs = [], []
        for s, stage in enumerate(self.stages):
            self.ins.append(self.outs[-1] if s else list(self.input_ids))
            made |= {id(x) for n in stage for x in n.outputs}
            later = {id(x) for n in (m for st in self.stages[s + 1:] for m in st)
                     for x in n.input_tensors} | {self.output_id}
            self.outs.append(sorted(made & later, key=self._order))
        # variables / state: the weights each stage owns (a shared layer's: the first
        # stage that calls it), placed on its device. trainable: the trainable weights
        # each stage's calls use, owned or not: a layer called in two stages gets the
        # gradients of both calls.
        self.variables, self.state, self.trainable = [], [], []
        for s, stage in enumerate(self.stages):
            # getattr: a keras.ops call (Sum, Add, ...) in a functional graph is an
            # Operation without weights.
            owned = [w for n in stage for w in getattr(n.operation, "weights", [])]
            unique = list({id(w): w for w in owned}.values())
            self.trainable.append([w for w in unique if w.trainable])
            earlier = {id(w) for vs in self.variables for w in vs} | {
                id(w) for vs in self.state for w in vs}
            unique = [w for w in unique if id(w) not in earlier]  # Shared layers: first use.
            self.variables.append([w for w in unique if w.trainable])
            self.state.append([w for w in unique if not w.trainable])

    def _order(self, tensor_id):
        return (tensor_id not in self.input_ids,
                self.input_ids.index(tensor_id) if tensor_id in self.input_ids else 0,
                tensor_id)

    def place(self):
        """Re-creates each stage's variables on its device (their Keras objects stay)."""
        for s, device in enumerate(self.devices):
            move_variables(self.variables[s] + self.state[s], device)

    def entry(self, inputs):
        """{id: tensor} of the graph's inputs from the network's inputs (a list)."""
        return {i: tf.cast(x, dtype) for i, x, dtype in
                zip(self.input_ids, inputs, self.input_dtypes)}

    @tf.autograph.experimental.do_not_convert
    def forward(self, s, live, training=True):
        """Stage s on its live inputs {id: tensor} -> its live outputs {id: tensor}. Runs
        the graph's layer calls as Keras' Functional.call does (training injected)."""
        values = {i: live[i] for i in self.ins[s]}
        for node in self.stages[s]:
            args, kwargs = node.arguments.fill_in(values)
            call = keras_functional.operation_fn(node.operation, training=training)
            for x, y in zip(node.outputs, tf.nest.flatten(call(*args, **kwargs))):
                values[id(x)] = y
        return {i: values[i] for i in self.outs[s]}


# ---- running a pass ---------------------------------------------------------------------


class _Pass:
    """What a forward pass keeps for its backward: per (stage, micro) the stage's live
    inputs, its tape (or, with recompute, its state before the cell) and outputs."""

    def __init__(self):
        self.inputs, self.tapes, self.states, self.outputs = {}, {}, {}, {}
        self.results = {}  # micro -> the tail's result (or the network's output).


def _floats(net, ids, live):
    """The ids of `ids` whose tensors are floating point (what a gradient reaches)."""
    return [i for i in ids if live[i].dtype.is_floating]


@tf.autograph.experimental.do_not_convert
def forward(net, schedule, entries, rows, *, pre=None, tail=None, keep=False,
            recompute=False):
    """The forward ticks of `schedule` over net's stages.

    Args:
        entries: per micro-batch m, the network's inputs (a list: [x] or [x, labels]).
        rows: per micro-batch, its global rows (per-example draws, `latents.example_rows`),
            or None: the rows `latents.current_rows` gives by default.
        pre: None or f(m, inputs) -> the network's inputs, run in stage 0's cell (under
            its tape: a backward reaches `entries` through it).
        tail: None or f(m, output) -> (scalar loss, anything), run in the last stage's
            cell; the backward starts from the loss.
        keep: keep what a `backward` needs (tapes, or with `recompute` inputs and state).

    Returns a `_Pass`: results[m] is tail's result, else net's output of micro-batch m.
    """
    run = _Pass()
    last = len(net.stages) - 1
    previous = []
    for tick in schedule.phase(FORWARD):
        made = []
        with tf.control_dependencies(previous):  # Tick t starts after tick t - 1.
            for cell in tick:
                s, m = cell.stage, cell.micro
                live = None if s == 0 else run.outputs[(s - 1, m)]
                if keep:
                    run.inputs[(s, m)] = live
                if keep and recompute:  # The stage's state as this cell sees it.
                    run.states[(s, m)] = [tf.identity(w.value) for w in net.state[s]]
                out, result, tape = _cell(net, s, m, live, entries[m] if s == 0 else None,
                                          rows[m], pre, tail, keep and not recompute)
                run.outputs[(s, m)] = out
                run.tapes[(s, m)] = tape
                if s == last:
                    run.results[m] = result if tail else out[net.output_id]
                made += [t for t in tf.nest.flatten(out)] + (
                    [result[0]] if result is not None else [])
        previous = made
    return run


@tf.autograph.experimental.do_not_convert
def _cell(net, s, m, live, raw, rows, pre, tail, tape_on):
    """A forward cell whose tape (if on) watches the stage's float inputs, and at stage 0
    the raw entries (before `pre`)."""
    tape = tf.GradientTape() if tape_on else None
    rows_scope = (contextlib.nullcontext() if rows is None else latents.example_rows(rows))
    with tf.device(net.devices[s]), rows_scope:
        if tape is not None:
            tape.__enter__()
        try:
            if s == 0:
                inputs = list(raw)
                if tape is not None:
                    for x in inputs:
                        if x.dtype.is_floating:
                            tape.watch(x)
                if pre is not None:
                    inputs = pre(m, inputs)
                stage_in = net.entry(inputs)
            else:
                stage_in = {i: live[i] for i in net.ins[s]}
                if tape is not None:
                    for i in _floats(net, net.ins[s], stage_in):
                        tape.watch(stage_in[i])
            out = net.forward(s, stage_in)
            result = (tail(m, out[net.output_id])
                      if (tail is not None and s == len(net.stages) - 1) else None)
        finally:
            if tape is not None:
                tape.__exit__(None, None, None)
    return out, result, tape


@tf.autograph.experimental.do_not_convert
def backward(net, run, schedule, entries, rows, *, seeds=None, variables=True,
             pre=None, tail=None, recompute=False):
    """The backward ticks of `schedule` for a forward `run` (kept).

    seeds: None when the forward had a tail (its loss starts the backward), else per
    micro-batch d loss / d output. Returns (gradients of net.model.trainable_variables
    summed over micro-batches in micro-batch order (None: not reached) if `variables`
    else None, per micro-batch the gradients of its float raw entries (in order))."""
    sums = {}
    upstream = {}  # (stage, micro) -> {id: d loss / d tensor} of the stage's outputs.
    entry_grads = {}
    previous = []
    for tick in schedule.phase(BACKWARD):
        made = []
        with tf.control_dependencies(previous):
            for cell in tick:
                s, m = cell.stage, cell.micro
                grads = _backward_cell(net, run, s, m, entries, rows, seeds, upstream,
                                       variables, pre, tail, recompute)
                inputs_grads, var_grads = grads
                if s == 0:
                    entry_grads[m] = inputs_grads
                else:
                    upstream[(s - 1, m)] = inputs_grads
                for w, g in zip(net.trainable[s], var_grads):
                    sums[id(w)] = add_grads(sums.get(id(w)), g)
                made += [g.values if isinstance(g, tf.IndexedSlices) else g
                         for g in tf.nest.flatten(grads, expand_composites=False)
                         if g is not None]
        previous = made
    out = ([sums.get(id(w)) for w in net.model.trainable_variables] if variables else None)
    return out, [entry_grads[m] for m in range(len(entries))]


@tf.autograph.experimental.do_not_convert
def _backward_cell(net, run, s, m, entries, rows, seeds, upstream, variables, pre, tail,
                   recompute):
    last = len(net.stages) - 1
    with tf.device(net.devices[s]):
        if recompute:
            # Re-run the stage from the state its forward cell saw, then put back today's.
            now = [tf.identity(w.value) for w in net.state[s]]
            for w, v in zip(net.state[s], run.states[(s, m)]):
                w.assign(v)
            raw = list(entries[m]) if s == 0 else None
            out, result, tape = _cell(net, s, m, run.inputs[(s, m)], raw, rows[m], pre,
                                      tail, True)
            with tf.control_dependencies(tf.nest.flatten(out)):
                for w, v in zip(net.state[s], now):
                    w.assign(v)
        else:
            out, tape = run.outputs[(s, m)], run.tapes[(s, m)]
            result = run.results.get(m) if s == last else None
        if s == 0:
            sources = [x for x in entries[m] if x.dtype.is_floating]
        else:
            live = run.inputs[(s, m)]
            sources = [live[i] for i in _floats(net, net.ins[s], live)]
        var_list = list(net.trainable[s]) if variables else []
        if s == last and tail is not None:
            targets, seeds_out = [result[0]], None
        else:
            given = upstream[(s, m)] if s < last else {net.output_id: seeds[m]}
            ids = _floats(net, net.outs[s], out)
            targets = [out[i] for i in ids]
            # In the output's dtype: G's update seeds a half-precision output with d loss /
            # d its float32 cast (the cast's own gradient, which one tape would take).
            seeds_out = [tf.cast(given[i], out[i].dtype) if given.get(i) is not None
                         else tf.zeros_like(out[i]) for i in ids]
        grads = tape.gradient(targets, sources + var_list, output_gradients=seeds_out)
    n = len(sources)
    if s == 0:
        return grads[:n], grads[n:]
    ids = _floats(net, net.ins[s], run.inputs[(s, m)])
    return dict(zip(ids, grads[:n])), grads[n:]


# ---- the GAN step's micro-batches in the schedule ----------------------------------------


class Pipeline(Topology):
    """GanStep's micro-batches through G's and D's stages in GPipe schedules (the module
    docstring). The step math around them (latents, D's inputs, losses, the gradient
    reduction and update) is GanStep's, unchanged; what differs from
    `GanStep.d_micro_batches` / `g_micro_batches` is only where and when each stage of each
    micro-batch runs. The knobs a pipeline cannot run are refused before (StepConfig's
    "pipeline" engine): penalties (a second backward through every stage), orthogonal
    regularization, ADA and the style generator's phases."""

    def __init__(self, generator, discriminator, devices, recompute=False):
        if stylegan2.is_style_generator(generator):
            raise errors.ConfigError(
                f"--placement=stages:{len(devices)}: a style generator runs as its mapping "
                f"and synthesis networks (style mixing, path length), not as one graph of "
                f"layers to split; valid: --placement=g:I,d:J, a strategy or --mesh")
        self.g = StagedNetwork(generator, devices)
        self.d = StagedNetwork(discriminator, devices)
        self.devices, self.recompute = list(devices), bool(recompute)

    @property
    def stages(self):
        return len(self.devices)

    def place(self):
        self.g.place()
        self.d.place()

    def _fakes(self, gs, rows, step, phase, keep):
        """G's forward pass for the micro-batches of global rows `rows` (a list): (the
        pass, entries, fake labels). The latents and labels of one device's `g_grads`."""
        z = [latents.rows_normal(latents.key(gs.seed, step, phase), r, [gs.latent_dim])
             for r in rows]
        labels = [gs.fake_labels(step, phase, r) for r in rows]
        entries = [[z[m], labels[m]] if gs.num_classes else [z[m]] for m in range(len(rows))]
        schedule = gpipe(self.stages, len(rows), backward=keep)
        run = forward(self.g, schedule, entries, rows, keep=keep, recompute=self.recompute)
        return run, entries, labels, schedule

    def d_micro_batches(self, gs, real, real_labels, rows, gb, step, k, penalty_due=None):
        del penalty_due  # Penalties are refused on a pipeline.
        c = gs.config
        parts = gs.micro_batches()
        m_rows = [rows[p] for p in parts]
        g_run, _, fake_labels, _ = self._fakes(gs, m_rows, step, k, keep=False)
        entries, both = [], []
        for m, p in enumerate(parts):
            with tf.device(self.d.devices[0]):
                fake = tf.cast(g_run.results[m], tf.float32)
                both.append(tf.concat([m_rows[m], gb + m_rows[m]], 0))
                x = gs.d_inputs(tf.concat([real[p], fake], 0), both[m], step, k)
                labels = tf.concat([real_labels[p], fake_labels[m]], 0)
            entries.append([x, labels] if gs.num_classes else [x])

        def tail(m, logits):  # d_grads' loss, from D's logits of [real; fake].
            logits = tf.cast(logits, tf.float32)
            b = tf.shape(m_rows[m])[0]  # Not .shape[0]: None for a batch of unknown size.
            real_logits, fake_logits = logits[:b], logits[b:]
            per_example = gs.loss_fn(real_logits=real_logits, fake_logits=fake_logits).d
            if c.lecam_weight:
                per_example += float(c.lecam_weight) * regularizers.lecam(
                    real_logits, fake_logits, gs.lecam_anchors[0], gs.lecam_anchors[1])
            share = replica.global_mean(per_example, gb)
            means = [replica.global_mean(tf.reshape(v, [-1]), gb)
                     for v in (real_logits, fake_logits)] if c.lecam_weight else []
            return gs.d_optimizer.scale_loss(share), (share, means)

        schedule = gpipe(self.stages, len(parts))
        run = forward(self.d, schedule, entries, both, tail=tail, keep=True,
                      recompute=self.recompute)
        grads, _ = backward(self.d, run, schedule, entries, both, tail=tail,
                            recompute=self.recompute)
        shares, means = [], []
        for m in range(len(parts)):
            share, riders = run.results[m][1]
            shares.append(share)
            means = riders if not means else [x + y for x, y in zip(means, riders)]
        return grads, shares, means

    def g_micro_batches(self, gs, rows, gb, step):
        parts = gs.micro_batches()
        m_rows = [rows[p] for p in parts]
        g_run, g_entries, labels, schedule = self._fakes(gs, m_rows, step, latents.G_PHASE,
                                                         keep=True)
        d_entries = [[tf.cast(g_run.results[m], tf.float32)] + (
            [labels[m]] if gs.num_classes else []) for m in range(len(parts))]

        def pre(m, inputs):  # D's inputs of the fakes, under D's first stage's tape.
            return [gs.d_inputs(inputs[0], m_rows[m], step, latents.G_PHASE)] + inputs[1:]

        def tail(m, logits):  # g_grads' loss.
            logits = tf.cast(logits, tf.float32)
            per_example = gs.loss_fn(real_logits=logits, fake_logits=logits).g
            share = replica.global_mean(per_example, gb)
            return gs.g_optimizer.scale_loss(share), share

        # D sees the fakes as `g_grads` calls it: without declared rows (its dropout keys
        # by the position in the micro-batch, the same on every topology).
        d_rows = [None] * len(parts)
        d_run = forward(self.d, schedule, d_entries, d_rows, pre=pre, tail=tail, keep=True,
                        recompute=self.recompute)
        # d loss / d fake only: D's weights are not G's update's business.
        _, d_fake = backward(self.d, d_run, schedule, d_entries, d_rows, variables=False,
                             pre=pre, tail=tail, recompute=self.recompute)
        grads, _ = backward(self.g, g_run, schedule, g_entries, m_rows,
                            seeds=[d[0] for d in d_fake], recompute=self.recompute)
        shares = [d_run.results[m][1] for m in range(len(parts))]
        return grads, shares, []
