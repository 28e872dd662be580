"""Moved to reviewapp/projects/key_auth.py (keys are the projects wing's); kept only until the
learning wing's API modules import it from there."""

from reviewapp.projects.key_auth import requires

__all__ = ["requires"]
