"""What the commands that talk to the daemon share: finding it, and saying so when it is not
there (with the offline way to read the log, for those who hold the keys)."""

from __future__ import annotations

import json
from typing import Any

from daemon.api.client import ApiCallError, ApiClient, DaemonUnavailable, shown_time
from daemon.api.provider_text import inline
from daemon.config import Config

__all__ = ["ApiCallError", "ApiClient", "connect", "print_result", "require", "view_line"]


def connect(cfg: Config) -> ApiClient | None:
    """A client when the daemon answers on its socket, else None."""
    client = ApiClient(cfg.socket_path, daemon_user=cfg.api.daemon_user)
    if client.answers():
        return client
    client.close()
    return None


def require(cfg: Config, command: str) -> ApiClient:
    client = connect(cfg)
    if client is None:
        raise DaemonUnavailable(
            f"the daemon is not running: nothing answers on {cfg.socket_path}. Start it "
            f"(systemctl start bide, or bide run), or, holding the log's keys, read the log "
            f"directly: bide {command} --offline"
        )
    return client


def view_line(view: dict[str, Any]) -> str:
    reason = f" {view['stop_reason']}" if view.get("stop_reason") else ""
    nxt = (
        f" next {shown_time(view['next_news_at'])}"
        if view.get("phase") == "live" and view.get("next_news_at") is not None
        else ""
    )
    job = view.get("provider_job_id") or "-"
    return (
        f"{view['operation_id']}  {view['provider']}/{job}  {view['phase']}{reason}  "
        f"state={inline('⟨provider_state⟩', view) if view.get('provider_state') else '-'}"
        f"  requests "
        f"{view.get('status_requests_used', 0)}/{view.get('max_status_requests', 0)}{nxt}"
    )


def print_result(as_json: bool, obj: object, text: str, status: int) -> int:
    print(json.dumps(obj) if as_json else text)
    return status
