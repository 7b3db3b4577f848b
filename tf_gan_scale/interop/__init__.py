"""Weights from other code bases in: official StyleGAN2-ADA snapshots (stylegan2.py), read
without PyTorch and without running the pickle's code (torch_pickle.py)."""
