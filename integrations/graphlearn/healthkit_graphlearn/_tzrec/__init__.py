"""What replaces TorchEasyRec's own graph-learn plumbing, in one place.

tzrec's ``tzrec/datasets/sampler.py`` reads its rank from the environment, builds the GL
cluster spec (``_get_cluster_spec``: every node's server address, exchanged over
``torch.distributed``), imports graph-learn with its own build's settings, and calls
functions only TorchEasyRec's graph-learn build has. Each piece is here, checked and named:
``env`` (the rank and node a process is, from torchrun's variables), ``cluster`` (server
addresses and the cluster spec), ``gl_import`` (importing graph-learn safely, without
vineyard's abort), ``features`` (what the installed build can do, and the ``set_*``
wrappers that work on builds without tzrec's extras). The server launch and its watchdog are
``healthkit_graphlearn._server``; the client-side bounds ``_client`` and ``_worker``.
"""
