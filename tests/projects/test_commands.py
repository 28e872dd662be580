import gzip
import io
import json

import pytest
from django.core.management import CommandError, call_command

from reviewapp.projects.models import ApiKey, Membership, Project
from reviewapp.review.models import Feedback
from reviewapp.traces.models import Trace, TraceTag
from tests.factories import ApiClient, make_trace


def run(*args) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_create_project_stores_upstream_and_model(db):
    out, _ = run("create_project", "shop", "--upstream", "http://127.0.0.1:9000/v1", "--model", "m")
    project = Project.objects.get(slug="shop")
    assert (project.upstream_url, project.served_model) == ("http://127.0.0.1:9000/v1", "m")
    assert "created project shop" in out


def test_create_project_refuses_a_taken_slug_and_a_bad_one(project):
    with pytest.raises(CommandError, match="already exists"):
        run("create_project", "acme")
    with pytest.raises(CommandError):
        run("create_project", "not a slug!")


def test_create_api_key_prints_a_working_secret_and_stores_only_its_hash(project):
    out, _ = run("create_api_key", "acme")
    secret = out.strip()
    key = ApiKey.objects.get(project=project)
    assert secret.startswith(key.prefix)
    assert secret not in (key.secret_hash, key.name)
    assert key.secret_hash == ApiKey.hash_secret(secret)
    assert ApiClient(secret).get("/api/v1/traces").status_code == 200


def test_create_api_key_for_an_unknown_project_fails(db):
    with pytest.raises(CommandError, match="no project 'nope'"):
        run("create_api_key", "nope")


@pytest.fixture
def jsonl(tmp_path):
    lines = [json.dumps(make_trace(f"t-{i}")) for i in range(3)]
    lines.append("{not json")
    bad = make_trace("bad")
    bad["messages"][1]["role"] = "robot"
    lines.append(json.dumps(bad))
    lines.append(json.dumps({"messages": [{"role": "user", "content": "hi"}]}))  # fine-tuning line
    lines.append("")
    path = tmp_path / "traces.jsonl"
    path.write_text("\n".join(lines))
    return path


def test_import_traces_reports_imported_duplicates_and_rejected_with_reasons(project, jsonl):
    out, err = run("import_traces", str(jsonl), "--project", "acme")
    assert "imported 4, duplicates 0, rejected 2" in out
    assert "line 4: not valid JSON" in out
    assert "line 5: messages[1].role" in out
    assert "importing" in err  # the progress bar
    assert Trace.objects.filter(project=project, source="import").count() == 4


def test_importing_the_same_file_again_stores_nothing_twice(project, jsonl):
    run("import_traces", str(jsonl), "--project", "acme")
    out, _ = run("import_traces", str(jsonl), "--project", "acme", "--no-progress")
    assert "imported 0, duplicates 4, rejected 2" in out
    assert Trace.objects.filter(project=project).count() == 4


def test_import_traces_reads_gzip(project, tmp_path):
    path = tmp_path / "traces.jsonl.gz"
    with gzip.open(path, "wt") as file:
        file.write(json.dumps(make_trace("z")) + "\n")
    out, _ = run("import_traces", str(path), "--project", "acme", "--no-progress")
    assert "imported 1," in out


def test_import_traces_needs_a_known_project_and_a_file(project, tmp_path):
    with pytest.raises(CommandError, match="no project"):
        run("import_traces", str(tmp_path / "x.jsonl"), "--project", "nope")
    with pytest.raises(CommandError, match="is not a file"):
        run("import_traces", str(tmp_path / "x.jsonl"), "--project", "acme")


def test_seed_demo_can_run_twice(db, settings, tmp_path):
    settings.VAR_DIR = tmp_path
    run("seed_demo", "--traces", "10")
    out, _ = run("seed_demo", "--traces", "10")
    assert "0 new traces" in out
    assert Trace.objects.filter(project__slug="demo").count() == 10
    secret = (tmp_path / "demo-api-key").read_text().strip()
    assert ApiClient(secret).get("/api/v1/traces").json()["traces"]


def test_seed_demo_ships_a_taxonomy_reviewed_traces_feedback_and_a_queue(db, settings, tmp_path):
    settings.VAR_DIR = tmp_path
    run("seed_demo", "--traces", "10")
    run("seed_demo", "--traces", "10")  # a second run adds nothing twice
    demo = Project.objects.get(slug="demo")
    assert demo.tags.count() >= 9
    assert TraceTag.objects.filter(trace__project=demo, reviewer__username="admin").count() == 4
    assert Feedback.objects.filter(trace__project=demo).count() == 3
    assert Feedback.objects.filter(trace__project=demo).exclude(correction=None).count() == 1
    assert demo.queues.get().name == "Tool errors"
    assert Membership.objects.get(project=demo, user__username="admin").role == "admin"
