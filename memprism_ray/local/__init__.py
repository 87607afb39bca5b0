"""Ray on the machine you are on: a local head that ``make run`` submits the job to
(:mod:`~memprism_ray.local.head`) and a cluster of several nodes (:mod:`~memprism_ray.local.cluster`),
started and stopped from outside a job.
"""
