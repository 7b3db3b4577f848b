"""python probe.py SPEC CASE [slices]"""
import os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, "/work/wtsg"); sys.path.insert(0, "/work/wtsg/tests/helpers")
from tf_gan_scale import distribute
distribute.configure_cpu_devices(2)
from tf_gan_scale import parallel
import numpy as np, tensorflow as tf
from tensorflow.experimental import dtensor
from tf_gan_scale.layers import stylegan as S
spec, case = sys.argv[1], sys.argv[2]
flags = set(sys.argv[3:])
S.SLICE_RESAMPLING = "slices" in flags
import mesh_helpers as mh
from tf_gan_scale import training, latents
from tf_gan_scale.cluster import mesh_spec
from tf_gan_scale.parallel import layouts, mesh as mesh_lib, step as step_lib, tensors
c = mh.config("stylegan2", "sgd")
gan = training.build_gan(c, (8, 8, 1), 0)
dims = mesh_spec.parse(spec)
mesh = mesh_lib.make(dims, "CPU")
plan = layouts.plan((gan.generator, gan.discriminator), dims)
print("split:", [p for p, s in plan.items() if any(s)], flush=True)
trainer = step_lib.MeshTrainer(gan, mesh, plan)
G, D = gan.generator, gan.discriminator
GB = 8
rng = np.random.default_rng(0)
z = tensors.to_mesh(rng.standard_normal((GB, 8)).astype(np.float32), mesh, ("batch", None))
x = tensors.to_mesh(rng.standard_normal((GB, 8, 8, 1)).astype(np.float32), mesh, ("batch", None, None, None))
from tf_gan_scale.architectures import stylegan2 as sg
mapping, synthesis = sg.parts(G)

def rows():
    return tf.range(GB)

def run(fn, *args):
    out = tf.function(fn, autograph=False)(*args)
    print(case, "OK", [float(tf.reduce_sum(tensors.gather(o))) for o in tf.nest.flatten(out)][:4], flush=True)

if case == "gfwd":
    def f(z):
        with latents.example_rows(rows()):
            return G(z, training=True)
    run(f, z)
elif case == "gfwd_eval":
    run(lambda z: G(z, training=False), z)
elif case == "dfwd":
    run(lambda x: D(x, training=True), x)
elif case == "dgrad":
    def f(x):
        with tf.GradientTape() as t:
            y = tf.reduce_sum(D(x, training=True))
        return t.gradient(y, D.trainable_weights)
    run(f, x)
elif case == "dgrad_input":
    def f(x):
        with tf.GradientTape() as t:
            t.watch(x)
            y = tf.reduce_sum(D(x, training=True))
        return t.gradient(y, x)
    run(f, x)
elif case == "ggrad_eval":
    def f(z):
        with tf.GradientTape() as t:
            y = tf.reduce_sum(tf.square(G(z, training=False)))
        return t.gradient(y, G.trainable_weights)
    run(f, z)
elif case == "ggrad":
    def f(z):
        with tf.GradientTape() as t:
            with latents.example_rows(rows()):
                y = tf.reduce_sum(tf.square(G(z, training=True)))
        return t.gradient(y, G.trainable_weights)
    run(f, z)
elif case == "gdgrad":
    def f(z):
        with tf.GradientTape() as t:
            with latents.example_rows(rows()):
                y = tf.reduce_sum(D(G(z, training=True), training=True))
        return t.gradient(y, G.trainable_weights)
    run(f, z)
elif case == "step":
    b = trainer.batch(rng.standard_normal((GB, 8, 8, 1)).astype(np.float32))
    print("step OK", trainer.train_step([b]), flush=True)
else:
    # generic: CASE is a python lambda body over (z, x, x4, ws) 
    x4 = tensors.to_mesh(rng.standard_normal((GB, 4, 4, 8)).astype(np.float32), mesh, ("batch", None, None, None))
    ws = tensors.to_mesh(rng.standard_normal((GB, synthesis.num_ws, 8)).astype(np.float32), mesh, ("batch", None, None))
    body = case
    fn = eval("lambda z, x, x4, ws: " + body)
    if "grad" in flags:
        def g(z, x, x4, ws):
            with tf.GradientTape() as t:
                t.watch([z, x, x4, ws])
                y = tf.reduce_sum(tf.square(fn(z, x, x4, ws)))
            return t.gradient(y, [z, x4, ws])
        run(g, z, x, x4, ws)
    else:
        run(fn, z, x, x4, ws)
