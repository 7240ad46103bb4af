"""The ``ray`` adapter: `RayBackend`, replicas of any registered backend as Ray actors (docs/adapters/ray.md).

Its parts: the backend and its router (`_backend`), the actor hosting one replica (`_actor`), joining or
starting a cluster and placement (`_cluster`), one replica's slot on the driver (`_slot`) and starting
replicas (`_start`). Importing this package imports Ray.
"""

from ._backend import RayBackend

__all__ = ["RayBackend"]
