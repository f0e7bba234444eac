"""High-level ops named as in PyTorch (``torch``, ``torch.nn.functional``), each a composition
of the 15 primitives. Tensor methods and operators delegate here.

Files by topic: ``elementwise`` (arithmetic, comparisons, logic, rounding, select, exp/log/trig),
``activation``, ``reduce`` (reductions, scans, softmax), ``movement`` (views, cat, pad),
``index`` (x[...], gather/scatter, embedding), ``creation`` (``arange(g, ...)``, ``zeros``...),
``linalg`` (matmul family), ``nn`` (normalizations), ``conv`` (convolutions and pooling),
``special`` (inverse trig / hyperbolic, atan2, hypot, copysign, fmax/fmin, lgamma),
``ordering`` (sort, topk, median, logcumsumexp), ``specfun`` (digamma, polygamma, zeta, Bessel I,
erfcx, erfinv, ndtri, Chebyshev), ``bessel`` (Bessel J, Y, K and Airy Ai), ``indexreduce``
(scatter_reduce, index_reduce), ``triangular`` (triangular solves, Cholesky), ``eigen``
(symmetric eigenvalues, singular values, pseudo-inverse), ``householder`` (QR).
"""

import sys

from ..tensor import register_functional as _register
from . import (
    activation,
    attention,
    bessel,
    conv,
    creation,
    eigen,
    elementwise,
    householder,
    index,
    indexreduce,
    linalg,
    movement,
    nn,
    ordering,
    reduce,
    specfun,
    special,
    transcendental,
    triangular,
)  # fmt: skip
from .activation import *  # noqa: F403
from .attention import *  # noqa: F403
from .bessel import *  # noqa: F403
from .conv import *  # noqa: F403
from .creation import *  # noqa: F403
from .eigen import *  # noqa: F403
from .elementwise import *  # noqa: F403
from .householder import *  # noqa: F403
from .index import *  # noqa: F403
from .indexreduce import *  # noqa: F403
from .linalg import *  # noqa: F403
from .movement import *  # noqa: F403
from .nn import *  # noqa: F403
from .ordering import *  # noqa: F403
from .reduce import *  # noqa: F403
from .specfun import *  # noqa: F403
from .special import *  # noqa: F403
from .transcendental import *  # noqa: F403
from .triangular import *  # noqa: F403

_TOPICS = (activation, attention, bessel, conv, creation, eigen, elementwise, index, indexreduce,
           linalg, movement, nn, householder, ordering, reduce, special, specfun, transcendental,
           triangular)  # fmt: skip
__all__ = sorted({name for m in _TOPICS for name in m.__all__})

_register(sys.modules[__name__])  # Tensor's methods delegate to this package
