"""Decoding, frame access, low-res renditions and the pipelined preprocessing runtime."""
