from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from reviewapp.monitors.similarity import EMBED_CHUNK, embed_traces
from reviewapp.projects.models import Project


class Command(BaseCommand):
    help = (
        "Embed a project's traces for similarity and clusters: those stored before embeddings "
        "existed, or whose text changed. New traces are embedded by the worker."
    )

    def add_arguments(self, parser):
        parser.add_argument("slug")

    def handle(self, *args, slug, **options):
        project = Project.objects.filter(slug=slug).first()
        if project is None:
            raise CommandError(f"no project {slug!r}")
        trace_ids = list(project.traces.order_by("id").values_list("id", flat=True))
        embedded = 0
        with tqdm(total=len(trace_ids), unit="trace", file=self.stderr) as progress:
            for start in range(0, len(trace_ids), EMBED_CHUNK):
                chunk = trace_ids[start : start + EMBED_CHUNK]
                embedded += embed_traces(trace_ids=chunk)
                progress.update(len(chunk))
        self.stdout.write(f"embedded {embedded}, unchanged {len(trace_ids) - embedded}")
