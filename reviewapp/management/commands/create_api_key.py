from django.core.management.base import BaseCommand, CommandError

from reviewapp.projects.models import KeyScope, Project
from reviewapp.projects.services import create_api_key


class Command(BaseCommand):
    help = "Create an API key for a project and print its secret (shown only this once)."

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("--name", default="", help="a label to tell keys apart")
        parser.add_argument(
            "--scope",
            action="append",
            choices=KeyScope.values,
            dest="scopes",
            help="what the key may do; repeat for several (default: ingest, a harness's key)",
        )

    def handle(self, *args, slug, name, scopes, **options):
        project = Project.objects.filter(slug=slug).first()
        if project is None:
            raise CommandError(f"no project {slug!r}; create it with create_project {slug}")
        key, secret = create_api_key(project=project, name=name, scopes=scopes or [KeyScope.INGEST])
        self.stderr.write(
            f"key {key.prefix}… ({', '.join(key.scopes)}) for {project.slug}; "
            "store it now, it is not shown again"
        )
        self.stdout.write(secret)
