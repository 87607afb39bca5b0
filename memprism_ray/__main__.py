import sys

from memprism_ray.cli import main

sys.exit(main())
