"""/api/v1/docs works under the app's CSP: Swagger UI's assets come from this server, no CDN."""

from html.parser import HTMLParser

from django.test import Client


class AssetUrls(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.inline_scripts = 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "script" and attrs.get("src"):
            self.urls.append(attrs["src"])
        elif tag == "script" and attrs.get("type") != "application/json":
            self.inline_scripts += 1  # code the CSP (script-src 'self') would block
        elif tag == "link" and attrs.get("href"):  # the stylesheet and the icons
            self.urls.append(attrs["href"])


def docs_page():
    response = Client().get("/api/v1/docs")
    assert response.status_code == 200
    parser = AssetUrls()
    parser.feed(response.content.decode())
    return response, parser


def test_the_docs_page_loads_its_scripts_and_styles_from_this_server(db):
    _, page = docs_page()
    assert any(url.endswith(".js") for url in page.urls)
    assert any(url.endswith(".css") for url in page.urls)
    for url in page.urls:
        assert url.startswith("/") and not url.startswith("//"), url  # same origin
        assert Client().get(url).status_code == 200, url


def test_the_docs_page_has_no_inline_script_and_keeps_the_csp(db):
    response, page = docs_page()
    assert page.inline_scripts == 0
    csp = response["Content-Security-Policy"]
    assert "script-src 'self'" in csp
    assert "style-src 'self'" in csp
