"""Synthetic video with ground truth, label importers and named benchmark datasets."""
