"""The integrity audit of a finished run: deterministic rule checks and an optional LLM inspector."""

from labkube.integrity.audit import audit_run
from labkube.integrity.evidence import WorkspaceChanges, record_workspace_files

__all__ = ["WorkspaceChanges", "audit_run", "record_workspace_files"]
