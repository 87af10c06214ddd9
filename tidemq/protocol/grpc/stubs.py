"""The generated apache.rocketmq.v2 message classes, without the client SDK around them.

The official `rocketmq-python-client` package holds the generated stubs in
`rocketmq.grpc_protocol`; its package `__init__`s start the client SDK (opentelemetry, grpcio's
channel stubs), which a broker never uses.  Here both packages are registered unrun: their
`__path__` is in place, so the generated submodules import on their own, and a package's
`__init__` runs on the first look-up of a name that is not one of its imported submodules (a
client SDK used in the same process finds them whole).

    pb   definition_pb2: Message, Resource, Status, Settings, ...
    svc  service_pb2: the MessagingService requests and responses
"""

from __future__ import annotations

import importlib.util
import sys
from typing import TYPE_CHECKING

PACKAGES = ("rocketmq", "rocketmq.grpc_protocol")


def _register_unrun(name: str) -> None:
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ImportError(f"no module named {name!r}: install rocketmq-python-client")
    module = importlib.util.module_from_spec(spec)
    loader = spec.loader

    def run_init(attribute: str) -> object:
        # the first look-up the package itself must answer: run its __init__ now, once
        del module.__dict__["__getattr__"]
        loader.exec_module(module)
        return getattr(module, attribute)

    # a module's __getattr__ lives in its __dict__ (PEP 562)
    module.__dict__["__getattr__"] = run_init
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)


for _name in PACKAGES:
    _register_unrun(_name)

# plain imports of the submodules: `from package import name` would look `name` up on the
# package first, and run its __init__
import rocketmq.grpc_protocol.definition_pb2  # noqa: E402
import rocketmq.grpc_protocol.service_pb2  # noqa: E402,F401

if TYPE_CHECKING:
    from rocketmq.grpc_protocol import definition_pb2 as pb
    from rocketmq.grpc_protocol import service_pb2 as svc
else:
    pb = sys.modules["rocketmq.grpc_protocol.definition_pb2"]
    svc = sys.modules["rocketmq.grpc_protocol.service_pb2"]

__all__ = ["pb", "svc"]
