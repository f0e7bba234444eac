"""PyTorch-style modules that record into a luminal ``Graph`` when called.

model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
model.load_state_dict(torch_model.state_dict())   # names and shapes as in PyTorch
g = luminal.Graph(); x = g.input("x", (batch, 4))
g.output("y", model(x))                           # weights become named graph weights
"""

from .layers import (
    GELU,
    BatchNorm1d,
    BatchNorm2d,
    Conv1d,
    Conv2d,
    Dropout,
    Embedding,
    Flatten,
    GroupNorm,
    Identity,
    LayerNorm,
    Linear,
    ReLU,
    RMSNorm,
    Sigmoid,
    SiLU,
    Softmax,
    Tanh,
)
from .module import LoadResult, Module, ModuleList, Parameter, Sequential
from .transformer import MLP, Attention, KVCache, MultiheadAttention, TransformerBlock

__all__ = [
    "GELU",
    "MLP",
    "Attention",
    "BatchNorm1d",
    "BatchNorm2d",
    "Conv1d",
    "Conv2d",
    "Dropout",
    "Embedding",
    "Flatten",
    "GroupNorm",
    "Identity",
    "KVCache",
    "LayerNorm",
    "Linear",
    "LoadResult",
    "Module",
    "ModuleList",
    "MultiheadAttention",
    "Parameter",
    "RMSNorm",
    "ReLU",
    "Sequential",
    "SiLU",
    "Sigmoid",
    "Softmax",
    "Tanh",
    "TransformerBlock",
]
