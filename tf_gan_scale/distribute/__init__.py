"""tf.distribute: strategies by name (strategies.py) and the cost of their communication
(cost_model.py).

    distribute.configure_cpu_devices(4)   # before TensorFlow initializes its devices
    strategy = distribute.make_strategy("mirrored")
"""

from tf_gan_scale.cluster.env import cluster_from_env
from tf_gan_scale.distribute.strategies import (CLUSTER_RESOLVERS, COLLECTIVES, STRATEGIES,
                                                abort_message, choose_strategy,
                                                configure_cpu_devices, first_cause,
                                                is_chief, lost_peers, make_strategy,
                                                slurm_resolver)

__all__ = ["CLUSTER_RESOLVERS", "COLLECTIVES", "STRATEGIES", "abort_message",
           "choose_strategy", "cluster_from_env", "configure_cpu_devices", "first_cause",
           "is_chief", "lost_peers", "make_strategy", "slurm_resolver"]
