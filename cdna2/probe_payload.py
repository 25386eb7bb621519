"""What the deploy sends a host to probe it in one SSH command: the probe's modules and the bootstrap that runs them.

The probe (cdna2/host/probe.py) and the host modules it imports travel inline, as one argument: the modules' texts,
each behind a marker line, deepest dependency first, zlib-compressed and in base64. One argument is limited to
128 KiB on Linux (MAX_ARG_STRLEN) and a transport that quotes it for ``sh -c`` (docker exec) inflates every quote
of plain Python text; compressed, the payload is about a third of its text and holds no quote. The bootstrap runs
the installed agent's copy when it holds these very texts (compared byte for byte: its bytecode is cached there),
else it makes the modules from the texts and runs the probe; it imports nothing beyond ``os``, ``sys`` and the
built-in ``zlib`` and ``binascii``, like the probe. Entry points: ``PROBE_PAYLOAD``,
``PROBE_BOOTSTRAP``; argv on the host: ``-c BOOTSTRAP AGENT_DIR PAYLOAD OPTIONS [SUDO_REFUSAL]``.
"""

from __future__ import annotations

import ast
import base64
import zlib
from importlib import resources

HOST_PACKAGE = "cdna2.host"
MARKER = "# cdna2-probe-module "


def _imported_host_modules(source: str) -> list[str]:
    """The cdna2.host modules a module's text imports (``from cdna2.host.X import ...``)."""
    return sorted({node.module for node in ast.walk(ast.parse(source))
                   if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(HOST_PACKAGE + ".")})


def probe_modules(entry: str = "cdna2.host.probe") -> list[tuple[str, str]]:
    """(module name, text) of the probe and every host module it needs, each after the modules it imports."""
    ordered: list[tuple[str, str]] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in path:
            raise ValueError(f"import circle among the probe's modules: {' -> '.join((*path, name))}")
        if any(done == name for done, _ in ordered):
            return
        text = resources.files(HOST_PACKAGE).joinpath(name.rpartition(".")[2] + ".py").read_text()
        for imported in _imported_host_modules(text):
            visit(imported, (*path, name))
        if MARKER in text:
            raise ValueError(f"{name} contains the payload's marker line {MARKER!r}")
        ordered.append((name, text))

    visit(entry, ())
    return ordered


PROBE_PAYLOAD = base64.b64encode(zlib.compress("".join(f"{MARKER}{name}\n{text}" for name, text in probe_modules())
                                               .encode(), 9)).decode("ascii")

PROBE_BOOTSTRAP = (
    "import os,sys,zlib,binascii\n"
    "agent,payload=sys.argv[1:3]\n"
    "payload=zlib.decompress(binascii.a2b_base64(payload)).decode()\n"
    "del sys.argv[1:3]\n"
    f"modules=[entry.partition('\\n')[::2] for entry in payload.split({MARKER!r})[1:]]\n"
    "def installed(name):\n"
    " try:\n"
    "  return open(agent+'/'+name.replace('.','/')+'.py','rb').read()\n"
    " except OSError:\n"
    "  return b''\n"
    "if agent and all(installed(name)==os.fsencode(text) for name,text in modules):\n"
    " sys.path.insert(0,agent)\n"
    " sys.dont_write_bytecode=False\n"
    " from cdna2.host.probe import main\n"
    " sys.exit(main(sys.argv))\n"
    "for package in ('cdna2','cdna2.host'):\n"
    " sys.modules[package]=type(sys)(package)\n"
    " sys.modules[package].__path__=[]\n"
    "for name,text in modules:\n"
    " module=sys.modules[name]=type(sys)(name)\n"
    " module.__file__=name.replace('.','/')+'.py'\n"
    " exec(compile(text,module.__file__,'exec'),module.__dict__)\n"
    "sys.exit(module.main(sys.argv))\n"
)
