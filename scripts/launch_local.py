"""``python scripts/launch_local.py -n 2 -- asyncfl run ...`` in a clone: the same as ``asyncfl-launch-local`` (the
module :mod:`asyncfl_jax.launch_local`, installed with the package)."""

import sys

from asyncfl_jax.launch_local import main

if __name__ == "__main__":
    sys.exit(main())
