"""The built-in workloads (trainables/workloads/base.py), written against the same interface
a user's own workload uses: ``image_classification`` (the seeds' ViT and ResNet-50 on
random images, with their model presets in ``vision_models`` and data in
``random_images``)."""
