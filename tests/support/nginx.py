"""nginx from Debian's package, run by a test: the shipped site file (deploy/nginx/paywire.conf)
with only its deployment values replaced, inside a minimal main configuration of the test's own
(daemon off, one worker, every path in a temporary prefix), on loopback ports."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

SHIPPED = Path(__file__).resolve().parent.parent.parent / "deploy" / "nginx" / "paywire.conf"
_CANDIDATES = ("/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx")


def nginx_binary() -> str | None:
    """nginx's path (it lives in /usr/sbin, often not on a user's PATH), or None."""
    found = shutil.which("nginx")
    if found:
        return found
    return next((c for c in _CANDIDATES if os.access(c, os.X_OK)), None)


def render(text: str, replacements: dict[str, str]) -> str:
    """`text` with each key replaced by its value; every key must occur, so the shipped file
    and the test cannot drift apart without the test saying so."""
    for old, new in replacements.items():
        assert old in text, f"deploy/nginx/paywire.conf no longer contains {old!r}"
        text = text.replace(old, new)
    return text


def _main_conf(prefix: Path, site: Path) -> str:
    # Run as root (a container), nginx's workers would switch to nobody: keep them this user.
    user = "user root root;\n" if os.geteuid() == 0 else ""
    temp = "\n".join(f"    {kind}_temp_path {prefix / 'temp' / kind};"
                     for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    return (f"{user}daemon off;\nworker_processes 1;\npid {prefix / 'nginx.pid'};\n"
            f"error_log {prefix / 'error.log'} info;\n"
            "events { worker_connections 256; }\n"
            "http {\n"
            f"    access_log {prefix / 'default.access.log'};\n{temp}\n"
            f"    include {site};\n"
            "}\n")


@dataclass
class Nginx:
    proc: subprocess.Popen[bytes]
    prefix: Path

    def log(self, name: str = "paywire.access.log") -> str:
        path = self.prefix / name
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: nginx's fast shutdown
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_nginx(binary: str, prefix: Path, site_text: str, ports: list[int],
                timeout: float = 15) -> Nginx:
    """Write the configuration, check it (`nginx -t`: its message on failure), start nginx in
    the foreground and return once every port in `ports` accepts connections."""
    (prefix / "temp").mkdir(parents=True, exist_ok=True)
    site, main = prefix / "paywire.conf", prefix / "nginx.conf"
    site.write_text(site_text)
    main.write_text(_main_conf(prefix, site))
    command = [binary, "-p", str(prefix), "-c", str(main), "-e", str(prefix / "error.log")]
    checked = subprocess.run([*command, "-t"], capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, f"nginx -t refused the configuration:\n{checked.stderr}"
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = Nginx(proc, prefix)
    deadline = time.monotonic() + timeout
    for port in ports:
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    server.stop()
                    raise RuntimeError(f"nginx did not listen on {port}:\n"
                                       f"{server.log('error.log')[-3000:]}") from None
                time.sleep(0.02)  # polling the port with a deadline
    return server
