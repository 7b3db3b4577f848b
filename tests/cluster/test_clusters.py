"""Cluster specs for Slurm and Kubernetes, the shipped examples, and the TPU path up to
the resolver (nothing here has a TPU)."""

import json
import os
import re
import runpy
import subprocess

import pytest
import tensorflow as tf

from conftest import REPO, run_cmd, run_in_process
from tf_gan_scale import errors
from tf_gan_scale import distribute
from tf_gan_scale.cluster import env as cluster_env
from tf_gan_scale.cluster import kubernetes
from tf_gan_scale import training

# What srun sets for `--nodes=2 --ntasks-per-node=2` (experiments/slurm/train.sbatch).
SLURM_2x2 = {"SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
             "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_TASKS_PER_NODE": "2(x2)"}


def test_slurm_cluster_block_layout_and_ports():
    workers = ["gpu07:8888", "gpu07:8889", "gpu08:8888", "gpu08:8889"]
    for rank in range(4):
        cluster, index = cluster_env.slurm_cluster(dict(SLURM_2x2, SLURM_PROCID=str(rank)))
        assert cluster == {"worker": workers} and index == rank
    cluster, _ = cluster_env.slurm_cluster({"SLURM_JOB_NODELIST": "a1,b[3-4]",
                                         "SLURM_TASKS_PER_NODE": "1(x2),2",
                                         "SLURM_PROCID": "3", "TF_GAN_SCALE_PORT": "9000"})
    assert cluster == {"worker": ["a1:9000", "b3:9000", "b4:9000", "b4:9001"]}


def test_slurm_resolver_on_a_cpu_only_node():
    # TensorFlow's SlurmClusterResolver needs nvidia-smi / a GPU count (tensorflow#56894).
    resolver = distribute.slurm_resolver(dict(SLURM_2x2, SLURM_PROCID="2"), num_gpus=0)
    assert resolver.cluster_spec().as_dict() == {
        "worker": ["gpu07:8888", "gpu07:8889", "gpu08:8888", "gpu08:8889"]}
    assert (resolver.task_type, resolver.task_id) == ("worker", 2)
    assert resolver.num_accelerators() == {"GPU": 0}


@pytest.mark.parametrize("env, message", [
    ({}, "SLURM_STEP_NODELIST is not set; run inside a Slurm job step"),
    (dict(SLURM_2x2, SLURM_PROCID="4"), "SLURM_PROCID=4 but the step has 4 tasks (valid: 0..3)"),
    (dict(SLURM_2x2, SLURM_PROCID="0", SLURM_STEP_TASKS_PER_NODE="2"),
     "2 hosts in 'gpu[07-08]' but 1 entries in tasks-per-node '2'"),
    (dict(SLURM_2x2, SLURM_PROCID="0", SLURM_STEP_TASKS_PER_NODE="x"), "bad Slurm variables"),
])
def test_slurm_bad_environment_is_a_clear_error(env, message):
    with pytest.raises(errors.ConfigError, match=re.escape(message)):
        cluster_env.slurm_cluster(env)


SBATCH = f"{REPO}/experiments/slurm/train.sbatch"


def test_sbatch_example_runs_the_slurm_resolver_with_its_layout():
    text = open(SBATCH).read()
    nodes = int(re.search(r"#SBATCH --nodes=(\d+)", text).group(1))
    per_node = int(re.search(r"#SBATCH --ntasks-per-node=(\d+)", text).group(1))
    assert (nodes, per_node) == (2, 2)  # = SLURM_2x2 above.
    assert "--strategy=multi_worker_mirrored --cluster_resolver=slurm" in text
    default = re.search(r"CONFIG=\$\{CONFIG:-(\S+)\}", text).group(1)
    # The config it names (what srun runs without CONFIG: see the next test) loads.
    assert default == "experiments/dcgan_mnist.py"
    assert_config_loads(default)


def assert_config_loads(path):
    """`path` (relative to the repo) is a config file whose get_config() gives a config
    of the binary: data, model and train sections."""
    assert os.path.isfile(f"{REPO}/{path}"), path
    config = runpy.run_path(f"{REPO}/{path}")["get_config"]()
    assert {"data", "model", "train"} <= set(config.keys()), (path, sorted(config.keys()))
    training.validate(config, num_replicas=1)  # Names and numbers the binary accepts.


def sbatch_srun_args(tmp_path, *args, **env):
    """What the sbatch script passes to srun, run with a stand-in `srun` that prints it."""
    fake = tmp_path / "bin" / "srun"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text("#!/bin/sh\nprintf '%s\\n' \"$@\"\n")
    fake.chmod(0o755)
    full_env = {k: v for k, v in os.environ.items() if k not in ("CONFIG", "WORKDIR", "MESH")}
    full_env.update(env, PATH=f"{fake.parent}:{os.environ['PATH']}")
    proc = subprocess.run(["bash", SBATCH, *args], cwd=REPO, env=full_env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


@pytest.mark.parametrize("args, env, config, extra", [
    ((), {}, "experiments/dcgan_mnist.py", []),
    ((), {"CONFIG": "experiments/digits.py"}, "experiments/digits.py", []),
    (("experiments/gauss2d.py", "--config.train.num_steps=5"), {"CONFIG": "experiments/digits.py"},
     "experiments/gauss2d.py", ["--config.train.num_steps=5"]),
    (("--config.train.num_steps=5",), {"CONFIG": "experiments/digits.py"},
     "experiments/digits.py", ["--config.train.num_steps=5"]),
])
def test_sbatch_config_is_chosen_by_argument_or_environment(tmp_path, args, env, config, extra):
    argv = sbatch_srun_args(tmp_path, *args, **env)
    name = os.path.basename(config)[:-len(".py")]
    assert argv[argv.index("python"):] == [
        "python", "-m", "tf_gan_scale.main", "--strategy=multi_worker_mirrored",
        "--cluster_resolver=slurm", "--peer_timeout_s=60", f"--config={config}",
        f"--workdir={REPO}/runs/{name}_slurm", *extra]
    assert_config_loads(config)
    argv = sbatch_srun_args(tmp_path, *args, WORKDIR="/shared/run", **env)
    assert "--workdir=/shared/run" in argv


def test_sbatch_runs_a_dtensor_mesh_when_asked(tmp_path):
    # Every task a DTensor client; the binary derives DTENSOR_* from the Slurm variables
    # (tests/parallel/test_parallel_clients.py), so no strategy flag.
    argv = sbatch_srun_args(tmp_path, "experiments/digits.py", MESH="batch:2,model:2")
    assert argv[argv.index("python"):] == [
        "python", "-m", "tf_gan_scale.main", "--mesh=batch:2,model:2",
        "--config=experiments/digits.py", f"--workdir={REPO}/runs/digits_slurm"]


def test_kubernetes_manifest_gives_each_pod_its_tf_config():
    manifest = kubernetes.kubernetes_manifest("gan", 3, "img:1", ["python", "-m", "x"],
                                            gpus_per_worker=2, volume_claim="runs")
    service, *pods = manifest["items"]
    assert service["kind"] == "Service" and service["spec"]["clusterIP"] == "None"
    hosts = [f"gan-worker-{i}.gan:8888" for i in range(3)]
    for i, pod in enumerate(pods):
        assert pod["metadata"]["name"] == f"gan-worker-{i}"
        assert (pod["spec"]["hostname"], pod["spec"]["subdomain"]) == (f"gan-worker-{i}", "gan")
        (container,) = pod["spec"]["containers"]
        (env,) = container["env"]
        assert json.loads(env["value"]) == {"cluster": {"worker": hosts},
                                            "task": {"type": "worker", "index": i}}
        assert container["resources"]["limits"] == {"nvidia.com/gpu": 2}
        assert container["volumeMounts"][0]["mountPath"] == "/workdir"


def test_shipped_kubernetes_example_is_what_the_tool_prints():
    path = f"{REPO}/experiments/kubernetes/dcgan_mnist_2workers.yaml"
    shipped = json.load(open(path))
    pod = shipped["items"][1]["spec"]["containers"][0]
    cmd = [a for a in pod["command"]]
    proc = run_in_process(["tools/k8s_manifest.py", "--name=dcgan", "--num_workers=2",
                           f"--image={pod['image']}", "--gpus_per_worker=1",
                           "--volume_claim=runs", "--", *cmd])
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == shipped
    assert "--strategy=multi_worker_mirrored" in cmd
    # The config every pod trains: the one the Slurm example trains by default.
    (config,) = [a.split("=", 1)[1] for a in cmd if a.startswith("--config=")]
    assert config == "experiments/dcgan_mnist.py"
    assert_config_loads(config)


# In this process, and once as the real tool (the exit code and the one line end to end).
@pytest.mark.parametrize("run", [run_in_process, pytest.param(run_cmd, marks=pytest.mark.slow)],
                         ids=["in_process", "subprocess"])
def test_kubernetes_tool_bad_name_is_one_line(run):
    proc = run(["tools/k8s_manifest.py", "--name=Bad_Name", "--num_workers=2",
                "--image=i", "--", "python"])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("error: --name must be a DNS label"), proc.stderr
    assert "Received: 'Bad_Name'" in proc.stderr


def test_tpu_path_up_to_the_resolver():
    # A grpc:// address resolves without any cloud lookup (what --tpu=grpc://... builds).
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="grpc://10.0.0.2:8470")
    assert resolver.master() == "grpc://10.0.0.2:8470"
    assert resolver.cluster_spec().as_dict() == {"worker": ["10.0.0.2:8470"]}
