"""The ``healthkit`` command (``python -m healthkit``): ``demo``, ``doctor``, ``explain``,
``stacks``. It sits on top of the library and nothing in the library imports it; the demo
scenarios that run torchrun import torch there and only there."""
