from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from reviewapp.projects.models import Project
from reviewapp.projects.services import create_project


class Command(BaseCommand):
    help = "Create a project. Its upstream and served model can be changed later in the dashboard."

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("--name", default="")
        parser.add_argument(
            "--upstream", default="", help="OpenAI-compatible server the gateway forwards to"
        )
        parser.add_argument("--model", default="", help="model name the harness asks for")

    def handle(self, *args, slug, name, upstream, model, **options):
        if Project.objects.filter(slug=slug).exists():
            raise CommandError(f"a project {slug!r} already exists")
        try:
            project = create_project(
                slug=slug, name=name, upstream_url=upstream, served_model=model
            )
        except ValidationError as error:
            raise CommandError("; ".join(error.messages)) from None
        self.stdout.write(f"created project {project.slug} (serves model {project.served_model})")
