"""MemPrism as a service (issue 43): the :mod:`memprism_ray.memory` library behind HTTP/JSON on
Ray Serve (:mod:`memprism_ray.serve.app`), its sessions kept outside the replicas
(:mod:`memprism_ray.serve.store`). docs/memory.md "As a service"."""
