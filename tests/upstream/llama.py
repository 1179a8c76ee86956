"""llama.cpp's real `llama-server` on a random loopback port, for the upstream tests and
bench/upstream.py (not an imitation: the server users run).

The binary is built once per machine by `infra/dev/install-llama-server.sh` (run by
`make install`); asking the script for it again costs a `--version`. Every server
started here is killed (SIGKILL, whole process group) by its owner.
"""

from __future__ import annotations

import os
import signal
import ssl
import subprocess
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import httpx

from core.model_files import default_model_source
from tests.scheduler.processes import free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]
INSTALL = ROOT / "infra" / "dev" / "install-llama-server.sh"


@cache
def llama_server_binary() -> str:
    """The wrapper of the cached build; fails (never skips) when `make install` did not
    build it, since these tests are part of `make test`."""
    done = subprocess.run(["bash", str(INSTALL)], capture_output=True, text=True, timeout=3600,
                          check=False)
    assert done.returncode == 0, f"llama-server is not built; run `make install`:\n{done.stderr}"
    return done.stdout.strip().splitlines()[-1]


@dataclass
class LlamaServer:
    """One `llama-server` serving the default SmolLM2 model."""

    log_dir: Path
    parallel: int = 2
    ctx_size: int = 2048  # split among the slots
    threads: int = 1
    port: int = 0
    tls: tuple[Path, Path] | None = None  # (certificate, key): served over HTTPS
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def origin(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.origin}/v1"

    @property
    def log_path(self) -> Path:
        """The server's output: its requests' own timings among it (`print_timing`)."""
        return self.log_dir / f"llama-server-{self.port}.log"

    def start(self) -> LlamaServer:
        self.port = self.port or free_port()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        tls = ["--ssl-cert-file", str(self.tls[0]), "--ssl-key-file", str(self.tls[1])
               ] if self.tls else []
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [llama_server_binary(), "-m", str(default_model_source()), "--host",
                 "127.0.0.1", "--port", str(self.port), "--ctx-size", str(self.ctx_size),
                 "--parallel", str(self.parallel), "--threads", str(self.threads),
                 "--threads-batch", str(self.threads), "--no-webui", *tls],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_until(self._healthy, timeout=120, what=f"llama-server on port {self.port}")
        return self

    def _healthy(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"llama-server exited ({self.process.returncode})")
        try:
            return self.get("/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def get(self, path: str, timeout: float) -> httpx.Response:
        """GET `path` of the server, trusting its own certificate when it has one."""
        return httpx.get(self.origin + path, timeout=timeout, verify=self.verify)

    @property
    def verify(self) -> ssl.SSLContext | bool:
        """What a direct client of this server trusts: its certificate when it has one."""
        return ssl.create_default_context(cafile=str(self.tls[0])) if self.tls else True

    def busy_slots(self) -> int:
        """Slots generating now, as the server itself reports them (`/slots`)."""
        answer = self.get("/slots", timeout=5)
        answer.raise_for_status()
        return sum(1 for slot in answer.json() if slot.get("is_processing"))

    def kill9(self) -> None:
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=10)
        self.process = None
