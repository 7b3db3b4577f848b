"""Test helpers: shared models and configs, multi-process launchers and checkpoint
comparisons, graph inspection, warm process starts, and the scripts tests run as
processes (equivalence_run.py, group_bn_run.py, mesh_helpers.py)."""
