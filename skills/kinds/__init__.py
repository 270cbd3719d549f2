"""The kinds of resource file. Each kind checks its own settings and builds the running parts.

- `python`: a handler in Python (`module` or `module:function`).
- `forward`: an HTTP upstream the body is forwarded to, with the operator's key added.
- `prompted`: a prompt template run on one of the gateway's models, answering validated JSON.
"""

from __future__ import annotations

from types import ModuleType

from . import forward, prompted, python_handler

KINDS: dict[str, ModuleType] = {
    "python": python_handler,
    "forward": forward,
    "prompted": prompted,
}
