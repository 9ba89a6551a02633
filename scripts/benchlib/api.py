"""One kept-alive HTTP connection to a vaultfs server, as one user."""

import base64
import json
import urllib.parse
from http.client import HTTPConnection

from .util import die


class Api:
    """One kept-alive HTTP connection to a vaultfs server, as one user (Basic email:token)."""

    def __init__(self, base, user, token):
        u = urllib.parse.urlsplit(base)
        self.host, self.port, self.conn = u.hostname, u.port, None
        self.headers = {"Accept": "application/json", "Authorization": "Basic " +
                        base64.b64encode(("%s:%s" % (user, token)).encode()).decode()}

    def connect(self):
        if self.conn is not None:
            self.conn.close()
        self.conn = HTTPConnection(self.host, self.port, timeout=120)

    def call(self, method, path, body=None, ctype=None, headers=None):
        h = dict(self.headers, **(headers or {}))
        if ctype:
            h["Content-Type"] = ctype
        self.conn.request(method, path, body=body, headers=h)
        r = self.conn.getresponse()
        return r, r.read()

    def json(self, method, path, body=None, data=None, ctype="application/json"):
        r, out = self.call(method, path, json.dumps(body).encode() if body is not None else data,
                           ctype if (body is not None or data is not None) else None)
        if r.status != 200 or b'"success":true' not in out.replace(b" ", b""):
            die("%s %s: HTTP %d %s" % (method, path, r.status, out[:500]))
        return json.loads(out).get("message") or {}

    def search(self, words, limit=50):  # 50: the route's default (search.SEARCH_LIMIT)
        return self.json("GET", "/search?" + urllib.parse.urlencode(
            {"q": " ".join(words), "limit": limit}))
