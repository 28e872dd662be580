"""Pothole alerts over the API: what the monitors page shows, for the key's project."""

from django.http import HttpRequest
from ninja import Router, Schema

from reviewapp.api.schemas import ERRORS
from reviewapp.monitors.alerts import project_alerts
from reviewapp.projects.key_auth import requires
from reviewapp.projects.models import KeyScope

router = Router(tags=["monitors"])


class EvidenceOut(Schema):
    label: str
    url: str  # absolute: a trace list with filters, or one trace's page


class AlertOut(Schema):
    kind: str
    severity: str
    version: str
    previous_version: str
    message: str
    evidence: list[EvidenceOut]


class AlertsOut(Schema):
    alerts: list[AlertOut]


@router.get(
    "/alerts",
    response={200: AlertsOut, **ERRORS},
    summary="Pothole alerts: environment changes between model versions, with evidence links",
    **requires(KeyScope.REVIEW, KeyScope.ADMIN),
)
def list_alerts(request: HttpRequest):
    alerts = []
    for alert in project_alerts(project=request.auth):
        item = alert.as_json()
        for evidence in item["evidence"]:
            evidence["url"] = request.build_absolute_uri(evidence["url"])
        alerts.append(item)
    return {"alerts": alerts}
