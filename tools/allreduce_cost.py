"""All-reduce cost model of a config: bytes per step per replica, ring all-reduce time at
10/25/100/400 Gbit/s, predicted scaling efficiency at 8/64/256 replicas with
cross-replica BN (and, in parentheses, with local BN), as markdown.

    python tools/allreduce_cost.py --config=experiments/dcgan_mnist.py --data_shape=28,28,1

Model and assumptions: tf_gan_scale/distribute/cost_model.py. The compute side assumes
--per_replica_batch examples per replica (weak scaling) at --tflops effective TFLOP/s;
links have --latency_us per ring step. Model-only levers (not implemented in the step):
--accumulation_steps=K (micro-batches per optimizer update, one gradient all-reduce per
update; --per_replica_batch is the micro-batch), --grad_bytes=2 (bfloat16 gradients),
--packs=P --overlap (gradient all-reduce in P packs overlapping the backward pass).

With --mesh (repeatable), the model axis instead: one row per DTensor mesh
"batch:B,model:M" at global batch --global_batch (default: --per_replica_batch x B x M,
the same for every mesh of as many devices), with the layout policy of
tf_gan_scale/parallel/layouts.py and config.parallel.layouts (plus --layout=REGEX=SPEC):

    python tools/allreduce_cost.py --config=experiments/dcgan_mnist.py --data_shape=28,28,1 \
        --mesh=batch:8,model:1 --mesh=batch:4,model:2 --mesh=batch:2,model:4
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from tf_gan_scale import cli, errors  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "ml_collections config file.",
                                          lock_config=True)
flags.DEFINE_list("data_shape", None, "H,W,C (or D) of the data; default: load the source.")
flags.DEFINE_integer("per_replica_batch", 32, "Examples per replica per step.")
flags.DEFINE_float("tflops", 50.0, "Effective TFLOP/s of one replica (A100/H100-class "
                   "GPU at a realistic fraction of peak).")
flags.DEFINE_float("latency_us", 20.0, "Latency of one ring step, microseconds.")
flags.DEFINE_integer("accumulation_steps", 1, "Micro-batches per optimizer update (model).")
flags.DEFINE_integer("grad_bytes", 4, "Bytes per all-reduced gradient value (model; 4 today).")
flags.DEFINE_integer("packs", 1, "Packs per gradient all-reduce (model).")
flags.DEFINE_boolean("overlap", False, "Packs overlap the backward pass (model).")
flags.DEFINE_multi_string("mesh", [], "batch:B,model:M; repeat for one row per mesh (the "
                          "model axis table instead of the data-parallel one).")
flags.DEFINE_integer("global_batch", 0, "Global batch of the --mesh rows (0: "
                     "--per_replica_batch x the mesh's devices).")
flags.DEFINE_float("model_gbit", 0.0, "Gbit/s of the links of the --mesh model axis (e.g. "
                   "2400 for NVLink inside a host); 0: each column's bandwidth, as the batch axis.")
flags.DEFINE_float("model_latency_us", -1.0, "Ring step latency on the model axis, us "
                   "(-1: --latency_us).")
flags.DEFINE_multi_string("layout", [], "REGEX=SPEC layout override (e.g. "
                          "'/(gain|bias)/kernel=-,-'), after config.parallel.layouts.")
FLAGS = flags.FLAGS

BANDWIDTHS = (10, 25, 100, 400)
REPLICAS = (8, 64, 256)


def main(argv):
    del argv
    config = cli.config_value(_CONFIG)
    if config is None:
        raise errors.ConfigError("--config is required")
    from tf_gan_scale import architectures, data
    from tf_gan_scale.distribute import cost_model
    from tf_gan_scale import training
    if FLAGS.data_shape:
        try:
            shape = tuple(int(v) for v in FLAGS.data_shape)
        except ValueError:
            raise errors.ConfigError(f"--data_shape must be integers; Received: "
                                     f"{FLAGS.data_shape}") from None
    else:
        shape = data.load(config.data.source).shape
    g, d = architectures.build(config.model.name, data_shape=shape,
                               latent_dim=config.model.latent_dim,
                               **training.model_options(config))
    costs = cost_model.network_costs(g, d, shape, config.model.latent_dim)
    d_steps = config.train.d_steps
    if FLAGS.mesh:
        return mesh_table(config, g, d, shape, costs)
    levers = {"accumulation_steps": FLAGS.accumulation_steps,
              "grad_bytes_per_param": FLAGS.grad_bytes, "packs": FLAGS.packs,
              "overlap": FLAGS.overlap}
    msgs = cost_model.step_messages(costs, d_steps,
                                    accumulation_steps=FLAGS.accumulation_steps,
                                    grad_bytes_per_param=FLAGS.grad_bytes)
    name = os.path.basename(config_flags.get_config_filename(FLAGS["config"]))
    grad_b, bn_b = sum(msgs["gradients"]), sum(msgs["batch_norm"])
    print(f"### {name}: {config.model.name}, data {shape}, d_steps {d_steps}\n")
    print(f"- parameters: G {costs['g_params']:,}, D {costs['d_params']:,}; "
          f"forward FLOPs/example: G {costs['g_flops']:,}, D {costs['d_flops']:,}")
    print(f"- per step per replica: gradients {len(msgs['gradients'])} all-reduces, "
          f"{grad_b / 1e6:.3f} MB; cross-replica BN {len(msgs['batch_norm'])} all-reduces, "
          f"{bn_b / 1e3:.2f} kB")
    compute = (FLAGS.accumulation_steps * FLAGS.per_replica_batch
               * cost_model.step_flops_per_example(costs, d_steps) / (FLAGS.tflops * 1e12))
    if levers != {"accumulation_steps": 1, "grad_bytes_per_param": 4, "packs": 1,
                  "overlap": False}:
        print(f"- model-only levers: {levers}; all-reduce ms counts every pack, hidden "
              f"or not")
    print(f"- compute per step at {FLAGS.per_replica_batch} examples/replica and "
          f"{FLAGS.tflops:g} TFLOP/s: {compute * 1e3:.2f} ms; ring latency "
          f"{FLAGS.latency_us:g} us/step\n")
    header = "| Gbit/s | " + " | ".join(
        f"all-reduce ms @{n} | efficiency @{n} (local BN)" for n in REPLICAS) + " |"
    print(header)
    print("|" + "---|" * (1 + 2 * len(REPLICAS)))
    for bw in BANDWIDTHS:
        cells = []
        for n in REPLICAS:
            times = [cost_model.step_time(
                costs, replicas=n, per_replica_batch=FLAGS.per_replica_batch, gbit_per_s=bw,
                latency_s=FLAGS.latency_us * 1e-6, flops_per_s=FLAGS.tflops * 1e12,
                d_steps=d_steps, sync_bn=sync, **levers) for sync in (True, False)]
            t = times[0]["grad_comm_s"] + times[0]["bn_comm_s"]
            e = [x["efficiency"] for x in times]
            cells += [f"{t * 1e3:.2f}", f"{e[0]:.1%} ({e[1]:.1%})"]
        print(f"| {bw} | " + " | ".join(cells) + " |")


def mesh_table(config, g, d, shape, costs):
    """The model-axis table: one row per --mesh at one global batch (cost_model.mesh_*)."""
    from tf_gan_scale.cluster import mesh_spec
    from tf_gan_scale.distribute import cost_model
    meshes = [mesh_spec.parse(m) for m in FLAGS.mesh]
    overrides = [tuple(o) for o in config.parallel.layouts]
    for text in FLAGS.layout:
        regex, sep, spec = text.rpartition("=")
        if not sep or not regex:
            raise errors.ConfigError(f"--layout={text!r}: valid: REGEX=SPEC, e.g. "
                                     f"'generator/dense/kernel=model,-'")
        overrides.append((regex, spec))
    d_steps = config.train.d_steps
    name = os.path.basename(config_flags.get_config_filename(FLAGS["config"]))
    print(f"### {name}: {config.model.name}, data {shape}, d_steps {d_steps}, model axis\n")
    print(f"- parameters: G {costs['g_params']:,}, D {costs['d_params']:,}; "
          f"forward FLOPs/example: G {costs['g_flops']:,}, D {costs['d_flops']:,}")
    model_link = (f"model axis {FLAGS.model_gbit:g} Gbit/s" if FLAGS.model_gbit
                  else "model axis as the batch axis")
    model_latency = FLAGS.latency_us if FLAGS.model_latency_us < 0 else FLAGS.model_latency_us
    print(f"- {FLAGS.tflops:g} TFLOP/s per device, ring latency {FLAGS.latency_us:g} us/step "
          f"(model axis {model_latency:g}); {model_link}; layout overrides: "
          f"{overrides or 'none'}")
    rows, split = [], {}
    for dims in meshes:
        devices = dims["batch"] * dims["model"]
        gb = FLAGS.global_batch or FLAGS.per_replica_batch * devices
        if gb % dims["batch"]:
            raise errors.ConfigError(f"--global_batch={gb} does not split over "
                                     f"batch={dims['batch']}")
        c = cost_model.mesh_network_costs(g, d, shape, config.model.latent_dim, dims,
                                          overrides, costs=costs)
        for rec in c["g_layers"] + c["d_layers"]:
            split.setdefault(rec["path"], f"{rec['kind']} [{rec['in']}, {rec['out']}]")
        b = gb // dims["batch"]
        size = cost_model.mesh_step_bytes(c, dims, b, d_steps)
        times = [cost_model.mesh_step_time(
            c, dims=dims, per_device_batch=b, gbit_per_s=bw,
            latency_s=FLAGS.latency_us * 1e-6, flops_per_s=FLAGS.tflops * 1e12,
            d_steps=d_steps, model_gbit_per_s=FLAGS.model_gbit or None,
            model_latency_s=model_latency * 1e-6) for bw in BANDWIDTHS]
        msg, sent = size["messages"], size["sent"]
        t = times[0]
        rows.append([f"batch:{dims['batch']},model:{dims['model']} ({devices})", f"{gb}",
                     f"{t['params_per_device'] / 1e6:.2f}", f"{b}",
                     f"{t['compute_s'] * 1e3:.2f}", f"{msg['gradients'] / 1e6:.2f}",
                     f"{msg['batch_norm'] / 1e3:.1f}",
                     f"{(msg['model_gather'] + msg['model_all_reduce']) / 1e6:.2f}",
                     f"{sum(sent.values()) / 1e6:.2f}"]
                    + [f"{x['step_s'] * 1e3:.2f} ({x['efficiency']:.1%})" for x in times])
    print(f"- split weights (first mesh that splits each): "
          f"{'; '.join(f'{k} {v}' for k, v in split.items()) or 'none'}\n")
    print("| mesh (devices) | global batch | weights/device (millions) | examples/device | "
          "compute ms | "
          "gradients MB | BN kB | model axis MB | sent MB | "
          + " | ".join(f"step ms (eff.) @{bw} Gbit/s" for bw in BANDWIDTHS) + " |")
    print("|" + "---|" * (9 + len(BANDWIDTHS)))
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    cli.run(main)
