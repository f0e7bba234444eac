"""Type stubs of luminal._rt, the private native runtime (csrc/python/)."""

from collections.abc import Sequence
from typing import Any

FORMAT_VERSION: int

class Plan:
    backend: str
    arch: str
    metadata: list[tuple[str, str]]
    num_steps: int
    num_kernels: int
    dims: list[tuple[str, int, int]]
    io: list[tuple[int, str, int, int, list[int]]]
    @staticmethod
    def load(path: str) -> Plan: ...
    @staticmethod
    def from_bytes(data: bytes, base_dir: str = ".") -> Plan: ...

class Executor:
    arena_bytes: int
    backend: str
    def __init__(self, plan: Plan, backend: str = "cpu") -> None: ...
    def shapes(self, dims: Sequence[int]) -> list[tuple[int, ...]]: ...
    def run(self, dims: Sequence[int], arrays: Sequence[Any]) -> None: ...

def backends() -> list[str]: ...
def cuda_unavailable_reason() -> str: ...
def cuda_device(ordinal: int = -1) -> tuple[str, str, int, int, int]: ...
