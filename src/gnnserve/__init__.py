"""gnnserve: online graph neural network inference serving."""

import os as _os

# GNU OpenMP's default wait policy stalls each numba parallel region ~16 ms on small CPU
# containers (measured: bench/sampling.py); passive waiting costs microseconds and leaves the
# cores to the server. Only effective when gnnserve is imported before torch/numba start OpenMP.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
