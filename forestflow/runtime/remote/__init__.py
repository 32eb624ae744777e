"""The ``RemoteV2`` flavor: models served by another Open Inference Protocol (KServe V2) server."""
