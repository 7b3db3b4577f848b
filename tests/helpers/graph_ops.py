"""Counting collectives in traced graphs (no side effects: safe for subprocess scripts)."""

ALL_REDUCE_OPS = ("CollectiveReduce", "CollectiveReduceV2", "CollectiveReduceV3",
                  "NcclAllReduce")


def all_reduces_per_replica(graph, strategy):
    """All-reduce ops in `graph` and the functions it calls, per local replica."""
    count = sum(op.type in ALL_REDUCE_OPS for op in graph.get_operations())
    for fn in graph.as_graph_def().library.function:
        count += sum(node.op in ALL_REDUCE_OPS for node in fn.node_def)
    return count // len(strategy.extended.worker_devices)
