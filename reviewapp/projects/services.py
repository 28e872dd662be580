"""Projects and their API keys."""

from collections.abc import Iterable
from functools import partial

from django.db import transaction
from django.utils import timezone

from reviewapp.projects import key_cache
from reviewapp.projects.models import ApiKey, KeyScope, Project
from reviewapp.projects.project_settings import ProjectSettings, update_settings


@transaction.atomic
def create_project(
    *, slug: str, name: str = "", upstream_url: str = "", served_model: str = ""
) -> Project:
    project = Project(slug=slug, name=name or slug, upstream_url=upstream_url)
    if served_model:
        project.served_model = served_model
    project.full_clean()
    project.save()
    return project


@transaction.atomic
def update_project(
    *, project: Project, name: str, served_model: str, settings_changes: dict
) -> ProjectSettings:
    """The settings page's save: the project's name and model alias, and whole sections of its
    settings, all or none (SettingsError names each refused field)."""
    Project.objects.filter(pk=project.pk).update(name=name, served_model=served_model)
    changed = update_settings(project=project, changes=settings_changes)
    project.name, project.served_model = name, served_model
    # The gateway keeps what a key resolves to (alias, model servers) for a few seconds.
    transaction.on_commit(key_cache.forget_all)
    return changed


def create_api_key(
    *, project: Project, name: str = "", scopes: Iterable[str] = (KeyScope.INGEST,)
) -> tuple[ApiKey, str]:
    """Store a new key's hash; the secret is returned once and never again.

    The default scope, ingest, is what a harness needs; review and admin keys can change the model.
    """
    scopes = sorted({str(scope) for scope in scopes})
    unknown = set(scopes) - set(KeyScope.values)
    if unknown or not scopes:
        raise ValueError(
            f"scopes: {', '.join(sorted(unknown)) or 'none given'}; choose from "
            f"{', '.join(KeyScope.values)}"
        )
    secret = ApiKey.new_secret()
    key = ApiKey.objects.create(
        project=project,
        name=name,
        prefix=secret[: ApiKey.PREFIX_LENGTH],
        secret_hash=ApiKey.hash_secret(secret),
        scopes=scopes,
    )
    return key, secret


@transaction.atomic
def revoke_api_key(*, key: ApiKey) -> None:
    """Revoke a key: this process's gateway refuses it on its next call, others within seconds."""
    ApiKey.objects.filter(pk=key.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
    # After the commit: a gateway call in between would cache the key as still valid.
    transaction.on_commit(partial(key_cache.forget_key, key.secret_hash))
