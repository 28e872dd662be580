from django.contrib import admin
from django.urls import path
from django.views.generic import RedirectView

from reviewapp.api.app import api

urlpatterns = [
    # The review dashboard will live at the root; until then, the admin.
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
]
