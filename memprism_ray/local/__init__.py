"""Ray on the machine you are on: a local head that ``make run`` submits the job to
(:mod:`memprism_ray.local.head`) and a cluster of several nodes, each with its own disk where
the machine allows it, for the multi-node tests and the scaling benchmark
(:mod:`memprism_ray.local.cluster`). Nothing here is an actor: these start and stop Ray
processes from outside a job.
"""
