import gzip
import hashlib
from collections import Counter
from pathlib import Path

import orjson
from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from reviewapp.projects.models import Project
from reviewapp.traces.ingest import ingest_traces
from reviewapp.traces.models import TraceSource

BATCH_SIZE = 500
REASONS_SHOWN = 20


def derived_external_id(line: bytes) -> str:
    # Fine-tuning JSONL has no ids; the content's hash keeps a re-import idempotent.
    return "sha256-" + hashlib.sha256(line.strip()).hexdigest()[:32]


class Command(BaseCommand):
    help = (
        "Import traces from a JSONL file (one trace per line, the API's Trace shape or "
        "OpenAI fine-tuning lines; .gz accepted). Re-importing stores nothing twice."
    )

    def add_arguments(self, parser):
        parser.add_argument("path", type=Path)
        parser.add_argument("--project", required=True, help="project slug")
        parser.add_argument("--no-progress", action="store_true")

    def handle(self, *args, path: Path, project: str, no_progress: bool, **options):
        target = Project.objects.filter(slug=project).first()
        if target is None:
            raise CommandError(f"no project {project!r}")
        if not path.is_file():
            raise CommandError(f"{path} is not a file")
        counts: Counter[str] = Counter()
        rejected: list[str] = []
        opener = gzip.open if path.suffix == ".gz" else open
        with (
            opener(path, "rb") as lines,
            tqdm(
                total=path.stat().st_size,
                unit="B",
                unit_scale=True,
                desc="importing",
                disable=no_progress,
                file=self.stderr,
            ) as progress,
        ):
            batch: list[tuple[int, object]] = []
            for number, line in enumerate(lines, start=1):
                progress.update(len(line))
                if not line.strip():
                    continue
                try:
                    item = orjson.loads(line)
                except orjson.JSONDecodeError as error:
                    counts["rejected"] += 1
                    rejected.append(f"line {number}: not valid JSON ({error})")
                    continue
                if isinstance(item, dict) and "external_id" not in item:
                    item["external_id"] = derived_external_id(line)
                batch.append((number, item))
                if len(batch) == BATCH_SIZE:
                    self._flush(target, batch, counts, rejected)
                    batch = []
            if batch:
                self._flush(target, batch, counts, rejected)
        self.stdout.write(
            f"imported {counts['imported']}, duplicates {counts['duplicates']}, "
            f"rejected {counts['rejected']}"
        )
        for reason in rejected[:REASONS_SHOWN]:
            self.stdout.write(f"  {reason}")
        if len(rejected) > REASONS_SHOWN:
            self.stdout.write(f"  … and {len(rejected) - REASONS_SHOWN} more")

    def _flush(self, project, batch, counts: Counter, rejected: list[str]) -> None:
        results = ingest_traces(
            project=project, raw_items=[item for _, item in batch], source=TraceSource.IMPORT
        )
        for (number, _), result in zip(batch, results, strict=True):
            if result.status == 201:
                counts["imported"] += 1
            elif result.status == 200:
                counts["duplicates"] += 1
            else:
                counts["rejected"] += 1
                rejected.append(f"line {number}: {result.error}")
