"""The base layer: errors, the allowed ranges of user numbers, atomic files, the detections table."""
