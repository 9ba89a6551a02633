"""Schemathesis hooks of tests/schema.rs: our own check on top of the built-in ones."""

import json

import schemathesis

# The authorization page is HTML for people: it answers a bad form with the form again (400, 401,
# 429) as a page, as docs/design.md §2 decides. Everything else fails in the JSON envelope.
HTML_PAGES = {"/pin/authorize"}


@schemathesis.check
def error_envelope(ctx, response, case):
    """Every answer outside 2xx is the error envelope: JSON, `error.success` false, an integer
    `error_code` (the public service's documented codes), an `error_name`, an `error_text`, an
    `instance_guid`, `status_code` equal to the HTTP status, and no `message`."""
    status = response.status_code
    if 200 <= status < 300:
        return
    ctype = (response.headers.get("content-type") or [""])[0]
    if case.operation.path in HTML_PAGES and ctype.startswith("text/html"):
        return
    if not ctype.startswith("application/json"):
        raise AssertionError(f"{status} answered with Content-Type {ctype!r}, not the JSON envelope")
    try:
        body = json.loads(response.content)
    except ValueError as e:
        raise AssertionError(f"{status} answered with a body that is not JSON: {e}") from None
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        raise AssertionError(f"{status} answered without an `error` object: {body!r}")
    if err.get("success") is not False:
        raise AssertionError(f"{status} answered with error.success = {err.get('success')!r}")
    code = err.get("error_code")
    if not isinstance(code, int) or isinstance(code, bool) or code >= 0:
        raise AssertionError(f"{status} answered without a negative integer `error.error_code`: {body!r}")
    for field in ("error_name", "error_text", "instance_guid"):
        if not isinstance(err.get(field), str) or not err[field]:
            raise AssertionError(f"{status} answered without `error.{field}`: {body!r}")
    if err.get("status_code") != status:
        raise AssertionError(f"{status} answered with error.status_code = {err.get('status_code')!r}")
    if "message" in body:
        raise AssertionError(f"{status} answered with a `message`: {body!r}")


@schemathesis.hook
def map_query(ctx, query):
    """`GET /changes` with a valid `wait` holds its answer that long (a long poll, up to 55 s):
    made 0 here, so the run stays within its time. Invalid values are left to be refused."""
    operation = getattr(ctx, "operation", None)
    if getattr(operation, "path", None) != "/changes" or not isinstance(query, dict):
        return query
    wait = query.get("wait")
    if isinstance(wait, str) and wait.isdigit():
        wait = int(wait)
    if isinstance(wait, int) and not isinstance(wait, bool) and 0 < wait <= 55:
        query["wait"] = 0
    return query
