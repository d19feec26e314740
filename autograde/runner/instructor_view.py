"""Student content in the instructor's browser: sanitised HTML and a strict script policy.

The formgrader shows a submission as one HTML page at the instructor's origin (nbconvert's
``formgrade`` template): a student's outputs and markdown land in a page that can read the
instructor's ``_xsrf`` cookie and call the instructor's contents API.  Two layers keep them
inert; the course hub (scripts/hub/hub.py) turns both on for the instructor's server:

- **filters** of the formgrader's ``HTMLExporter`` (``nbgrader_config.py``:
  ``c.HTMLExporter.sanitize_html = True`` and ``c.HTMLExporter.filters``): ``clean_html``
  keeps an allowlist of tags and attributes (no ``<script>``, no ``on*`` attribute, no
  ``style``, no ``id``, links only to http(s)/mailto or within the page, images only from
  ``data:image/...`` URLs so that nothing is fetched; SVG and MathML elements are dropped,
  their text kept); ``markdown2html`` renders markdown as nbconvert does and then cleans
  it (nbgrader's formgrade template renders markdown cells without ``clean_html``);
- **a Content-Security-Policy** on every page of the instructor's server
  (``load_jupyter_server_extension``): scripts only from the server itself or inline
  scripts in the page's ``<head>`` that the server marked with a per-response nonce (the
  templates' own: student content is rendered in the ``<body>``), no inline event
  handler except the formgrader's three (by hash), no ``javascript:`` URL, no request to
  another origin (``default-src 'self'``), no plugins, no ``<base>``, no form to another
  origin.  Raw files and nbconvert exports keep jupyter_server's ``sandbox`` and get
  ``script-src 'none'`` besides.
"""
from __future__ import annotations

import base64
import hashlib
import re
import secrets

import bleach
from jinja2 import pass_context
from tornado.web import OutputTransform

__all__ = ["clean_html", "markdown2html", "csp_for", "load_jupyter_server_extension"]

TAGS = frozenset({
    "a", "abbr", "b", "blockquote", "br", "caption", "code", "col", "colgroup", "dd", "del",
    "details", "dfn", "div", "dl", "dt", "em", "figcaption", "figure", "h1", "h2", "h3", "h4",
    "h5", "h6", "hr", "i", "img", "ins", "kbd", "li", "mark", "ol", "p", "pre", "q", "s",
    "samp", "small", "span", "strong", "sub", "summary", "sup", "table", "tbody", "td",
    "tfoot", "th", "thead", "tr", "u", "ul", "var"})
COMMON_ATTRIBUTES = ("class", "title", "lang", "dir")
SAFE_IMAGE = re.compile(r"^data:image/(png|jpeg|gif|webp|svg\+xml);base64,[A-Za-z0-9+/=\s]*$",
                        re.I)
SAFE_LINK = re.compile(r"^(https?://|mailto:|#)", re.I)


def _attribute_allowed(tag: str, name: str, value: str) -> bool:
    if name in COMMON_ATTRIBUTES:
        return True
    if tag == "a":
        return name == "href" and bool(SAFE_LINK.match(value.strip()))
    if tag == "img":
        if name == "src":
            return bool(SAFE_IMAGE.match(value.strip()))
        return name in ("alt", "width", "height")
    if tag in ("td", "th"):
        return name in ("colspan", "rowspan", "align")
    if tag in ("ol", "li"):
        return name in ("start", "value", "type")
    return False


_CLEANER = bleach.Cleaner(tags=TAGS, attributes=_attribute_allowed,
                          protocols={"http", "https", "mailto", "data"}, strip=True,
                          strip_comments=True)
# elements whose text is code or styling, not prose: dropped with their content
_DROP_WITH_CONTENT = re.compile(
    r"<(script|style|template|noscript|iframe|object|embed|svg|math)\b.*?</\1\s*>",
    re.I | re.S)


def clean_html(element) -> str:
    """HTML reduced to the allowlist above (jinja filter; bytes or str in, str out)."""
    text = element.decode() if isinstance(element, bytes) else str(element)
    return _CLEANER.clean(_DROP_WITH_CONTENT.sub("", text))


@pass_context
def markdown2html(context, source) -> str:
    """nbconvert's markdown rendering (maths kept for MathJax, attachments inlined), then
    ``clean_html``."""
    from ..compat.nbconvert_compat import render_markdown

    cell = context.get("cell", {}) or {}
    return clean_html(render_markdown(source, cell.get("attachments", {}),
                                      context.get("resources", {}).get("metadata", {})
                                      .get("path", "")))


# ---------------------------------------------------------------------------- the policy
# the formgrader's own inline handlers (formgrade_macros.html.j2: the name toggles;
# gradebook_notebook_submissions.tpl: "Show All Names"), allowed by their exact text
FORMGRADER_HANDLERS = ("toggle_name(true);", "toggle_name(false);", "toggleAllNames()")


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def csp_for(nonce: str | None) -> str:
    """The policy of a page; ``nonce`` None: a page whose scripts may not run at all."""
    if nonce is None:
        scripts = "script-src 'none'"
    else:
        # 'unsafe-eval': JupyterLab's settings validation and the formgrader's underscore
        # templates compile functions; no markup can reach eval without a script first
        scripts = ("script-src 'self' 'unsafe-eval' 'unsafe-hashes' "
                   + " ".join(_sha256(h) for h in FORMGRADER_HANDLERS)
                   + f" 'nonce-{nonce}'")
    return "; ".join([
        "default-src 'self'", scripts, "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data: blob:", "font-src 'self' data:", "connect-src 'self'",
        "media-src 'self' data: blob:", "worker-src 'self' blob:", "frame-src 'self'",
        "object-src 'none'", "base-uri 'self'", "form-action 'self'",
        "frame-ancestors 'self'"])


# pages that serve stored content as it is (a student's .html through /files/, an
# nbconvert export): no script of theirs runs, whatever it is
RAW_PATHS = ("files/", "nbconvert/", "view/")
_HEAD_SCRIPT = re.compile(rb"<script(?=[\s>])", re.I)


class ScriptPolicy(OutputTransform):
    """Adds the policy to every response of the server (a second Content-Security-Policy
    header: browsers enforce both, so jupyter_server's own, with its ``sandbox`` for raw
    files, still holds), and a fresh nonce to the inline scripts of an HTML page's
    ``<head>``."""

    base_url = "/"

    def __init__(self, request):
        self.path = request.path
        self.html = False

    def transform_first_chunk(self, status_code, headers, chunk, finishing):
        content_type = headers.get("Content-Type", "")
        relative = self.path[len(self.base_url):] if self.path.startswith(self.base_url) \
            else self.path.lstrip("/")
        raw = relative.startswith(RAW_PATHS)
        nonce = None if raw else secrets.token_urlsafe(18)
        if content_type.startswith("text/html") and nonce:
            self.html = True
            head, sep, body = chunk.partition(b"</head>")
            if sep:          # scripts before </head> are the template's
                chunk = _HEAD_SCRIPT.sub(b'<script nonce="' + nonce.encode() + b'"',
                                         head) + sep + body
                if "Content-Length" in headers:
                    headers["Content-Length"] = str(len(chunk))
        headers.add("Content-Security-Policy", csp_for(nonce))
        return status_code, headers, chunk

    def transform_chunk(self, chunk, finishing):
        return chunk


def _jupyter_server_extension_points():
    return [{"module": "autograde.runner.instructor_view"}]


def load_jupyter_server_extension(serverapp):
    """Enable the policy on a Jupyter server (``jpserver_extensions``)."""
    ScriptPolicy.base_url = serverapp.web_app.settings.get("base_url", "/")
    serverapp.web_app.transforms.insert(0, ScriptPolicy)
    serverapp.log.info("instructor view: Content-Security-Policy on every page")


_load_jupyter_server_extension = load_jupyter_server_extension
