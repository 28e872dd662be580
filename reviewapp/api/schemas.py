"""The error shape every API route shares (each wing's routes keep their own request and
response shapes beside them; they are also the OpenAPI document)."""

from ninja import Schema


class ErrorOut(Schema):
    error: str
    detail: str


# The errors any route may answer, for the OpenAPI document.
ERRORS = {
    400: ErrorOut,
    401: ErrorOut,
    403: ErrorOut,
    404: ErrorOut,
    413: ErrorOut,
    422: ErrorOut,
}
