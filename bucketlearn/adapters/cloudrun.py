"""The Cloud Run worker pool the autoscaler resizes (Admin API v2, REST)."""

from __future__ import annotations

from typing import Any

from bucketlearn.errors import TransientError


class CloudRunWorkerPool:
    """Reads and sets a Cloud Run worker pool's manual instance count (Admin API v2, REST)."""

    API = "https://run.googleapis.com/v2/"

    def __init__(self, pool_name: str, session: Any | None = None) -> None:
        self.pool_name = pool_name
        if session is None:
            import google.auth  # noqa: PLC0415
            from google.auth.transport.requests import AuthorizedSession  # noqa: PLC0415

            credentials, _ = google.auth.default(
                scopes=["https://www.googleapis.com/auth/cloud-platform"])
            session = AuthorizedSession(credentials)
        self.session = session

    def current(self) -> int:
        response = self.session.get(self.API + self.pool_name, timeout=30)
        if response.status_code >= 300:
            raise TransientError(f"reading {self.pool_name}: HTTP {response.status_code} "
                                 f"{response.text[:300]}")
        return int(response.json().get("scaling", {}).get("manualInstanceCount", 0))

    def set(self, count: int) -> None:
        response = self.session.patch(
            self.API + self.pool_name, params={"updateMask": "scaling.manualInstanceCount"},
            json={"scaling": {"manualInstanceCount": count}}, timeout=30)
        if response.status_code >= 300:
            raise TransientError(f"resizing {self.pool_name} to {count}: HTTP "
                                 f"{response.status_code} {response.text[:300]}")
