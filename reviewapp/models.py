"""Every wing's tables, imported so that Django registers them with the `reviewapp` app (one
app label, one migration history). Code imports a model from its wing's own models module."""

import reviewapp.gateway.models
import reviewapp.learning.models
import reviewapp.monitors.models
import reviewapp.projects.models
import reviewapp.review.models
import reviewapp.traces.models  # noqa: F401
