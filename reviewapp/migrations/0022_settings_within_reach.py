"""Stored settings that named what a project may no longer name (reviewapp/projects/outbound.py).

`teacher.api_key_env` (any environment variable's name) gives way to `teacher.key_name`, one of
the keys the operator declares; the variable it named is not carried over, since the operator
has not declared it. Upstreams and a teacher URL that are not plain base URLs (a query, a
fragment, credentials, another scheme, unparsable) are dropped. Whether an address is on the
operator's lists is checked where it is used, so nothing else changes here.
"""

from urllib.parse import urlsplit

from django.db import migrations


def _plain_base_url(url: object) -> bool:
    if not isinstance(url, str):
        return False
    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        return False
    return (
        parts.scheme in ("http", "https")
        and bool(parts.hostname)
        and parts.username is None
        and parts.password is None
        and not parts.query
        and not parts.fragment
        and not url.strip().endswith(("?", "#"))
    )


def forward(apps, schema_editor):
    Project = apps.get_model("reviewapp", "Project")
    for project in Project.objects.exclude(settings={}).iterator():
        stored = dict(project.settings or {})
        changed = False
        teacher = stored.get("teacher")
        if isinstance(teacher, dict):
            teacher = dict(teacher)
            if "api_key_env" in teacher:
                teacher.pop("api_key_env")
                changed = True
            if teacher.get("url") and not _plain_base_url(teacher["url"]):
                teacher["url"] = ""
                changed = True
            stored["teacher"] = teacher
        upstreams = stored.get("upstreams")
        if isinstance(upstreams, list):
            kept = [url for url in upstreams if _plain_base_url(url)]
            if kept != upstreams:
                stored["upstreams"] = kept
                changed = True
        if changed:
            project.settings = stored
            project.save(update_fields=["settings"])


class Migration(migrations.Migration):
    dependencies = [("reviewapp", "0021_trace_rollups")]

    operations = [migrations.RunPython(forward, migrations.RunPython.noop)]
