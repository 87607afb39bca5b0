"""Training and evaluation pipelines shared by the jobs (no Ray here: the jobs and
``memprism_ray.actors`` distribute these functions)."""
