"""Official StyleGAN2-ADA snapshots in (tf_gan_scale/interop): read without PyTorch and
without running their code, and the same numbers out.

Golden data: tests/fixtures/make_stylegan2_official.py ran the official code
(NVlabs/stylegan2-ada-pytorch d72cc7d, torch on CPU) once, by hand, and wrote three
snapshots exactly as its training loop does (fp32; class-conditional with float16 blocks
and conv_clamp 256, the path of the official pretrained snapshots; the 'orig' D) and
their outputs, in float32 as the official code computes them and in float64. Each of
our outputs must be within 3x the official float32 run's own distance from float64
(its rounding, measured per output and stored with it) of the float64 outputs: mapping
(psi 1 and 0.7), G_ema's synthesis, G's image, D on real images and on G's, D's input
gradient and every gradient of D(G(z)) with respect to G's and D's weights.
"""

import io
import os
import pickle

import numpy as np
import pytest
import tensorflow as tf

from tf_gan_scale import architectures, errors
from tf_gan_scale.architectures import stylegan2 as sg2
from tf_gan_scale.interop import stylegan2 as imp
from tf_gan_scale.interop import torch_pickle

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures")
SNAPSHOTS = ("fp32", "cond_fp16", "orig")


def typical_rounding(golden, prefix):
    """The upper quartile over a snapshot's outputs of the official rounding relative to
    the output's magnitude (fp32: 5.7e-7, orig: 3.7e-7, cond_fp16: 5.5e-2, its float16
    blocks). One output's measured rounding is one draw: a gradient summed over many
    terms can match float64 by luck (some to 0.0), which another summation order cannot
    promise; so each output's bound is at least this typical rounding at its magnitude.
    (A weight in the wrong layout or a gradient off by 2 misses by orders of magnitude.)"""
    rel = [float(golden[k]) / max(float(np.max(np.abs(golden[k.replace("/rounding/", "/f64/")]))),
                                  1e-30)
           for k in golden if k.startswith(f"{prefix}/rounding/")]
    return float(np.percentile(rel, 75))


@pytest.fixture(scope="module")
def golden():
    out = dict(np.load(os.path.join(FIXTURES, "stylegan2_official_outputs.npz")))
    for name in SNAPSHOTS:
        out[f"{name}/typical"] = typical_rounding(out, name)
    return out


def snapshot(name):
    return torch_pickle.load(os.path.join(FIXTURES, f"stylegan2_official_{name}.pkl"))


def networks(name):
    """(objects, config, G_ema, G, D) of a snapshot, ours built from its kwargs and
    given its weights."""
    objects = snapshot(name)
    model = imp.model_config(objects)
    data = dict(model)
    shape = (data.pop("resolution"),) * 2 + (data.pop("img_channels"),)
    classes = data.pop("num_classes")
    kwargs = {k: v for k, v in data.items() if k not in ("name", "conditional")}
    # Minibatch std over the official forward's rows: one chunk of the batch of 4 (the
    # official groups rows j, j + 2 of a GPU's batch: model.mbstd_chunk = batch_gpu).
    kwargs["mbstd_chunk"] = 4
    nets = {}
    for net in ("G_ema", "G", "D"):
        g, d = architectures.build("stylegan2", data_shape=shape, num_classes=classes, **kwargs)
        nets[net] = d if net == "D" else g
        imp.assign(nets[net], objects[net], "D" if net == "D" else "G")
    return objects, model, nets["G_ema"], nets["G"], nets["D"]


def close(golden, prefix, what, got):
    """|got - float64| <= 3 x the official float32 rounding of this output."""
    want = golden[f"{prefix}/f64/{what}"]
    bound = 3 * max(float(golden[f"{prefix}/rounding/{what}"]),
                    golden[f"{prefix}/typical"] * float(np.max(np.abs(want))))
    err = float(np.max(np.abs(np.asarray(got, np.float64) - want)))
    assert err <= bound, (prefix, what, err, bound)
    return err


def nchw(images):
    return np.transpose(np.asarray(images), (0, 3, 1, 2))


@pytest.mark.parametrize("name", SNAPSHOTS)
def test_the_networks_compute_the_official_functions(golden, name):
    _, model, g_ema, g, d = networks(name)
    z = tf.constant(golden[f"{name}/z"])
    labels = tf.constant(golden[f"{name}/labels"]) if model["conditional"] else None
    real = tf.constant(np.transpose(golden[f"{name}/img"], (0, 2, 3, 1)))
    d_in = (lambda x: [x, labels]) if labels is not None else (lambda x: x)
    mapping, synthesis = sg2.parts(g_ema)
    w = mapping([z, labels] if labels is not None else z, training=False)
    ws = np.tile(np.asarray(w)[:, None], [1, synthesis.num_ws, 1])
    close(golden, name, "ws_psi1", ws)
    close(golden, name, "ws_psi07", sg2.truncate(ws, mapping.w_avg, 0.7))
    close(golden, name, "img_ema", nchw(sg2.sample(g_ema, z, labels)))
    close(golden, name, "d_fake_ema", d(d_in(sg2.sample(g_ema, z, labels)), training=False))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(real)
        d_real = tf.reduce_sum(d(d_in(real), training=False))
        fake = sg2.sample(g, z, labels)
        d_gen = d(d_in(fake), training=False)
        total = tf.reduce_sum(d_gen)
    close(golden, name, "img_G", nchw(fake))
    close(golden, name, "d_real", np.asarray(d(d_in(real), training=False)))
    close(golden, name, "d_gen", d_gen)
    close(golden, name, "d_real_grad_img", nchw(tape.gradient(d_real, real)))
    # Every weight's gradient of D(G(z)).sum(), in the official layout's terms.
    checked = 0
    for kind, net in (("G", g), ("D", d)):
        weights = net.trainable_weights
        grads = dict(zip([w.path for w in weights],
                         tape.gradient(total, weights,
                                       unconnected_gradients=tf.UnconnectedGradients.ZERO)))
        for key in golden:
            head = f"{name}/f32/grad_{kind}/"
            if not key.startswith(head):
                continue
            official = key[len(head):]
            ours = grads[imp._ours(official, kind)]
            want_layout = imp._layout(official, golden[f"{name}/f64/grad_{kind}/{official}"],
                                      kind)
            bound_key = f"grad_{kind}/{official}"
            golden_view = {f"{name}/f64/{bound_key}": want_layout,
                           f"{name}/rounding/{bound_key}": golden[f"{name}/rounding/{bound_key}"],
                           f"{name}/typical": golden[f"{name}/typical"]}
            close(golden_view, name, bound_key, ours)
            checked += 1
    assert checked >= 50, checked


def test_a_pickle_that_would_run_code_is_refused_before_it_runs(tmp_path):
    # The official loader executes the source a snapshot carries; ours calls nothing a
    # pickle names. A pickle whose load would run a shell command is refused in one
    # line, and the command never runs.
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    path = tmp_path / "network-snapshot-000000.pkl"
    path.write_bytes(pickle.dumps({"G": Evil()}))
    with pytest.raises(torch_pickle.PickleRefused, match=r"references (posix|os)\.system"):
        torch_pickle.load(str(path))
    assert not marker.exists()
    # The same through the official snapshot's own mechanism: a persistent object whose
    # embedded module source would run code when exec'd (the official loader does).
    objects = snapshot("fp32")
    assert "def " in objects["G"].module_src  # Kept as text, never executed.


@pytest.mark.parametrize("edit, words", [
    (lambda o: o["D"].state["_init_kwargs"].update(architecture="skip"),
     "D has architecture='skip'"),
    (lambda o: o["D"].state["_init_kwargs"].update(channel_max=32),
     "D has channel_max=32"),
    (lambda o: o["G"].state["_init_kwargs"]["synthesis_kwargs"].update(architecture="resnet"),
     "G has synthesis_kwargs.architecture='resnet'"),
    (lambda o: o.pop("G_ema"), "no official 'G_ema' network"),
    (lambda o: o["D"].state["_init_kwargs"].update(
        epilogue_kwargs={"mbstd_group_size": 2, "mbstd_num_channels": 2}),
     "D has epilogue_kwargs.mbstd_num_channels=2"),
])
def test_what_cannot_be_expressed_is_named(edit, words):
    objects = snapshot("fp32")
    edit(objects)
    with pytest.raises(errors.ConfigError, match=words.replace("(", r"\(")):
        imp.model_config(objects)


def test_the_snapshots_freeze_d_is_kept():
    objects = snapshot("orig")
    assert imp.model_config(objects)["d_freeze_layers"] == 0
    objects["D"].state["_init_kwargs"]["block_kwargs"] = {"freeze_layers": 3}
    assert imp.model_config(objects)["d_freeze_layers"] == 3


@pytest.mark.parametrize("edit, words", [
    (lambda sd: sd.__setitem__("b8.resample_filter", sd["b8.resample_filter"] * 2),
     "is not the \\[1, 3, 3, 1\\] filter"),
    (lambda sd: sd.pop("b4.fc.bias"), "D weights with no official tensor: b4_fc/bias"),
    (lambda sd: sd.__setitem__("b4.extra.weight", np.zeros((2, 2), np.float32)),
     "b4.extra.weight \\(2, 2\\) has no weight here"),
])
def test_a_snapshot_whose_tensors_do_not_map_is_refused(monkeypatch, edit, words):
    objects = snapshot("fp32")
    _, _, _, _, d = networks("fp32")
    state = torch_pickle.state_dict(objects["D"])
    edit(state)
    monkeypatch.setattr(torch_pickle, "state_dict", lambda net: state)
    before = [w.numpy() for w in d.weights]
    with pytest.raises(errors.ConfigError, match=words):
        imp.assign(d, objects["D"], "D")
    for w, b in zip(d.weights, before):  # Nothing assigned.
        np.testing.assert_array_equal(w.numpy(), b)


def test_a_snapshot_of_another_shape_is_refused_before_any_weight_moves():
    objects = snapshot("fp32")
    g, _ = architectures.build("stylegan2", data_shape=(16, 16, 3), latent_dim=8, w_dim=8,
                               mapping_layers=2, fmaps=256 / 32768, channel_max=32,
                               mbstd_group=2)
    before = [w.numpy() for w in g.weights]
    with pytest.raises(errors.ConfigError, match="does not fit"):
        imp.assign(g, objects["G"], "G")
    for w, b in zip(g.weights, before):
        np.testing.assert_array_equal(w.numpy(), b)


def test_the_import_tool_writes_a_run_that_samples_the_official_images(golden, tmp_path):
    # tools/import_stylegan2.py: a run directory (run.json, checkpoint 0) that the
    # package's tools read as any run; the EMA generator sampled from it is the
    # snapshot's G_ema (the official images), ADA's p the snapshot's.
    from conftest import run_in_process
    from tf_gan_scale import training
    from tf_gan_scale.artifacts import sampling
    workdir = tmp_path / "imported"
    proc = run_in_process(["tools/import_stylegan2.py", f"--workdir={workdir}", "--preset=cifar",
                           f"--pkl={os.path.join(FIXTURES, 'stylegan2_official_cond_fp16.pkl')}",
                           "--freezed=2"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    info = __import__("json").loads(proc.stdout.strip().splitlines()[-1])
    assert (info["ada_p"], info["data_shape"], info["num_classes"]) == (0.25, [16, 16, 3], 3)
    assert sorted(os.listdir(workdir)) == ["checkpoints", "run.json"]
    config, shape, classes = training.load_run(str(workdir))
    assert (config.model.num_fp16_res, config.model.conv_clamp, config.train.augment) == (
        2, 256.0, "ada")
    assert config.model.d_freeze_layers == 2  # --freezed, as the official's.
    # experiments/recorded.py:DIR, the config to train on from it, is the recorded one.
    recorded = __import__("runpy").run_path(os.path.join(
        os.path.dirname(__file__), "..", "..", "experiments", "recorded.py"))
    assert recorded["get_config"](str(workdir)).to_dict() == config.to_dict()
    generator, _, step, _ = sampling.load_generator(str(workdir))
    assert step == 0
    z, labels = golden["cond_fp16/z"], golden["cond_fp16/labels"]
    close(golden, "cond_fp16", "img_ema", nchw(sg2.sample(generator, z, labels)))
    p = tf.Variable(0.0)
    tf.train.Checkpoint(ada_p=p).read(str(workdir / "checkpoints" / "ckpt-0")).expect_partial()
    assert float(p.numpy()) == 0.25
    # A .keras file of it, as of any run (tools/keras_file.py).
    proc = run_in_process(["tools/keras_file.py", f"--workdir={workdir}",
                           f"--to_keras={tmp_path / 'imported.keras'}"])
    assert proc.returncode == 0 and (tmp_path / "imported.keras").stat().st_size > 0, (
        proc.stderr[-2000:])


def test_an_import_writes_nothing_over_a_run_and_nothing_from_a_bad_pickle(tmp_path):
    from conftest import run_in_process
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text("{}")
    evil = tmp_path / "evil.pkl"
    evil.write_bytes(pickle.dumps(os.system))
    good = os.path.join(FIXTURES, "stylegan2_official_fp32.pkl")
    cases = [([f"--pkl={good}", f"--workdir={run}"], "is not empty"),
             ([f"--pkl={evil}", f"--workdir={tmp_path / 'new'}"], "references posix.system"),
             ([f"--pkl={tmp_path / 'none.pkl'}", f"--workdir={tmp_path / 'new'}"],
              "is not a file"),
             ([f"--pkl={good}", f"--workdir={tmp_path / 'new'}", "--preset=huge"],
              "--preset")]
    for args, words in cases:
        proc = run_in_process(["tools/import_stylegan2.py", *args])
        assert proc.returncode != 0 and words in proc.stderr.strip().splitlines()[-1], (
            args, proc.stderr[-1000:])
    assert (run / "run.json").read_text() == "{}" and os.listdir(run) == ["run.json"]
    assert sorted(os.listdir(tmp_path)) == ["evil.pkl", "run"]


@pytest.mark.slow  # ~60 s: the StyleGAN2-ADA step with its phases traced.
def test_an_imported_snapshot_fine_tunes_on_new_data(tmp_path):
    # The import with a data source, then the training binary on the recorded config
    # (experiments/recorded.py): it resumes from the snapshot (step 0) and trains.
    from conftest import run_cmd
    rng = np.random.default_rng(0)
    data = tmp_path / "data.npz"
    np.savez(data, x=rng.integers(0, 255, (64, 16, 16, 3), dtype=np.uint8),
             y=rng.integers(0, 3, 64))
    workdir = tmp_path / "run"
    proc = run_cmd(["tools/import_stylegan2.py", f"--workdir={workdir}", "--preset=cifar",
                    f"--pkl={os.path.join(FIXTURES, 'stylegan2_official_cond_fp16.pkl')}",
                    f"--data_source=npz:{data}"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = run_cmd(["-m", "tf_gan_scale.main", f"--config=experiments/recorded.py:{workdir}",
                    f"--workdir={workdir}", "--config.train.num_steps=2",
                    "--config.train.checkpoint_every=2"], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"resumed {workdir}/checkpoints/ckpt-0" in proc.stderr, proc.stderr[-3000:]
    assert os.path.exists(workdir / "checkpoints" / "ckpt-2.index")


def _torch_like(monkeypatch, offset, size, stride, count=4):
    """A pickle in torch's own format, written without torch: fake `torch` modules whose
    globals pickle under torch's names. One float32 storage of `count` elements, one
    tensor view of it (offset, size, stride)."""
    import sys
    import types
    mods = {n: types.ModuleType(n) for n in ("torch", "torch._utils", "torch.storage")}
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)

    class FloatStorage:
        pass

    def _load_from_bytes(b):
        return b

    def _rebuild_tensor_v2(*args):
        return args

    for mod, obj in ((mods["torch"], FloatStorage), (mods["torch.storage"], _load_from_bytes),
                     (mods["torch._utils"], _rebuild_tensor_v2)):
        obj.__module__, obj.__qualname__ = mod.__name__, obj.__name__
        setattr(mod, obj.__name__, obj)

    class Inner(pickle.Pickler):
        def persistent_id(self, obj):
            return ("storage", FloatStorage, "k0", "cpu", count, None) if obj == "S" else None

    buf = io.BytesIO()
    for item in (torch_pickle.LEGACY_MAGIC, torch_pickle.LEGACY_PROTOCOL,
                 {"protocol_version": 1001, "little_endian": True}):
        pickle.dump(item, buf, protocol=2)
    Inner(buf, protocol=2).dump("S")
    pickle.dump(["k0"], buf, protocol=2)
    buf.write(np.array([count], "<i8").tobytes() + np.arange(count, dtype="<f4").tobytes())

    class Tensor:
        def __reduce__(self):
            return (_rebuild_tensor_v2, (Storage(), offset, size, stride, False, None))

    class Storage:
        def __reduce__(self):
            return (_load_from_bytes, (buf.getvalue(),))

    return pickle.dumps({"t": Tensor()}, protocol=4)





@pytest.mark.parametrize("offset, size, stride, ok", [
    (1, (3,), (1,), True),            # Inside: elements 1..3.
    (0, (2, 2), (1, 2), True),        # A transposed 2x2 view.
    (0, (4096,), (1,), False),        # Past the storage: would read the heap.
    (0, (2,), (1 << 40,), False),     # A stride far outside (crashed the process).
    (-1, (2,), (1,), False),
])
def test_tensor_views_must_lie_inside_their_storage(tmp_path, monkeypatch, offset, size,
                                                    stride, ok):
    path = tmp_path / "t.pkl"
    path.write_bytes(_torch_like(monkeypatch, offset, size, stride))
    if ok:
        got = torch_pickle.load(str(path))["t"]
        want = np.lib.stride_tricks.as_strided(np.arange(4, dtype=np.float32)[offset:], size,
                                               tuple(4 * s for s in stride))
        np.testing.assert_array_equal(got, want)
    else:
        with pytest.raises(torch_pickle.PickleRefused, match="outside its storage"):
            torch_pickle.load(str(path))


def test_object_arrays_and_an_existing_neighbour_are_safe(tmp_path):
    # numpy's reconstructors are allowed (numbers in a snapshot's state); arrays of
    # Python objects are not. And an import stages beside the workdir in a directory of
    # its own: a neighbour named like it survives.
    path = tmp_path / "o.pkl"
    path.write_bytes(pickle.dumps(np.array([1, "a"], dtype=object)))
    with pytest.raises(torch_pickle.PickleRefused, match="holds Python objects"):
        torch_pickle.load(str(path))
    neighbour = tmp_path / "run.importing"
    neighbour.mkdir()
    (neighbour / "keep.txt").write_text("keep")
    imp.import_snapshot(os.path.join(FIXTURES, "stylegan2_official_orig.pkl"),
                        str(tmp_path / "run"), preset="cifar")
    assert (neighbour / "keep.txt").read_text() == "keep"
    assert sorted(os.listdir(tmp_path)) == ["o.pkl", "run", "run.importing"]
