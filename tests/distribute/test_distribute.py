import json
import types

import pytest
import tensorflow as tf

from conftest import run_cmd, run_in_process
from tf_gan_scale import distribute, errors


def test_strategy_names():
    assert isinstance(distribute.make_strategy("one_device"), tf.distribute.OneDeviceStrategy)
    # conftest made 2 logical CPUs, so auto picks mirrored over both.
    auto = distribute.make_strategy("auto")
    assert isinstance(auto, tf.distribute.MirroredStrategy)
    assert auto.num_replicas_in_sync == 2
    with pytest.raises(errors.ConfigError, match="unknown strategy 'gpu'; valid: auto, mirrored, "
                                                 "multi_worker_mirrored, one_device, tpu"):
        distribute.make_strategy("gpu")


def test_gpu_and_tpu_flags_fail_clearly_here():
    with pytest.raises(errors.ConfigError, match="--num_gpus=2 but this machine has no GPU"):
        distribute.make_strategy("mirrored", num_gpus=2)
    with pytest.raises(errors.ConfigError, match="--strategy=tpu needs --tpu="):
        distribute.make_strategy("tpu")


def test_cpu_devices_cannot_change_after_initialization():
    distribute.configure_cpu_devices(2)  # Same count: fine.
    with pytest.raises(errors.ConfigError, match="cannot split the CPU into 3 devices"):
        distribute.configure_cpu_devices(3)
    with pytest.raises(errors.ConfigError, match="must be >= 1"):
        distribute.configure_cpu_devices(0)


@pytest.mark.parametrize("raw", [
    "not json",
    json.dumps({"cluster": {"worker": ["localhost:1"]}}),
    json.dumps({"cluster": {"worker": ["localhost:1"]}, "task": {"type": "worker", "index": 3}}),
    json.dumps({"cluster": {"worker": ["localhost:1"]}, "task": {"type": "ps", "index": 0}}),
])
def test_bad_tf_config_is_named(monkeypatch, raw):
    monkeypatch.setenv("TF_CONFIG", raw)
    with pytest.raises(errors.ConfigError, match="bad TF_CONFIG"):
        distribute.make_strategy("multi_worker_mirrored")


def test_single_host_is_chief(one_device):
    assert distribute.is_chief(one_device)


# --- cluster detection: --strategy=auto and the single-process strategies -------------

def tf_config(num_workers, index=0, chief=False):
    cluster = {"worker": [f"localhost:{2000 + i}" for i in range(num_workers)]}
    if chief:
        cluster["chief"] = ["localhost:1999"]
    return json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})


# What srun sets in each task of `srun --nodes=2 --ntasks-per-node=2` (rank 1 here).
SLURM_STEP_2x2 = {"SLURM_PROCID": "1", "SLURM_STEP_NODELIST": "gpu[07-08]",
                  "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_TASKS_PER_NODE": "2(x2)"}
# The batch script itself (no srun) of the same job: one process, job-level variables.
SLURM_BATCH_SCRIPT = {"SLURM_PROCID": "0", "SLURM_JOB_NODELIST": "gpu[07-08]",
                      "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_NTASKS": "4"}


@pytest.mark.parametrize("env, expected", [
    ({}, ("auto", "tf_config")),
    ({"TF_CONFIG": tf_config(1)}, ("auto", "tf_config")),
    ({"TF_CONFIG": tf_config(2, index=1)}, ("multi_worker_mirrored", "tf_config")),
    ({"TF_CONFIG": tf_config(1, chief=True)}, ("multi_worker_mirrored", "tf_config")),
    (SLURM_STEP_2x2, ("multi_worker_mirrored", "slurm")),
    (dict(SLURM_STEP_2x2, SLURM_STEP_TASKS_PER_NODE="1"), ("auto", "tf_config")),
    (SLURM_BATCH_SCRIPT, ("auto", "tf_config")),
])
def test_auto_trains_on_the_cluster_the_environment_describes(env, expected):
    assert distribute.choose_strategy("auto", "tf_config", env=env) == expected


@pytest.mark.parametrize("name", ["one_device", "mirrored"])
@pytest.mark.parametrize("env, cluster", [
    ({"TF_CONFIG": tf_config(2)}, "TF_CONFIG describes a cluster of 2 tasks"),
    ({"TF_CONFIG": tf_config(3, chief=True)}, "TF_CONFIG describes a cluster of 4 tasks"),
    (SLURM_STEP_2x2, "this Slurm job step has 4 tasks (SLURM_STEP_TASKS_PER_NODE='2(x2)')"),
])
def test_single_process_strategy_in_a_cluster_is_refused(name, env, cluster):
    with pytest.raises(errors.ConfigError) as e:
        distribute.choose_strategy(name, env=env)
    assert str(e.value) == (
        f"--strategy={name} trains in one process, but {cluster}: each task would train "
        f"alone and write the same workdir; use --strategy=multi_worker_mirrored (or auto)")


@pytest.mark.parametrize("name", ["auto", "one_device", "mirrored", "multi_worker_mirrored"])
def test_one_worker_tf_config_is_fine_for_every_strategy(name):
    env = {"TF_CONFIG": tf_config(1)}
    assert distribute.choose_strategy(name, env=env) == (name, "tf_config")


def test_one_device_strategy_is_created_under_a_one_worker_tf_config(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", tf_config(1))
    assert isinstance(distribute.make_strategy("one_device"), tf.distribute.OneDeviceStrategy)


def test_multi_worker_in_a_slurm_step_needs_the_slurm_resolver():
    with pytest.raises(errors.ConfigError, match="--cluster_resolver=tf_config finds no "
                                                 "cluster in TF_CONFIG, but this Slurm job "
                                                 "step has 4 tasks"):
        distribute.choose_strategy("multi_worker_mirrored", "tf_config", env=SLURM_STEP_2x2)
    assert distribute.choose_strategy("multi_worker_mirrored", "slurm", env=SLURM_STEP_2x2) == (
        "multi_worker_mirrored", "slurm")


def test_bad_slurm_step_variable_is_named():
    with pytest.raises(errors.ConfigError, match=r"bad SLURM_STEP_TASKS_PER_NODE='x'"):
        distribute.choose_strategy("auto", env=dict(SLURM_STEP_2x2, SLURM_STEP_TASKS_PER_NODE="x"))


# Refused from the environment alone, before any strategy exists: in this process
# (conftest.run_in_process, no process start); once more by the real binary (slow).
@pytest.mark.parametrize("run", [run_in_process,
                                 pytest.param(run_cmd, marks=pytest.mark.slow)],
                         ids=["in_process", "subprocess"])
def test_binary_refuses_mirrored_on_a_two_worker_tf_config(tmp_path, run):
    workdir = tmp_path / "run"
    proc = run(["-m", "tf_gan_scale.main", "--config=experiments/digits.py",
                f"--workdir={workdir}", "--strategy=mirrored"],
               env={"TF_CONFIG": tf_config(2)})
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert lines == ["error: --strategy=mirrored trains in one process, but TF_CONFIG "
                     "describes a cluster of 2 tasks: each task would train alone and write "
                     "the same workdir; use --strategy=multi_worker_mirrored (or auto)"]
    assert "Traceback" not in proc.stderr and not workdir.exists()


WHY_NOT_PS = ("ParameterServerStrategy is not supported: its workers update G and D "
              "asynchronously, each on its own batch with its own batch-norm statistics, so "
              "training is no longer what one device trains on the global batch; use "
              "--strategy=multi_worker_mirrored (synchronous, chief and worker tasks only) or "
              "a DTensor mesh (--mesh=batch:B,model:M)")
PS_CLUSTER = json.dumps({"cluster": {"chief": ["localhost:1999"], "worker": ["localhost:2000"],
                                     "ps": ["localhost:2001", "localhost:2002"]},
                         "task": {"type": "chief", "index": 0}})


@pytest.mark.parametrize("strategy, env, what", [
    ("parameter_server", {}, "--strategy=parameter_server"),
    ("auto", {"TF_CONFIG": PS_CLUSTER},
     "TF_CONFIG describes a parameter-server cluster (2 ps tasks; --strategy=auto)"),
    ("multi_worker_mirrored", {"TF_CONFIG": PS_CLUSTER},
     "TF_CONFIG describes a parameter-server cluster (2 ps tasks; "
     "--strategy=multi_worker_mirrored)"),
])
def test_binary_refuses_parameter_server_training_saying_why(tmp_path, strategy, env, what):
    workdir = tmp_path / "run"
    proc = run_in_process(["-m", "tf_gan_scale.main", "--config=experiments/digits.py",
                           f"--workdir={workdir}", f"--strategy={strategy}"], env=env)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert lines == [f"error: {what}: {WHY_NOT_PS}"]
    assert "Traceback" not in proc.stderr and not workdir.exists()


# --- which errors are reported as a lost peer ---------------------------------------

def worker(index, num_workers=2):
    """A stand-in for a MultiWorkerMirroredStrategy on worker `index` (its resolver)."""
    spec = tf.train.ClusterSpec({"worker": [f"localhost:{2000 + i}" for i in range(num_workers)]})
    return types.SimpleNamespace(cluster_resolver=tf.distribute.cluster_resolver
                                 .SimpleClusterResolver(spec, task_type="worker", task_id=index))


# Real messages of TensorFlow 2.21 from 2 local workers (tools/launch_local.py, digits
# config, --peer_timeout_s=3); only the op traceback in the middle is shortened.
HEAD = ('Graph execution error:\n\nDetected at node {node} defined at (most recent call last):\n'
        '  File "/work/main/tf_gan_scale/train_lib.py", line 188, in _train\n\n'
        '  File "/work/main/tf_gan_scale/gan.py", line 220, in train_function\n\n')
# Worker 1 was killed (SIGKILL); worker 0's error.
PEER_KILLED = HEAD.format(node="Cast_23/CollectiveReduceV2") + (
    'Collective ops is aborted by: recvmsg:Connection reset by peer\n'
    'Additional GRPC error information from remote target /job:worker/replica:0/task:1 while '
    'calling /tensorflow.WorkerService/RecvBuf:\n'
    ':UNKNOWN:Error received from peer  {grpc_message:"recvmsg:Connection reset by peer", '
    'grpc_status:14}\nThe error could be from a previous operation. Restart your program to '
    'reset.\n\t [[{{node Cast_23/CollectiveReduceV2}}]] [Op:__inference_train_function_3461]')
# Worker 0 (the coordination service's host) was killed; worker 1's error, eager op.
CHIEF_KILLED = (
    '{{function_node __wrapped__CollectiveReduceV2_Nordering_token_1_device_/job:worker/'
    'replica:0/task:1/device:CPU:0}} Collective ops is aborted by: recvmsg:Connection reset '
    'by peer\nAdditional GRPC error information from remote target /job:worker/replica:0/'
    'task:0 while calling /tensorflow.WorkerService/CompleteInstance:\n:UNKNOWN:Error received '
    'from peer  {grpc_status:14, grpc_message:"recvmsg:Connection reset by peer"}\nThe error '
    'could be from a previous operation. Restart your program to reset. '
    '[Op:CollectiveReduceV2] name: ')
# Worker 1 hung (SIGSTOP): no connection closed, its heartbeats stopped; worker 0's error.
PEER_HUNG = HEAD.format(node="CollectiveReduceV2_2") + (
    'Collective ops is aborted by: Error reported from /job:worker/task:1: The following '
    'tasks are unhealthy (stopped sending heartbeats):\n/job:worker/replica:0/task:1\nThe '
    'tasks have crashed. Check the task logs for an earlier error, or scheduler events (e.g. '
    'preemption, eviction) to debug further.\nThe error could be from a previous operation. '
    'Restart your program to reset.\n\t [[{{node CollectiveReduceV2_2}}]] '
    '[Op:__inference_compiled_4192]')
# Errors of the same types that are no peer's: GCS (TensorFlow's curl file system),
# a tf.data service, GCE credentials when saving to gs://.
GCS_READ = HEAD.format(node="MultiDeviceIteratorGetNextFromShard") + (
    "All 10 retry attempts failed. The last failure: Error executing an HTTP request: libcurl "
    "code 7 meaning 'Couldn't connect to server', error details: Failed to connect to "
    "storage.googleapis.com port 443 after 2 ms: Couldn't connect to server\n"
    "\t when reading gs://bucket/mnist/train-00000-of-00004.tfrecord\n"
    "\t [[{{node MultiDeviceIteratorGetNextFromShard}}]] [Op:__inference_train_function_3461]")
GCS_RESET = HEAD.format(node="IteratorGetNext") + (
    "Error executing an HTTP request: libcurl code 56 meaning 'Failure when receiving data "
    "from the peer', error details: Recv failure: Connection reset by peer\n"
    "\t when reading gs://bucket/mnist/train-00001-of-00004.tfrecord\n"
    "\t [[{{node IteratorGetNext}}]] [Op:__inference_train_function_3461]")
DATA_DEADLINE = HEAD.format(node="IteratorGetNext") + (
    "Failed to get element from tf.data service worker 10.0.0.5:5051: Deadline Exceeded\n"
    "\t [[{{node IteratorGetNext}}]] [Op:__inference_train_function_1207]")
GCE_TOKEN = ("All 10 retry attempts failed. The last failure: Unavailable: Error executing an "
             "HTTP request: libcurl code 6 meaning 'Couldn't resolve host name', error details: "
             "Couldn't resolve host 'metadata'\n\t when initiating an upload to "
             "gs://bucket/run/checkpoints/ckpt-10.index")
LOCAL = ("{{function_node __wrapped__IteratorGetNext_output_types_1_device_/job:localhost/"
         "replica:0/task:0/device:CPU:0}} Socket closed\n\t [[{{node IteratorGetNext}}]]")


@pytest.mark.parametrize("message, me, expected", [
    (PEER_KILLED, 0, "multi-worker run aborted, lost /job:worker/replica:0/task:1: Collective "
                     "ops is aborted by: recvmsg:Connection reset by peer"),
    (CHIEF_KILLED, 1, "multi-worker run aborted, lost /job:worker/replica:0/task:0: Collective "
                      "ops is aborted by: recvmsg:Connection reset by peer"),
    (PEER_HUNG, 0, "multi-worker run aborted, lost /job:worker/replica:0/task:1: Collective "
                   "ops is aborted by: Error reported from /job:worker/task:1: The following "
                   "tasks are unhealthy (stopped sending heartbeats):"),
    # The coordination service's verdict even when it names no other worker.
    ("The following tasks are unhealthy (stopped sending heartbeats):\n"
     "/job:worker/replica:0/task:0\nThe tasks have crashed.", 0,
     "multi-worker run aborted, lost a peer: The following tasks are unhealthy (stopped "
     "sending heartbeats):"),
])
def test_lost_peer_is_reported_as_one(message, me, expected):
    error = tf.errors.UnavailableError(None, None, message)
    assert distribute.abort_message(error, worker(me)) == expected


def test_a_lost_peer_line_names_its_log_file():
    # cluster.rank_log.peer_file's role: the file of /job:JOB/.../task:I.
    error = tf.errors.UnavailableError(None, None, PEER_KILLED)
    line = distribute.abort_message(error, worker(0),
                                    log_of=lambda job, i: f"/w/logs/{job}_{i}.log")
    assert line.startswith("multi-worker run aborted, lost /job:worker/replica:0/task:1: ")
    assert line.endswith("; last lines: /w/logs/worker_1.log")
    # No file named where none is known (one process, a workdir on gs://).
    assert "last lines" not in distribute.abort_message(error, worker(0), log_of=lambda j, i: None)


@pytest.mark.parametrize("error_type, message, expected", [
    (tf.errors.UnavailableError, GCS_READ,
     "UnavailableError: All 10 retry attempts failed. The last failure: Error executing an "
     "HTTP request: libcurl code 7 meaning 'Couldn't connect to server', error details: "
     "Failed to connect to storage.googleapis.com port 443 after 2 ms: Couldn't connect to "
     "server"),
    (tf.errors.UnavailableError, GCS_RESET,
     "UnavailableError: Error executing an HTTP request: libcurl code 56 meaning 'Failure "
     "when receiving data from the peer', error details: Recv failure: Connection reset by "
     "peer"),
    (tf.errors.DeadlineExceededError, DATA_DEADLINE,
     "DeadlineExceededError: Failed to get element from tf.data service worker "
     "10.0.0.5:5051: Deadline Exceeded"),
    (tf.errors.AbortedError, GCE_TOKEN,
     "AbortedError: All 10 retry attempts failed. The last failure: Unavailable: Error "
     "executing an HTTP request: libcurl code 6 meaning 'Couldn't resolve host name', "
     "error details: Couldn't resolve host 'metadata'"),
    (tf.errors.UnavailableError, LOCAL, "UnavailableError: Socket closed"),
])
def test_other_errors_keep_their_own_first_line(one_device, error_type, message, expected):
    error = error_type(None, None, message)
    assert distribute.abort_message(error, worker(0)) == expected
    # Without a cluster there are no peers at all, whatever the message says.
    assert distribute.abort_message(error, one_device) == expected
    assert distribute.abort_message(tf.errors.UnavailableError(None, None, PEER_KILLED),
                                    one_device).startswith("UnavailableError: Collective ops")
