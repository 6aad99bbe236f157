"""dashboard: the server's read-only web pages, on its HTTP port beside /metrics.

- Who sees what is the API's rule (access): with tokens (a TLS server), `/login` takes a token
  and sets a session cookie; every job is listed for everyone, a job's command lines and log
  for its owner and admins. An insecure server's every visitor is its local admin, as every
  caller of its API is.
- A session is a random id kept in memory (HttpOnly, SameSite=Strict), pointing at the token
  it was opened with; the token is checked again on every request, so that a revoked token
  ends its sessions. At most MAX_SESSIONS are kept (the oldest goes) for SESSION_S each, and
  MAX_SESSIONS_PER_TOKEN of one token (its oldest goes).
- Pages are rendered on the server (Jinja2, every value escaped) from the controller's view;
  the job page's event timeline is read from the store, as `arranger events` does. Two pages
  have a script (a file of static/, none inline): the job page's log tail polls
  `/api/jobs/{id}/log` and appends text nodes; an experiment's page draws its members'
  reported values (SVG) from `/api/experiments/{id}/reports` (dashboard_experiments).
- An experiment's members and their stages are shown to everyone, its sweep's values and
  its members' reported values to its owner and admins (as the API shows them).
- Responses forbid framing, inline scripts and sniffing (Content-Security-Policy).
- A form is taken from this site's own pages only (`_same_origin`). A client that gave too
  many wrong tokens is refused for a while (login_throttle: 429 and Retry-After); every wrong
  token is logged as a warning with the client's address, every login with its user.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jinja2
import structlog
from aiohttp import web

from arranger.identity import Principal
from arranger.server.access import may_read_private
from arranger.server.agent_link import AgentGone, AgentLink
from arranger.server.config import ServerConfig
from arranger.server.dashboard_experiments import (
    chart_data,
    experiment_page,
    experiment_rows,
    may_read_values,
)
from arranger.server.dashboard_pages import (
    cluster_page,
    job_page,
    job_rows,
    queue_rows,
)
from arranger.server.exec_relay import visible_events
from arranger.server.login_throttle import LoginThrottle
from arranger.server.logtail import newest_logged
from arranger.server.model import ExperimentRecord
from arranger.server.ports import Clock, Closed, Deserved, StoreReads
from arranger.server.reports import ReportBook
from arranger.server.tokens import Tokens
from arranger.server.usage import UsageBook
from arranger.server.view import ClusterView

log = structlog.get_logger("arranger.server")
HERE = Path(__file__).parent
COOKIE = "arranger_session"
MAX_SESSIONS = 10_000
MAX_SESSIONS_PER_TOKEN = 20
SESSION_S = 12 * 3_600.0
MAX_TOKEN_CHARS = 200
LOG_TAIL_BYTES = 16 * 1024  # the log a job page opens with
LOG_CHUNK_BYTES = 256 * 1024  # the most one poll returns
EVENTS_SHOWN = 200
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    # A form's post says its page's Origin (no-referrer would make it "null"); no other site
    # is told anything of these pages' addresses.
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Sessions:
    """Sessions: session id -> (token, expiry), the oldest let go past MAX_SESSIONS (or one
    token's past MAX_SESSIONS_PER_TOKEN)."""

    def __init__(self) -> None:
        self._open: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def open(self, token: str) -> str:
        # One token's oldest sessions go first: logging in again and again ends no other's.
        mine = [s for s, (t, _) in self._open.items() if t == token]
        for old in mine[: max(0, len(mine) + 1 - MAX_SESSIONS_PER_TOKEN)]:
            del self._open[old]
        session = secrets.token_urlsafe(32)
        self._open[session] = (token, time.monotonic() + SESSION_S)
        while len(self._open) > MAX_SESSIONS:
            self._open.popitem(last=False)
        return session

    def token(self, session: str) -> str | None:
        found = self._open.get(session)
        if found is None or found[1] < time.monotonic():
            self._open.pop(session, None)
            return None
        return found[0]

    def close(self, session: str) -> None:
        self._open.pop(session, None)


class Dashboard:
    """Dashboard: the pages' routes on an aiohttp application."""

    def __init__(
        self,
        view: ClusterView,
        tokens: Tokens,
        config: ServerConfig,
        local: Principal,
        reads: StoreReads,
        usage: UsageBook,
        links: Mapping[str, AgentLink],
        deserved: Deserved,
        closed: Closed,
        clock: Clock,
        reports: ReportBook,
    ) -> None:
        self.view, self.tokens, self.config, self.local = view, tokens, config, local
        self.reads, self.usage, self.links, self.deserved = reads, usage, links, deserved
        self.closed, self.clock, self.reports = closed, clock, reports
        self.sessions = Sessions()
        self.throttle = LoginThrottle(clock)
        self.pages = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        self.pages.filters["when"] = _when
        self.pages.filters["gib"] = lambda b: f"{b / 2**30:.1f}"
        self.pages.filters["mib"] = lambda b: f"{b / 2**20:.0f}"

    def add_routes(self, app: web.Application) -> None:
        app.middlewares.append(_headers)
        app.router.add_get("/", self._page(self.cluster))
        app.router.add_get("/jobs", self._page(self.jobs))
        app.router.add_get("/jobs/{job}", self._page(self.job))
        app.router.add_get("/queues", self._page(self.queues))
        app.router.add_get("/experiments/{experiment}", self._page(self.experiment))
        app.router.add_get("/api/jobs/{job}/log", self._page(self.log))
        app.router.add_get("/api/experiments/{experiment}/reports", self._page(self.values))
        app.router.add_get("/login", self.login_page)
        app.router.add_post("/login", self.login)
        app.router.add_post("/logout", self.logout)
        app.router.add_static("/static", HERE / "static", show_index=False)

    @property
    def secure(self) -> bool:
        return self.config.needs_tokens

    async def principal(self, request: web.Request) -> Principal | None:
        """principal: who asks: the local admin of an insecure server, else the owner of the
        session's token while that token is valid."""
        if not self.secure:
            return self.local
        token = self.sessions.token(request.cookies.get(COOKIE, ""))
        return None if token is None else await self.tokens.identify(token)

    def _page(
        self, render: Callable[[web.Request, Principal], Awaitable[web.StreamResponse]]
    ) -> Handler:
        async def handle(request: web.Request) -> web.StreamResponse:
            caller = await self.principal(request)
            if caller is None:
                if request.path.startswith("/api/"):
                    raise web.HTTPUnauthorized(text="log in first")
                raise web.HTTPSeeOther("/login")
            closed = self.closed()
            if closed:  # a standby, or a server still loading
                return self.html("standby.html", caller, status=503, why=closed)
            return await render(request, caller)

        return handle

    def html(
        self, template: str, caller: Principal | None, status: int = 200, **values: Any
    ) -> web.Response:
        text = self.pages.get_template(template).render(
            caller=caller, secure=self.secure, now=self.clock(), **values
        )
        return web.Response(text=text, content_type="text/html", status=status)

    # Pages.

    async def cluster(self, request: web.Request, caller: Principal) -> web.StreamResponse:
        return self.html("cluster.html", caller, page=cluster_page(self.view))

    async def jobs(self, request: web.Request, caller: Principal) -> web.StreamResponse:
        stage = request.query.get("stage", "")[:20]
        mine, unfold = request.query.get("mine") == "1", request.query.get("members") == "1"
        owner = caller.user if mine else ""
        rows = job_rows(self.view, stage, owner, fold=not unfold)
        exps = experiment_rows(self.view, stage, owner)
        shown = {"stage": stage, "mine": mine, "members": unfold}  # the page's filters
        return self.html("jobs.html", caller, rows=rows, experiments=exps, shown=shown)

    async def job(self, request: web.Request, caller: Principal) -> web.StreamResponse:
        job = self.view.find(request.match_info["job"][:100])
        if job is None:
            raise web.HTTPNotFound(text="no such job")
        await self.reads.written()
        private = may_read_private(caller, job)
        events = await self.reads.store.events(job.id, EVENTS_SHOWN)
        events = visible_events(events, lambda _: private)
        page = job_page(job, caller, self.usage)
        return self.html("job.html", caller, page=page, events=events)

    async def queues(self, request: web.Request, caller: Principal) -> web.StreamResponse:
        rows = queue_rows(self.view, self.deserved())
        return self.html("queues.html", caller, rows=rows)

    async def experiment(self, request: web.Request, caller: Principal) -> web.StreamResponse:
        exp = self._experiment(request)
        jobs = self.view.members(exp)
        page = experiment_page(exp, jobs, caller, self.reports, self.clock())
        return self.html("experiment.html", caller, page=page)

    async def values(self, request: web.Request, caller: Principal) -> web.StreamResponse:
        """values: the experiment's reported values, as its charts draw them (chart_data);
        its owner's and admins' only."""
        exp = self._experiment(request)
        if not may_read_values(caller, exp):
            raise web.HTTPForbidden(text=f"the values of {exp.name} are its owner's ({exp.owner})")
        return web.json_response(chart_data(exp, self.view.members(exp), self.reports))

    def _experiment(self, request: web.Request) -> ExperimentRecord:
        """_experiment: the experiment the path names, by id or name (404 if none)."""
        exp = self.view.experiment(request.match_info["experiment"][:100])
        if exp is None:
            raise web.HTTPNotFound(text="no such experiment")
        return exp

    async def log(self, request: web.Request, caller: Principal) -> web.StreamResponse:
        """log: the next piece of a pod's log from `offset` (negative: that many bytes from
        its end), as JSON {text, offset, ended}; the owner's and admins' only."""
        job = self.view.find(request.match_info["job"][:100])
        if job is None:
            raise web.HTTPNotFound(text="no such job")
        if not may_read_private(caller, job):
            raise web.HTTPForbidden(text=f"the log of {job.name} is its owner's ({job.owner})")
        pod = job.pods.get(request.query.get("pod", "")) or job.leader
        try:
            offset = int(request.query.get("offset", str(-LOG_TAIL_BYTES)))
        except ValueError:
            raise web.HTTPBadRequest(text="offset: must be an integer") from None
        if not -(2**63) <= offset < 2**63:  # the agent's request carries an int64
            raise web.HTTPBadRequest(text="offset: out of range")
        asked = request.query.get("attempt", "")
        if asked and not (len(asked) < 10 and asked.isascii() and asked.isdigit()):
            raise web.HTTPBadRequest(text="attempt: must be a whole number")
        if asked and int(asked) > pod.attempt:
            raise web.HTTPBadRequest(text=f"attempt: pod {pod.name} has attempts 0..{pod.attempt}")
        link = self.links.get(pod.node) if pod.node else None
        if link is None:
            return web.json_response(
                {
                    "text": "",
                    "offset": offset,
                    "ended": False,
                    "note": f"{pod.name}: its node is not connected",
                }
            )
        try:
            # Without an attempt asked for: the newest that has a log (see newest_logged).
            attempt = int(asked) if asked else await newest_logged(link, pod.uid, pod.attempt)
            chunk = await link.read_log(pod.uid, attempt, offset, LOG_CHUNK_BYTES, 0.0)
        except AgentGone as exc:
            return web.json_response(
                {"text": "", "offset": offset, "ended": False, "note": str(exc)}
            )
        return web.json_response(
            {
                "text": chunk.data.decode(errors="replace"),
                "offset": chunk.next_offset,
                "ended": chunk.ended,
                "note": chunk.error,
                "attempt": attempt,
                "latest": pod.attempt,
            }
        )

    # Logging in and out.

    async def login_page(self, request: web.Request) -> web.StreamResponse:
        if not self.secure:
            raise web.HTTPSeeOther("/")
        token = request.query.get("token", "")
        if token and self.config.agent_secret:  # the URL arranger dev printed
            _same_origin(request)  # opened by its owner, not by another site's link
            return await self.login_with(request, token[: MAX_TOKEN_CHARS + 1])
        return self.html("login.html", None, error="")

    async def login(self, request: web.Request) -> web.StreamResponse:
        _same_origin(request)
        form = await request.post()
        token = str(form.get("token", "")).strip()[: MAX_TOKEN_CHARS + 1]
        return await self.login_with(request, token)

    async def login_with(self, request: web.Request, token: str) -> web.StreamResponse:
        """login_with opens a session for a valid token and goes to the cluster's page. A
        client out of tries (login_throttle) is refused before its store is asked of the
        token (one the server knows already still logs in); each
        wrong token is logged with the client's address (never the token), each login with
        its user."""
        address = request.remote or ""
        wait_s = self.throttle.wait_s(address)
        # A token the server knows without its store (a dev owner's, one in use lately) is let
        # in all the same: whoever shares the address (every local account, a proxy's users)
        # cannot lock its holder out by guessing.
        if wait_s and self.tokens.cached(token) is None:
            page = self.html(
                "login.html",
                None,
                status=429,
                error=f"too many wrong tokens: try again in {wait_s} s",
            )
            page.headers["Retry-After"] = str(wait_s)
            return page
        who = None
        if self.secure and len(token) <= MAX_TOKEN_CHARS:
            who = await self.tokens.identify(token)
        if who is None:
            self.throttle.failed(address)
            log.warning(
                "dashboard login refused: wrong token",
                address=address,
                throttled_s=self.throttle.wait_s(address),
            )
            return self.html(
                "login.html", None, status=401, error="that token is not known (or was revoked)"
            )
        log.info("dashboard login", user=who.user, address=address)
        response = web.HTTPSeeOther("/")
        response.set_cookie(
            COOKIE,
            self.sessions.open(token),
            httponly=True,
            samesite="Strict",
            max_age=int(SESSION_S),
            path="/",
        )
        raise response

    async def logout(self, request: web.Request) -> web.StreamResponse:
        _same_origin(request)
        self.sessions.close(request.cookies.get(COOKIE, ""))
        response = web.HTTPSeeOther("/login" if self.secure else "/")
        response.del_cookie(COOKIE, path="/")
        raise response


def _same_origin(request: web.Request) -> None:
    """_same_origin refuses a form posted from another site's page: one whose browser's
    Sec-Fetch-Site names another site, or whose Origin is another site's or "null" (a
    sandboxed frame of any site, a browser that sends no Sec-Fetch-Site; our own pages'
    Referrer-Policy lets their forms say their Origin). A post without Origin is no
    browser's form (a script's, curl's): it is let through."""
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None and site not in ("same-origin", "none"):
        raise web.HTTPForbidden(text="a form from another site")
    origin = request.headers.get("Origin")
    if origin is not None and origin.split("://", 1)[-1] != request.host:
        raise web.HTTPForbidden(text="a form from another site")


@web.middleware
async def _headers(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        exc.headers.update(HEADERS)
        raise
    response.headers.update(HEADERS)
    return response


def _when(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S")
