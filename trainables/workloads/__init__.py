"""The built-in workloads (trainables/workloads/base.py), written against the same interface
a user's own workload uses, each with the study in sweeps/ that composes it:
``image_classification`` (the seeds' ViTs and ResNet-50: presets in ``vision_models``),
``cpu_resnet`` (seed 003's CPU post), ``varlen_gpt`` (variable-length sequences) and
``metric_collection`` (per-step TorchMetrics); their random images in ``random_images``."""
