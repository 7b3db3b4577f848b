"""Trains every equivalence case under one strategy and saves the weights (a test helper).

    python tests/helpers/equivalence_run.py --strategy=one_device --out=one.npz
    python tests/helpers/equivalence_run.py --strategy=mirrored --num_cpu_devices=4 --out=m4.npz
    python tools/launch_local.py --num_workers=2 --devices_per_worker=2 -- \
        python tests/helpers/equivalence_run.py --strategy=multi_worker_mirrored --out=mw.npz

Each case is a small GAN trained for a few steps from the same seed on the same global
batches; the chief writes {CASE/VARIABLE: array} for every variable of G and D (weights,
moving statistics, dropout counters), {CASE/d_loss, CASE/g_loss: per-step global losses},
`rows` ([replica-batches whose replica.global_rows differ from the rows the input
pipeline really hands the replica, replica-batches checked], over all workers) and `collectives/CASE` (collective all-reduce ops per replica in the traced step;
multi-worker only, where all-reduces are collective ops) and, for --scale_error_cases,
{scale_error/CASE/VARIABLE: array}: the case rerun with a 2x gradient-scale bug.
tests/integration/test_equivalence.py compares the files of different topologies.
"""

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402
from graph_ops import all_reduces_per_replica  # noqa: E402  (tests/ is sys.path[0])

flags.DEFINE_string("strategy", "one_device", "one_device, mirrored, multi_worker_mirrored.")
flags.DEFINE_integer("num_cpu_devices", None, "Logical CPU devices (replicas per process).")
flags.DEFINE_string("out", None, "Output .npz (written by the chief).")
flags.DEFINE_list("cases", None, "Cases to run (default: all).")
flags.DEFINE_list("skip_cases", [], "Cases not to run.")
flags.DEFINE_integer("steps", 3, "Generator steps per case.")
flags.DEFINE_integer("intra_op_threads", 0, "TensorFlow intra-op threads (0: default).")
flags.DEFINE_list("scale_error_cases", [], "Cases run a second time with a bug injected: "
                  "every replica.global_mean share doubled (what dividing by the LOCAL "
                  "batch does on 2 replicas), restarted from the case's first state "
                  "through the same traced step; written as scale_error/CASE/...")
FLAGS = flags.FLAGS

GLOBAL_BATCH = 16
SGD = {"name": "sgd", "learning_rate": 0.1}


def cases():
    """{name: (config overrides, data source[, steps])}: one knob each on top of a tiny
    DCGAN with cross-replica batch norm in G and D, plain SGD, no dropout."""
    dcgan = {"model.d_norm": "batch", "model.d_dropout": 0.0}
    return {
        "sgd": (dcgan, "digits"),
        # The same on a prepared ArrayRecord dataset, read by index on each worker.
        "arrayrecord": (dcgan, "digits_arrayrecord"),
        "adam": ({**dcgan, "train.g_optimizer": {"name": "adam", "learning_rate": 1e-3},
                  "train.d_optimizer": {"name": "adam", "learning_rate": 1e-3}}, "digits"),
        "dropout": ({**dcgan, "model.d_dropout": 0.3}, "digits"),
        "wgan_gp": ({**dcgan, "train.loss": "wasserstein", "train.penalty": "wgan_gp",
                     "train.penalty_weight": 10.0}, "digits"),
        "r1": ({**dcgan, "train.penalty": "r1", "train.penalty_weight": 1.0}, "digits"),
        "d_steps2": ({**dcgan, "train.d_steps": 2}, "digits"),
        # D's first batch norm sees activations whose mean is ~1e3x their spread.
        "large_mean": ({"model.name": "mlp", "model.hidden": (16, 16), "model.g_norm": "batch",
                        "model.d_norm": "batch",
                        "train.g_optimizer": {"name": "sgd", "learning_rate": 1e-3},
                        "train.d_optimizer": {"name": "sgd", "learning_rate": 1e-3}},
                       "shifted"),
        "local_bn": ({**dcgan, "model.sync_bn": False}, "digits"),
        # Issue 10's pieces together, 10 steps: a class-conditional BigGAN (cross-replica
        # conditional BN, spectral norm in G and D with their u vectors, self-attention,
        # projection D), EMA generator, DiffAugment, orthogonal regularization, hinge.
        "biggan": ({"model.name": "biggan", "model.conditional": True, "model.ch": 4,
                    "model.g_channels": (2, 2), "model.d_channels": (1, 2),
                    "model.attention": 8, "model.shared_dim": 4, "train.loss": "hinge",
                    "train.ema": {"decay": 0.9, "start": 2, "warmup": 3},
                    "train.augment": "color,translation,cutout",
                    "train.ortho_weight": 1e-3,
                    "train.g_optimizer": {"name": "sgd", "learning_rate": 0.01},
                    "train.d_optimizer": {"name": "sgd", "learning_rate": 0.01}},
                   "digits16", 10),
        # Gradient accumulation (issue 11): 2 micro-batches per update. Without batch
        # norm it must equal the unaccumulated "no_bn"; with it, micro-batch j is the
        # same global rows on every topology (GanStep.micro_batches).
        "no_bn": ({"model.g_norm": "none"}, "digits"),
        "accumulate": ({"model.g_norm": "none", "train.accumulation_steps": 2}, "digits"),
        "accumulate_bn": ({**dcgan, "train.accumulation_steps": 2}, "digits"),
        # Gradients all-reduced in packs of ~2 KB, last layers first (multi-worker).
        "packed": ({**dcgan, "train.grad_pack_bytes": 2048}, "digits"),
        # bfloat16 arithmetic, float32 variables, statistics and outputs (precision.py).
        "bf16": ({**dcgan, "train.precision": "mixed_bfloat16"}, "digits"),
        # StyleGAN2-ADA (issue 26), 4 steps: modulated convolutions with per-row noise,
        # minibatch-std chunks of 4 global rows, style mixing (one cut-off per chunk),
        # lazy R1 and path length as their own updates (both at steps 0 and 2, pl_mean
        # all-reduced), ADA at p = 0.3 adjusted every step from the global sign
        # statistic, w_avg from the global mean w, the kimg EMA.
        "stylegan2": ({"model.name": "stylegan2", "model.w_dim": 8, "model.mapping_layers": 2,
                       "model.fmaps": 1 / 256, "model.channel_max": 8, "model.mbstd_group": 2,
                       "model.mbstd_chunk": 4, "train.loss": "non_saturating",
                       "train.penalty": "r1", "train.penalty_weight": 0.5,
                       "train.penalty_every": 2, "train.lazy_phases": True,
                       "train.pl_weight": 2.0, "train.pl_every": 2, "train.style_mixing": 0.9,
                       "train.augment": "ada", "train.ada_p": 0.3, "train.ada_interval": 1,
                       "train.ada_kimg": 0.32,
                       "train.ema": {"decay": 0.0, "start": 0, "warmup": 0, "kimg": 0.1,
                                     "rampup": 0.05}},
                      "digits16", 4),
        # R3GAN (issue 50), 4 steps: a class-conditional r3gan (grouped 3x3 convs split
        # by group, fix-up residual blocks, projection D), the relativistic paired loss
        # (G's update reads its own real batch; fakes take their real's label), R1 + R2
        # on D's clean inputs through R3GAN's pipe (bgc, colour at half p, cutout), 2
        # micro-batches per update, and the cosine schedules of the learning rate, the
        # penalty weight, the EMA half-life and p (from 0.3). The lazy penalty and the
        # finite difference: tests/gan/test_r3gan_step.py (a lazy one traces D twice).
        "rpgan": ({"model.name": "r3gan", "model.conditional": True,
                   "model.widths": (8, 8, 4), "model.blocks": 1,
                   "model.cardinality": (4, 4, 2), "train.loss": "rpgan",
                   "train.penalty": "r1_r2", "train.augment": "r3gan",
                   "train.ada_interval": 0, "train.accumulation_steps": 2,
                   "train.cosine": {"images": 64.0, "learning_rate": (0.1, 0.02),
                                    "penalty_weight": (0.5, 0.05), "ema_kimg": (0.0, 0.04),
                                    "ada_p": (0.3, 0.6)}},
                  "digits16", 4),
        # The D-side stabilizers: LeCam, instance noise, label smoothing, lazy R1.
        "stabilizers": ({"model.d_dropout": 0.0, "train.lecam_weight": 0.5,
                         "train.instance_noise": 0.1, "train.instance_noise_steps": 4,
                         "train.label_smoothing": 0.1, "train.penalty": "r1",
                         "train.penalty_weight": 1.0, "train.penalty_every": 2}, "digits"),
    }


def make_config(overrides, source):
    """The config of one case: `overrides` {"section.key": value} on a tiny DCGAN."""
    import ml_collections
    from tf_gan_scale import configs
    c = configs.base().to_dict()
    c["model"] = dict(name="dcgan", latent_dim=8, d_dropout=0.0, sync_bn=True,
                      g_norm="batch", d_norm="none", g_channels=(16, 8, 4), d_channels=(4, 8))
    c["train"].update(global_batch_size=GLOBAL_BATCH, g_optimizer=dict(SGD),
                      d_optimizer=dict(SGD))
    c["data"]["source"] = source
    # Seed 0 puts one of D's pre-activations 2e-8 from LeakyReLU's kink after the first
    # D update of "sgd": rounding then flips its slope on some topologies and the G
    # gradient moves by 1% (a property of the point, not of the distributed math).
    c["seed"] = 1
    if overrides.get("model.name") in ("mlp", "biggan", "stylegan2", "r3gan"):
        c["model"] = dict(name=overrides["model.name"], latent_dim=8)
    for key, value in overrides.items():
        section, leaf = key.split(".")
        c[section][leaf] = value
    return ml_collections.ConfigDict(c)


def load_source(name):
    import numpy as np
    from tf_gan_scale import data
    if name == "digits":
        return data.load("embedded:digits")
    if name == "digits_arrayrecord":  # Digits as uint8 (0..16 -> 0..240), prepared here.
        from tf_gan_scale.data import prepared
        digits = data.load("embedded:digits").arrays
        pixels = np.round((digits["x"] + 1.0) * 8.0 * 15.0).astype(np.uint8)
        out = os.path.join(tempfile.mkdtemp(), "digits")  # Each process its own copy.
        prepared.write(out, [(pixels, digits["label"])], num_examples=len(pixels),
                       shape=pixels.shape[1:], num_classes=10, num_shards=3)
        return data.load(f"arrayrecord:{out}")
    if name == "digits16":  # 16x16 (each pixel 2x2): G's 8x8 block and D's first share 8x8.
        digits = data.load("embedded:digits").arrays
        x = np.repeat(np.repeat(digits["x"], 2, axis=1), 2, axis=2)
        return data.from_arrays("digits16", x, digits["label"])
    toy = data.load("toy:grid25")  # 2D points in [-4, 4], shifted to a mean of 3,000.
    return data.from_arrays("shifted", toy.arrays["x"][:4096] + 3000.0,
                            toy.arrays["label"][:4096])


def count_collectives(model, dist_dataset, strategy):
    """Collective all-reduce ops per replica in one traced GAN step."""
    graph = model.step_function.get_concrete_function(iter(dist_dataset)).graph
    return all_reduces_per_replica(graph, strategy)


def rows_match_pipeline(strategy):
    """replica.global_rows against the row ids the input pipeline delivers, on EVERY
    replica of every worker: [replica-batches whose rows differ, replica-batches checked],
    summed over the whole cluster (a cross-worker all-reduce: the chief, which writes the
    file, sees worker 1's replicas too). Checked == 4 x replicas proves none was skipped."""
    import numpy as np
    import tensorflow as tf
    from tf_gan_scale import replica
    ds = tf.data.Dataset.range(4 * GLOBAL_BATCH).batch(GLOBAL_BATCH, drop_remainder=True)
    per = GLOBAL_BATCH // strategy.num_replicas_in_sync

    @tf.function
    def check(x):
        def one(x):
            ok = tf.reduce_all(tf.cast(x % GLOBAL_BATCH, tf.int32) == replica.global_rows(per))
            return tf.stack([1 - tf.cast(ok, tf.int32), 1])
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(one, args=(x,)),
                               axis=None)

    total = np.zeros(2, np.int64)
    for batch in strategy.experimental_distribute_dataset(ds):
        total += check(batch).numpy()
    return total


def rows_match_per_worker_input(strategy):
    """As rows_match_pipeline, for the per-worker input (data.input_fn: each worker
    builds only its replicas' rows): the example at global row i of batch g must be the
    pipeline's permutation of position g*GB + i, on every replica."""
    import numpy as np
    import tensorflow as tf
    from tf_gan_scale import data, replica
    from tf_gan_scale.data import pipeline
    n = 100
    source = data.from_arrays("ids", np.zeros((n, 2), np.float32), np.arange(n))
    per = GLOBAL_BATCH // strategy.num_replicas_in_sync

    @tf.function
    def check(batch, g):
        def one(batch):
            rows = g * GLOBAL_BATCH + tf.cast(replica.global_rows(per), tf.int64)
            want = tf.cast(pipeline.permuted(rows, n, 7), tf.int32)
            ok = tf.reduce_all(batch["label"] == want)
            return tf.stack([1 - tf.cast(ok, tf.int32), 1])
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(one, args=(batch,)),
                               axis=None)

    total = np.zeros(2, np.int64)
    dist = data.distribute(data.input_fn(source, global_batch_size=GLOBAL_BATCH, seed=7,
                                         start_batch=5), strategy)
    for g, batch in zip(range(5, 9), dist):  # From batch 5: a resumed position.
        total += check(batch, tf.constant(g, tf.int64)).numpy()
    return total


def case_arrays(model, prefix):
    """{PREFIX/NET/INDEX: array} of every variable of G, D and the EMA generator, and
    {PREFIX/STATE: array} of the step's own state (GAN.step_state)."""
    import numpy as np
    out = {f"{prefix}/{k}": np.asarray(v.numpy()) for k, v in model.step_state().items()}
    nets = {"generator": model.generator, "discriminator": model.discriminator}
    if model.ema is not None:
        nets["ema_generator"] = model.ema.model
    for label, net in nets.items():
        for i, v in enumerate(net.weights):  # Same creation order on every topology.
            out[f"{prefix}/{label}/{i:03d}"] = np.asarray(v.numpy())
    return out


def main(argv):
    del argv
    import numpy as np
    import tensorflow as tf
    from tf_gan_scale import distribute
    if FLAGS.intra_op_threads:  # Before the runtime starts.
        tf.config.threading.set_intra_op_parallelism_threads(FLAGS.intra_op_threads)
    distribute.configure_cpu_devices(FLAGS.num_cpu_devices)
    strategy = distribute.make_strategy(FLAGS.strategy, num_cpu_devices=FLAGS.num_cpu_devices)
    from tf_gan_scale import data, replica
    from tf_gan_scale import training
    # The injected 2x gradient-scale bug, switched at run time (a variable the traced step
    # reads), so a case's control reuses its trace: x 1.0 is exact, so the honest run
    # is the same computation, bit for bit, as without the switch.
    error_scale = None
    if FLAGS.scale_error_cases:
        error_scale = tf.Variable(1.0, trainable=False, name="error_scale")
        honest_mean = replica.global_mean

        def doubled_mean(per_example, global_batch):
            share = honest_mean(per_example, global_batch)
            return share * tf.cast(error_scale, share.dtype)
        replica.global_mean = doubled_mean
    out = {"rows": rows_match_pipeline(strategy),
           "rows_per_worker_input": rows_match_per_worker_input(strategy),
           "num_replicas": np.array(strategy.num_replicas_in_sync)}
    multi_worker = FLAGS.strategy == "multi_worker_mirrored"
    scratch_dir = tempfile.TemporaryDirectory(prefix="equivalence-start-")  # Controls' starts.
    scratch = scratch_dir.name
    for name, (overrides, source_name, *steps) in cases().items():
        if (FLAGS.cases and name not in FLAGS.cases) or name in FLAGS.skip_cases:
            continue
        config = make_config(overrides, source_name)
        source = load_source(source_name)
        with strategy.scope():
            model = training.build_gan(config, source.shape, source.num_classes)

        def batches():  # The case's global batches, from the first.
            return data.distribute(
                data.input_fn(source, global_batch_size=GLOBAL_BATCH, seed=0), strategy)
        dataset = batches()
        if multi_worker:
            model.make_train_function()
            out[f"collectives/{name}"] = np.array(count_collectives(model, dataset, strategy))
        epochs = steps[0] if steps else FLAGS.steps
        control = name in FLAGS.scale_error_cases
        if control:  # The case's first state (weights, optimizers, step, step state).
            start = tf.train.Checkpoint(**model.checkpoint_items())
            start_path = start.write(os.path.join(scratch, "start"))
        history = model.fit(dataset, epochs=epochs, steps_per_epoch=1, verbose=0).history
        for tag in ("d_loss", "g_loss"):
            out[f"{name}/{tag}"] = np.array(history[tag])
        out.update(case_arrays(model, name))
        if control:  # Same batches from the same state, the bug switched on.
            start.read(start_path).assert_consumed()
            error_scale.assign(2.0)
            model.fit(batches(), epochs=epochs, steps_per_epoch=1, verbose=0)
            error_scale.assign(1.0)
            out.update(case_arrays(model, "scale_error/" + name))
    scratch_dir.cleanup()
    if distribute.is_chief(strategy):
        np.savez(FLAGS.out, **out)


if __name__ == "__main__":
    app.run(main)
