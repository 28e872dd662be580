from django.core.management.base import BaseCommand, CommandError

from reviewapp.models import Project
from reviewapp.services.projects import create_api_key


class Command(BaseCommand):
    help = "Create an API key for a project and print its secret (shown only this once)."

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("--name", default="", help="a label to tell keys apart")

    def handle(self, *args, slug, name, **options):
        project = Project.objects.filter(slug=slug).first()
        if project is None:
            raise CommandError(f"no project {slug!r}; create it with create_project {slug}")
        key, secret = create_api_key(project=project, name=name)
        self.stderr.write(
            f"key {key.prefix}… for {project.slug}; store it now, it is not shown again"
        )
        self.stdout.write(secret)
