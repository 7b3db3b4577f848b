"""Clusters without TensorFlow: what the environment describes (env.py), the local
launcher (launch.py) and Kubernetes manifests (kubernetes.py). Nothing in this package
imports TensorFlow (tests/test_layering.py checks it)."""
