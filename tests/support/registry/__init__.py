"""Real-registry test harness: a distribution registry with htpasswd on loopback, a
fault-injecting proxy in front of it, and a way to push tiny images into it.

Plain functions and context managers, so any conftest can wrap them in fixtures.
"""

from .images import PushedImage, docker_login, push_tiny_image
from .proxy import FaultProxy
from .server import RunningRegistry, running_registry, start_registry

__all__ = [
    "FaultProxy",
    "PushedImage",
    "RunningRegistry",
    "docker_login",
    "push_tiny_image",
    "running_registry",
    "start_registry",
]
