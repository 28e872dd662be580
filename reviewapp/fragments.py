"""A page owns its htmx fragments as inline partials (STYLE: partial name = DOM id = hx-target):
an htmx request gets the fragment, any other request the whole page, from one call."""

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


def render_page(
    request: HttpRequest, page: str, context: dict, *, fragment: str = "", status: int = 200
) -> HttpResponse:
    """`page`, or for an htmx request its partial `fragment` only (when one is named)."""
    template = f"{page}#{fragment}" if fragment and request.htmx else page
    return render(request, template, context, status=status)
